package imagestore

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	gcrname "github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// v1Image opens a stored image for deriving new ones from it.
func (s *Store) v1Image(img *Image) (v1.Image, error) {
	h, err := v1.NewHash(img.Digest)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", img.Digest, err)
	}
	out, err := layout.Path(filepath.Join(s.dir, "oci")).Image(h)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w (removed meanwhile?)", img.Digest, err)
	}
	return out, nil
}

// normName normalizes an image name ("" stays "": digest only).
func normName(name string) (string, error) {
	if name == "" {
		return "", nil
	}
	r, err := gcrname.ParseReference(name)
	if err != nil {
		return "", fmt.Errorf("%w %q: %w", ErrBadReference, name, err)
	}
	return r.Name(), nil
}

// derive normalizes the name of an image to be derived from base and
// opens base.
func (s *Store) derive(name string, base *Image) (string, v1.Image, error) {
	name, err := normName(name)
	if err != nil {
		return "", nil, err
	}
	b, err := s.v1Image(base)
	return name, b, err
}

// AppendTar makes a new image named name ("" for digest only) of base
// plus the layer in the uncompressed tar file tarFile. The layer is
// unpacked with the same checks as a pulled one.
func (s *Store) AppendTar(ctx context.Context, base *Image, tarFile, name, createdBy string) (*Image, error) {
	name, b, err := s.derive(name, base)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromFile(tarFile)
	if err != nil {
		return nil, err
	}
	now := v1.Time{Time: time.Now().UTC()}
	img, err := mutate.Append(b, mutate.Addendum{Layer: layer, History: v1.History{Created: now, CreatedBy: createdBy}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = now
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, err
	}
	return s.add(ctx, img, name, nil)
}

// Configure makes a new image named name ("" for digest only) of base with
// its config changed by edit (env, working directory, user...), no new
// layer.
func (s *Store) Configure(ctx context.Context, base *Image, name, createdBy string, edit func(*v1.Config)) (*Image, error) {
	name, b, err := s.derive(name, base)
	if err != nil {
		return nil, err
	}
	cf, err := b.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	edit(&cf.Config)
	now := v1.Time{Time: time.Now().UTC()}
	cf.Created = now
	cf.History = append(cf.History, v1.History{Created: now, CreatedBy: createdBy, EmptyLayer: true})
	img, err := mutate.ConfigFile(b, cf)
	if err != nil {
		return nil, err
	}
	return s.add(ctx, img, name, nil)
}

// Tag names img name too.
func (s *Store) Tag(ctx context.Context, img *Image, name string) (*Image, error) {
	name, b, err := s.derive(name, img)
	if err != nil {
		return nil, err
	}
	return s.add(ctx, b, name, nil)
}
