package imagestore

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// maxArchiveIndex caps the JSON files (index.json, manifest.json) of an
// archive read into memory.
const maxArchiveIndex = 16 << 20

// Import stores the images of archive file: a `docker save` tarball (its
// manifest.json names them by their repo tags) or an OCI image layout as a
// tar (named by the org.opencontainers.image.ref.name annotation). A
// non-empty as names the archive's single image instead.
func (s *Store) Import(ctx context.Context, file, as string, progress func(Progress)) ([]*Image, error) {
	kind, err := archiveKind(file)
	if err != nil {
		return nil, err
	}
	type named struct {
		img  v1.Image
		name string
	}
	var imgs []named
	switch kind {
	case "docker":
		opener := func() (io.ReadCloser, error) { return os.Open(file) }
		mf, err := tarball.LoadManifest(opener)
		if err != nil {
			return nil, fmt.Errorf("import %s: docker manifest.json: %w", file, err)
		}
		for i, d := range mf {
			var tag *name.Tag
			if len(d.RepoTags) > 0 {
				t, err := name.NewTag(d.RepoTags[0])
				if err != nil {
					return nil, fmt.Errorf("import %s: tag %q: %w", file, d.RepoTags[0], err)
				}
				tag = &t
			} else if len(mf) > 1 {
				return nil, fmt.Errorf("import %s: image %d has no tag; a docker archive of several images needs tags", file, i)
			}
			img, err := tarball.Image(opener, tag)
			if err != nil {
				return nil, fmt.Errorf("import %s: %w", file, err)
			}
			n := ""
			if tag != nil {
				n = tag.Name()
			}
			imgs = append(imgs, named{img, n})
		}
	case "oci":
		lease, err := s.TempDir("import-")
		if err != nil {
			return nil, err
		}
		defer lease.Close()
		tmp := lease.Path
		if err := unpackOCIArchive(file, tmp, s.lim.MaxBytes); err != nil {
			return nil, fmt.Errorf("import %s: %w", file, err)
		}
		lp, err := layout.FromPath(tmp)
		if err != nil {
			return nil, fmt.Errorf("import %s: %w", file, err)
		}
		ii, err := lp.ImageIndex()
		if err != nil {
			return nil, fmt.Errorf("import %s: %w", file, err)
		}
		im, err := ii.IndexManifest()
		if err != nil {
			return nil, fmt.Errorf("import %s: %w", file, err)
		}
		for _, d := range im.Manifests {
			img, err := pickImage(ii, d)
			if err != nil {
				return nil, fmt.Errorf("import %s: %w", file, err)
			}
			n := d.Annotations["io.containerd.image.name"]
			if n == "" {
				n = d.Annotations[RefAnnotation]
			}
			if n != "" {
				r, err := name.ParseReference(n)
				if err != nil {
					n = "" // a bare tag such as "latest" names nothing
				} else {
					n = r.Name()
				}
			}
			imgs = append(imgs, named{img, n})
		}
	}
	if len(imgs) == 0 {
		return nil, fmt.Errorf("import %s: the archive holds no image", file)
	}
	if as != "" {
		if len(imgs) != 1 {
			return nil, fmt.Errorf("import %s: a name was given but the archive holds %d images", file, len(imgs))
		}
		r, err := name.ParseReference(as)
		if err != nil {
			return nil, fmt.Errorf("image name %q: %w", as, err)
		}
		imgs[0].name = r.Name()
	}
	var out []*Image
	for _, n := range imgs {
		img, err := s.add(ctx, n.img, n.name, progress)
		if err != nil {
			return nil, fmt.Errorf("import %s: %w", file, err)
		}
		out = append(out, img)
	}
	return out, nil
}

// pickImage returns the image of descriptor d of an OCI index: an image
// manifest, or this platform's image of a nested index.
func pickImage(ii v1.ImageIndex, d v1.Descriptor) (v1.Image, error) {
	if d.MediaType.IsImage() {
		return ii.Image(d.Digest)
	}
	if !d.MediaType.IsIndex() {
		return nil, fmt.Errorf("descriptor %s: unsupported media type %s", d.Digest, d.MediaType)
	}
	child, err := ii.ImageIndex(d.Digest)
	if err != nil {
		return nil, err
	}
	cm, err := child.IndexManifest()
	if err != nil {
		return nil, err
	}
	want := (&PullOptions{})
	plat, _ := want.platform()
	for _, c := range cm.Manifests {
		if c.MediaType.IsImage() && (c.Platform == nil || c.Platform.Satisfies(*plat)) {
			return child.Image(c.Digest)
		}
	}
	return nil, fmt.Errorf("index %s has no image for %s/%s", d.Digest, plat.OS, plat.Architecture)
}

// archiveKind tells a docker save tarball ("docker") from an OCI layout
// tar ("oci"). Docker 25+ writes both; its manifest.json names the images.
func archiveKind(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("import: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	oci := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("import %s: not a tar archive: %w", file, err)
		}
		switch filepath.Clean(h.Name) {
		case "manifest.json":
			return "docker", nil
		case "oci-layout":
			oci = true
		}
	}
	if oci {
		return "oci", nil
	}
	return "", fmt.Errorf("import %s: neither a docker save archive (manifest.json) nor an OCI layout (oci-layout)", file)
}

// Compiled on first use: counted repetitions cost every process that links
// this package (the CLI's `airlock run` too) at init.
var ociBlobName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^blobs/sha256/[0-9a-f]{64}$`) })

// unpackOCIArchive copies the few files an OCI layout consists of from the
// tar into dir, under names it makes itself: nothing in the archive chooses
// a path.
func unpackOCIArchive(file, dir string, maxBytes int64) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o700); err != nil {
		return err
	}
	tr := tar.NewReader(f)
	var total int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		n := filepath.ToSlash(filepath.Clean(h.Name))
		var dst string
		limit := int64(maxArchiveIndex)
		switch {
		case n == "index.json" || n == "oci-layout":
			dst = filepath.Join(dir, n)
		case ociBlobName().MatchString(n):
			dst = filepath.Join(dir, "blobs", "sha256", filepath.Base(n))
			limit = maxBytes
		default:
			continue
		}
		if total += h.Size; h.Size > limit || total > maxBytes {
			return &LimitError{What: "bytes", Limit: maxBytes}
		}
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.CopyN(out, tr, h.Size)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
}
