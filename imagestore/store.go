// Package imagestore keeps OCI images on disk for sandbox roots: an OCI
// image layout (content-addressed blobs and an index.json naming the
// images) plus every layer unpacked once, by its uncompressed digest, into a
// directory that any number of images and sandboxes share read-only.
//
// Images come from any OCI or Docker registry (credentials from the usual
// ~/.docker/config.json) or from a `docker save` or OCI archive. Layers are
// hostile input: extraction (extract_linux.go) never follows a path from the
// layer, refuses device nodes and hard links that leave the layer, turns
// whiteouts into overlayfs whiteouts, strips set-id bits and extended
// attributes, and stops at a cap on bytes and files.
package imagestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// RefAnnotation is the index.json annotation that names an image.
const RefAnnotation = "org.opencontainers.image.ref.name"

// Tenancy annotations of index.json entries. Names belong to an owner (an
// API key id; none is the operator: the CLI, an unauthenticated server,
// and every entry made before owners existed): each owner has its own
// namespace of names, and sees its own entries plus the public ones.
// Blobs and unpacked layers stay shared between owners (deduplicated by
// digest); only the entries that name them, and let an owner use them,
// are owned.
const (
	// OwnerAnnotation is the owning key's id; absent for the operator.
	OwnerAnnotation = "dev.airlock.owner"
	// PublicAnnotation "true" makes an entry readable (never writable)
	// by every owner: set by the operator (Publish).
	PublicAnnotation = "dev.airlock.public"
)

// Default caps on one image, all layers together.
const (
	DefaultMaxBytes = 16 << 30
	DefaultMaxFiles = 1 << 20
)

// Limits cap what one image may unpack to, all its layers together: a
// decompression bomb or a sparse file stops at MaxBytes, an inode bomb at
// MaxFiles. Zero fields take the defaults.
type Limits struct {
	MaxBytes int64
	MaxFiles int64
}

// Errors returned (wrapped) by the store.
var (
	// ErrNotFound is an image the store does not hold.
	ErrNotFound = errors.New("image not found")
	// ErrBadReference is a malformed image reference or platform.
	ErrBadReference = errors.New("bad image reference")
	// ErrRegistry is a failure to fetch from the registry (unreachable,
	// unauthorized, no such image or platform there).
	ErrRegistry = errors.New("registry")
	// ErrInvalidImage is an image refused as malformed or hostile: a layer
	// that does not match its digest, escapes its root, holds a device
	// node, or exceeds the caps (LimitError).
	ErrInvalidImage = errors.New("image refused")
)

// LimitError is an image that unpacks to more than the store's Limits.
type LimitError struct {
	What  string // "bytes" or "files"
	Limit int64
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("image exceeds the store's cap of %d %s unpacked (a decompression or inode bomb?)", e.Limit, e.What)
}

// Store is an image store in one directory, seen as one owner (As): the
// store Open returns is the operator's.
type Store struct {
	dir    string
	lim    Limits
	layout layout.Path
	mu     *sync.Mutex // with the flock on dir/lock: one writer at a time
	// owner is whose names this view reads and writes ("" the operator).
	owner string
}

// As returns the view of the store of owner (an API key id; "" is the
// operator). Names are per owner: a view finds its own images and the
// public ones, by name or digest, and its Pull, Import, Commit, Tag,
// AppendTar and Configure name images in its own namespace only, never
// replacing another owner's; Remove and Publish act on its own images
// only. The operator's view also lists, and finds by digest, every
// owner's images (it has the files anyway).
func (s *Store) As(owner string) *Store {
	c := *s
	c.owner = owner
	return &c
}

// Owner is the owner the view acts as ("" the operator).
func (s *Store) Owner() string { return s.owner }

// Image describes one stored image.
type Image struct {
	// Name is the reference it was pulled or imported as
	// ("127.0.0.1:5000/py:3.12"); empty for an image known only by digest.
	Name string `json:"name,omitempty"`
	// Digest is the manifest's digest ("sha256:...").
	Digest string `json:"digest"`
	// Size is the sum of the layers' compressed sizes.
	Size int64 `json:"size"`
	// Created is the image config's creation time.
	Created time.Time `json:"created,omitzero"`
	// Platform is os/architecture.
	Platform string `json:"platform"`
	// Layers are lowest first.
	Layers []Layer `json:"layers"`
	// Config is the part of the image config a sandbox uses.
	Config Config `json:"config"`
	// Owner is the id of the key whose namespace names the image; empty
	// for the operator's images.
	Owner string `json:"owner,omitempty"`
	// Public images are readable by every key (the operator publishes
	// them); only their owner may replace or remove them.
	Public bool `json:"public,omitempty"`
}

// Layer is one layer of an image.
type Layer struct {
	// Digest is the compressed blob's digest; DiffID the uncompressed one.
	Digest string `json:"digest"`
	DiffID string `json:"diff_id"`
	// Size is the compressed size.
	Size int64 `json:"size"`
	// Dir is the unpacked layer (a directory shared by every image that
	// has this layer), for use as an overlayfs lower directory.
	Dir string `json:"-"`
}

// Config is what a sandbox takes from an image's config.
type Config struct {
	Env        []string `json:"env,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
}

// Progress reports a pull or import: bytes of layer blobs fetched so far
// out of Total (blobs already in the store count as done at once).
type Progress struct {
	Layer string // digest of the layer being fetched
	Done  int64
	Total int64
}

// Open opens (creating) the store in dir, normally STATE_DIR/images.
func Open(dir string, lim Limits) (*Store, error) {
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = DefaultMaxBytes
	}
	if lim.MaxFiles <= 0 {
		lim.MaxFiles = DefaultMaxFiles
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{dir, filepath.Join(dir, "oci", "blobs", "sha256"), filepath.Join(dir, "layers"), filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	s := &Store{dir: dir, lim: lim, layout: layout.Path(filepath.Join(dir, "oci")), mu: new(sync.Mutex)}
	if err := s.init(); err != nil {
		return nil, err
	}
	// What a process killed mid pull, import or commit left (docs/images.md).
	if _, err := s.sweep(); err != nil {
		return nil, err
	}
	return s, nil
}

// init writes the layout's oci-layout and empty index.json if missing.
func (s *Store) init() error {
	if _, err := os.Stat(filepath.Join(s.dir, "oci", "oci-layout")); err == nil {
		if _, err := os.Stat(filepath.Join(s.dir, "oci", "index.json")); err == nil {
			return nil
		}
	}
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(s.dir, "oci", "oci-layout")); err != nil {
		if err := writeFileAtomic(filepath.Join(s.dir, "oci", "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(s.dir, "oci", "index.json")); err != nil {
		if err := s.writeIndex(&v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}); err != nil {
			return err
		}
	}
	return nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// lock takes the store's writer lock (in this process and across processes:
// a server and the CLI may share a store).
func (s *Store) lock() (func(), error) {
	s.mu.Lock()
	f, err := os.OpenFile(filepath.Join(s.dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("image store lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		s.mu.Unlock()
		return nil, fmt.Errorf("image store lock: %w", err)
	}
	return func() { f.Close(); s.mu.Unlock() }, nil
}

func (s *Store) readIndex() (*v1.IndexManifest, error) {
	f, err := os.Open(filepath.Join(s.dir, "oci", "index.json"))
	if err != nil {
		return nil, fmt.Errorf("image store index: %w", err)
	}
	defer f.Close()
	return v1.ParseIndexManifest(f)
}

func (s *Store) writeIndex(ix *v1.IndexManifest) error {
	b, err := json.MarshalIndent(ix, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(s.dir, "oci", "index.json"), b)
}

func writeFileAtomic(p string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-"+filepath.Base(p))
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("image store: write %s: %w", p, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("image store: write %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("image store: write %s: %w", p, err)
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("image store: write %s: %w", p, err)
	}
	return nil
}

// blobPath is where blob h lives.
func (s *Store) blobPath(h v1.Hash) string {
	return filepath.Join(s.dir, "oci", "blobs", h.Algorithm, h.Hex)
}

// hashWriter verifies a stream against its digest.
func newHash(h v1.Hash) (hash.Hash, error) {
	if h.Algorithm != "sha256" || len(h.Hex) != 64 {
		return nil, fmt.Errorf("unsupported digest %q (only sha256)", h.String())
	}
	if _, err := hex.DecodeString(h.Hex); err != nil {
		return nil, fmt.Errorf("bad digest %q", h.String())
	}
	return sha256.New(), nil
}

// writeBlob stores the blob h read from rc, verifying its digest, unless it
// is already there. done is called with the bytes read so far.
func (s *Store) writeBlob(h v1.Hash, open func() (io.ReadCloser, error), done func(int64)) error {
	return s.writeBlobTee(h, open, done, nil)
}

// writeBlobTee is writeBlob that also writes the blob's bytes, as they
// arrive and before its digest is checked, to tee (when not nil; then the
// blob is fetched even if stored already).
func (s *Store) writeBlobTee(h v1.Hash, open func() (io.ReadCloser, error), done func(int64), tee io.Writer) error {
	hh, err := newHash(h)
	if err != nil {
		return err
	}
	dst := s.blobPath(h)
	if _, err := os.Stat(dst); err == nil && tee == nil {
		return nil
	}
	rc, err := open()
	if err != nil {
		return fmt.Errorf("%w: fetch %s: %w", ErrRegistry, h, err)
	}
	defer rc.Close()
	tmp, err := s.TempDir("blob-")
	if err != nil {
		return err
	}
	defer tmp.Close()
	f, err := os.Create(filepath.Join(tmp.Path, "blob"))
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	defer f.Close()
	var n int64
	buf := make([]byte, 256<<10)
	for {
		k, rerr := rc.Read(buf)
		if k > 0 {
			if _, err := f.Write(buf[:k]); err != nil {
				return fmt.Errorf("image store: write blob %s: %w", h, err)
			}
			hh.Write(buf[:k])
			if tee != nil {
				if _, err := tee.Write(buf[:k]); err != nil {
					return fmt.Errorf("image store: unpack blob %s: %w", h, err)
				}
			}
			n += int64(k)
			if done != nil {
				done(n)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("%w: fetch %s: %w", ErrRegistry, h, rerr)
		}
	}
	if got := hex.EncodeToString(hh.Sum(nil)); got != h.Hex {
		return &invalidError{fmt.Errorf("blob %s: content has digest sha256:%s", h, got)}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("image store: write blob %s: %w", h, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("image store: write blob %s: %w", h, err)
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), dst)
}

// PullOptions tune Pull.
type PullOptions struct {
	// Platform is os/arch[/variant] to pick from a multi-platform image;
	// empty means linux and this host's architecture.
	Platform string
	// Progress, if set, is called as layer bytes arrive.
	Progress func(Progress)
	// Keychain resolves registry credentials; nil means
	// authn.DefaultKeychain (~/.docker/config.json, $DOCKER_CONFIG).
	Keychain authn.Keychain
}

func (o *PullOptions) platform() (*v1.Platform, error) {
	if o.Platform == "" {
		return &v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}, nil
	}
	p, err := v1.ParsePlatform(o.Platform)
	if err != nil {
		return nil, fmt.Errorf("%w: platform %q: %w", ErrBadReference, o.Platform, err)
	}
	return p, nil
}

// Pull fetches ref from its registry, stores and unpacks it, and names it
// ref (replacing an image of the same name).
func (s *Store) Pull(ctx context.Context, ref string, opt PullOptions) (*Image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrBadReference, ref, err)
	}
	plat, err := opt.platform()
	if err != nil {
		return nil, err
	}
	kc := opt.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(kc), remote.WithPlatform(*plat))
	if err != nil {
		return nil, fmt.Errorf("%w: pull %s: %w", ErrRegistry, r.Name(), err)
	}
	return s.add(ctx, img, r.Name(), opt.Progress)
}

// add stores img (blobs, unpacked layers) and names it name in the index.
func (s *Store) add(ctx context.Context, img v1.Image, refName string, progress func(Progress)) (*Image, error) {
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	digest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("image digest: %w", err)
	}
	rawManifest, err := img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("image manifest: %w", err)
	}
	m, err := v1.ParseManifest(strings.NewReader(string(rawManifest)))
	if err != nil {
		return nil, fmt.Errorf("image manifest: %w", err)
	}
	rawConfig, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	cf, err := v1.ParseConfigFile(strings.NewReader(string(rawConfig)))
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	if len(cf.RootFS.DiffIDs) != len(m.Layers) {
		return nil, fmt.Errorf("image config lists %d layers, manifest %d", len(cf.RootFS.DiffIDs), len(m.Layers))
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("image layers: %w", err)
	}
	var total, base int64
	for _, l := range m.Layers {
		total += l.Size
	}
	// A layer neither stored nor unpacked yet is unpacked while it
	// downloads; the others after the downloads, within the image's caps.
	var bud budget
	bud.maxBytes, bud.maxFiles = s.lim.MaxBytes, s.lim.MaxFiles
	streamed := make([]bool, len(m.Layers))
	// A key's image may reuse a stored blob or unpacked layer only when
	// an image it may read already has it: otherwise it must prove it has
	// the content (fetched and checked against both digests, as if new),
	// or naming another key's private layer by its digest in a manifest
	// of its own would hand it that layer.
	known, err := s.readableBlobs()
	if err != nil {
		return nil, err
	}
	for i, desc := range m.Layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		l := layers[i]
		cb := func(n int64) {
			if progress != nil {
				progress(Progress{Layer: desc.Digest.String(), Done: base + n, Total: total})
			}
		}
		prove := known != nil && !(known[desc.Digest.String()] && known[cf.RootFS.DiffIDs[i].String()])
		if prove || s.canStream(desc, cf.RootFS.DiffIDs[i]) {
			if err := s.fetchUnpack(desc, cf.RootFS.DiffIDs[i], l.Compressed, cb, &bud); err != nil {
				return nil, err
			}
			streamed[i] = true
		} else if err := s.writeBlob(desc.Digest, l.Compressed, cb); err != nil {
			return nil, err
		}
		base += desc.Size
		cb(0)
	}
	// Config and manifest: verified against their digests too (the
	// config in hand, even when a blob of its digest is stored already).
	if h, _, err := v1.SHA256(strings.NewReader(string(rawConfig))); err != nil || h != m.Config.Digest {
		return nil, &invalidError{fmt.Errorf("image config does not match its digest %s", m.Config.Digest)}
	}
	if err := s.writeBlob(m.Config.Digest, func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(string(rawConfig))), nil }, nil); err != nil {
		return nil, err
	}
	if err := s.writeBlob(digest, func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(string(rawManifest))), nil }, nil); err != nil {
		return nil, err
	}
	// Unpack every layer not unpacked yet, within the image's caps.
	for i, desc := range m.Layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if streamed[i] {
			continue
		}
		if err := s.unpackLayer(desc, cf.RootFS.DiffIDs[i], &bud); err != nil {
			return nil, err
		}
	}
	ix, err := s.readIndex()
	if err != nil {
		return nil, err
	}
	// Only this owner's entry of the name (or of the digest, unnamed) is
	// replaced: another owner's same name is another image.
	var keep []v1.Descriptor
	for _, d := range ix.Manifests {
		if s.mine(d) && refName != "" && d.Annotations[RefAnnotation] == refName {
			continue
		}
		if s.mine(d) && refName == "" && d.Digest == digest && d.Annotations[RefAnnotation] == "" {
			continue
		}
		keep = append(keep, d)
	}
	desc := v1.Descriptor{MediaType: m.MediaType, Size: int64(len(rawManifest)), Digest: digest,
		Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}}
	if desc.MediaType == "" {
		desc.MediaType = types.OCIManifestSchema1
	}
	if refName != "" || s.owner != "" {
		desc.Annotations = map[string]string{}
	}
	if refName != "" {
		desc.Annotations[RefAnnotation] = refName
	}
	if s.owner != "" {
		desc.Annotations[OwnerAnnotation] = s.owner
	}
	ix.Manifests = append(keep, desc)
	if err := s.writeIndex(ix); err != nil {
		return nil, err
	}
	if err := s.gc(ix); err != nil {
		return nil, err
	}
	return s.describe(desc)
}

// unpackLayer unpacks blob desc (verified against diffID) into
// layers/<diffID hex>/root unless it is there already.
func (s *Store) unpackLayer(desc v1.Descriptor, diffID v1.Hash, bud *budget) error {
	if _, err := newHash(diffID); err != nil {
		return fmt.Errorf("layer %s: %w", desc.Digest, err)
	}
	dst := filepath.Join(s.dir, "layers", diffID.Hex)
	if b, err := os.ReadFile(filepath.Join(dst, "meta.json")); err == nil {
		var meta layerMeta
		if json.Unmarshal(b, &meta) == nil {
			if err := bud.take(meta.Bytes, meta.Files); err != nil {
				return &invalidError{err}
			}
			return nil
		}
	}
	f, err := os.Open(s.blobPath(desc.Digest))
	if err != nil {
		return fmt.Errorf("layer %s: %w", desc.Digest, err)
	}
	defer f.Close()
	return s.unpackFrom(desc, diffID, f, bud, nil)
}

// errUnpackStopped is what a download streamed into a failed unpack gets.
var errUnpackStopped = errors.New("unpacking stopped")

// errBlobRefused is what an unpack streamed from a failed download ends with.
var errBlobRefused = errors.New("the blob's download failed")

// canStream reports whether layer desc is neither stored nor unpacked, so
// fetchUnpack should fetch and unpack it at once.
func (s *Store) canStream(desc v1.Descriptor, diffID v1.Hash) bool {
	if _, err := os.Stat(s.blobPath(desc.Digest)); err == nil {
		return false
	}
	_, err := os.Stat(filepath.Join(s.dir, "layers", diffID.Hex, "meta.json"))
	return err != nil
}

// fetchUnpack downloads blob desc and unpacks it as its bytes arrive; the
// unpacked layer is installed only once the blob's digest checked out as
// well as its diff id. An unpack error wins over the download error it
// caused.
func (s *Store) fetchUnpack(desc v1.Descriptor, diffID v1.Hash, open func() (io.ReadCloser, error), done func(int64), bud *budget) error {
	if _, err := newHash(diffID); err != nil {
		return fmt.Errorf("layer %s: %w", desc.Digest, err)
	}
	pr, pw := io.Pipe()
	ready := make(chan error, 1)
	unpacked := make(chan error, 1)
	go func() {
		err := s.unpackFrom(desc, diffID, pr, bud, ready)
		pr.CloseWithError(errUnpackStopped)
		unpacked <- err
	}()
	derr := s.writeBlobTee(desc.Digest, open, done, pw)
	if derr != nil {
		pw.CloseWithError(errBlobRefused)
		ready <- derr
	} else {
		pw.Close()
		ready <- nil
	}
	uerr := <-unpacked
	if derr != nil && (uerr == nil || !errors.Is(derr, errUnpackStopped)) {
		return derr
	}
	return uerr
}

// unpackFrom unpacks the layer blob read from src; with ready, it reads
// src to its end and installs the layer only if ready then yields nil.
func (s *Store) unpackFrom(desc v1.Descriptor, diffID v1.Hash, src io.Reader, bud *budget, ready <-chan error) error {
	dst := filepath.Join(s.dir, "layers", diffID.Hex)
	lease, err := s.TempDir("layer-")
	if err != nil {
		return err
	}
	defer lease.Close()
	tmp := lease.Path
	root := filepath.Join(tmp, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	rd, err := decompress(src, bud)
	if err != nil {
		return &invalidError{fmt.Errorf("layer %s: %w", desc.Digest, err)}
	}
	defer rd.Close()
	hh := sha256.New()
	before := *bud
	// Decompression and the diff-id hash run ahead on their own goroutine.
	ra := readAhead(io.TeeReader(rd, hh), 8, 128<<10)
	defer ra.Close()
	if err := extract(ra, root, bud); err != nil {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
			return fmt.Errorf("layer %s: %w", desc.Digest, err)
		}
		return &invalidError{fmt.Errorf("layer %s: %w", desc.Digest, err)}
	}
	// Read the tar's trailing padding so the digest covers the whole stream.
	if _, err := io.Copy(io.Discard, ra); err != nil {
		return fmt.Errorf("layer %s: %w", desc.Digest, err)
	}
	ra.Close() // the goroutine has hashed its last byte
	if got := hex.EncodeToString(hh.Sum(nil)); got != diffID.Hex {
		return &invalidError{fmt.Errorf("layer %s: uncompressed content has digest sha256:%s, the image config says %s", desc.Digest, got, diffID)}
	}
	meta, _ := json.Marshal(layerMeta{Bytes: bud.bytes - before.bytes, Files: bud.files - before.files})
	if err := os.WriteFile(filepath.Join(tmp, "meta.json"), meta, 0o600); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	if ready != nil {
		// Whatever follows the compressed stream, then the blob's verdict.
		if _, err := io.Copy(io.Discard, src); err != nil {
			return fmt.Errorf("layer %s: %w", desc.Digest, err)
		}
		if err := <-ready; err != nil {
			return fmt.Errorf("layer %s: %w", desc.Digest, errBlobRefused)
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		if _, serr := os.Stat(filepath.Join(dst, "meta.json")); serr == nil {
			return nil // unpacked meanwhile
		}
		return fmt.Errorf("image store: install layer: %w", err)
	}
	return nil
}

type layerMeta struct {
	Bytes int64 `json:"bytes"`
	Files int64 `json:"files"`
}

// budget counts what an image unpacks to against the store's Limits.
type budget struct {
	bytes, files       int64
	maxBytes, maxFiles int64
}

// invalidError marks an error as ErrInvalidImage.
type invalidError struct{ err error }

func (e *invalidError) Error() string { return e.err.Error() }
func (e *invalidError) Unwrap() []error {
	return []error{ErrInvalidImage, e.err}
}

func (b *budget) take(bytes, files int64) error {
	b.bytes += bytes
	b.files += files
	if b.bytes > b.maxBytes {
		return &LimitError{What: "bytes", Limit: b.maxBytes}
	}
	if b.files > b.maxFiles {
		return &LimitError{What: "files", Limit: b.maxFiles}
	}
	return nil
}

// mine reports whether index entry d belongs to the view's owner.
func (s *Store) mine(d v1.Descriptor) bool { return d.Annotations[OwnerAnnotation] == s.owner }

// public reports whether index entry d is published to every owner.
func public(d v1.Descriptor) bool { return d.Annotations[PublicAnnotation] == "true" }

// readable reports whether the view may use entry d: its own or public.
func (s *Store) readable(d v1.Descriptor) bool { return s.mine(d) || public(d) }

// readableBlobs returns the layer blob digests and diff ids of the images
// the view may read; nil for the operator's view, which may read all.
func (s *Store) readableBlobs() (map[string]bool, error) {
	if s.owner == "" {
		return nil, nil
	}
	ix, err := s.readIndex()
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, d := range ix.Manifests {
		if !s.readable(d) {
			continue
		}
		img, err := s.describe(d)
		if err != nil {
			continue // unknown, so proven again: fails closed
		}
		for _, l := range img.Layers {
			known[l.Digest], known[l.DiffID] = true, true
		}
	}
	return known, nil
}

// List returns the images the view may use (its own and the public ones;
// the operator's view: every image), by name then digest.
func (s *Store) List() ([]Image, error) {
	ix, err := s.readIndex()
	if err != nil {
		return nil, err
	}
	out := make([]Image, 0, len(ix.Manifests))
	for _, d := range ix.Manifests {
		if s.owner != "" && !s.readable(d) {
			continue
		}
		img, err := s.describe(d)
		if err != nil {
			return nil, err
		}
		out = append(out, *img)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		if out[i].Owner != out[j].Owner {
			return out[i].Owner < out[j].Owner
		}
		return out[i].Digest < out[j].Digest
	})
	return out, nil
}

// Get returns the image named ref (as given to Pull or Import, or in the
// normalized form: "alpine" is "index.docker.io/library/alpine:latest"),
// or with manifest digest ref ("sha256:..." or a unique prefix of 12 or
// more hex digits), among the view's own and the public images: the
// view's own name first, then the operator's public one, then another
// key's public one. Another owner's private image is ErrNotFound, by
// name and by digest alike.
func (s *Store) Get(ref string) (*Image, error) {
	d, err := s.find(ref, false)
	if err != nil {
		return nil, err
	}
	return s.describe(d)
}

// find resolves ref among the view's own images, and unless own, the
// public ones (and, by digest, the operator's view: every image).
func (s *Store) find(ref string, own bool) (v1.Descriptor, error) {
	ix, err := s.readIndex()
	if err != nil {
		return v1.Descriptor{}, err
	}
	norm := ref
	if r, err := name.ParseReference(ref); err == nil {
		norm = r.Name()
	}
	named := func(d v1.Descriptor) bool {
		n := d.Annotations[RefAnnotation]
		return n != "" && (n == ref || n == norm)
	}
	// Own names first; then public ones, the operator's before a key's.
	tiers := []func(v1.Descriptor) bool{s.mine}
	if !own {
		tiers = append(tiers,
			func(d v1.Descriptor) bool { return public(d) && d.Annotations[OwnerAnnotation] == "" },
			public)
	}
	for _, ok := range tiers {
		for _, d := range ix.Manifests {
			if ok(d) && named(d) {
				return d, nil
			}
		}
	}
	hexPart := strings.TrimPrefix(ref, "sha256:")
	if len(hexPart) >= 12 && len(hexPart) <= 64 && isHex(hexPart) {
		var found []v1.Descriptor
		for _, d := range ix.Manifests {
			visible := s.mine(d) || (!own && (public(d) || s.owner == ""))
			if visible && strings.HasPrefix(d.Digest.Hex, hexPart) {
				found = append(found, d)
			}
		}
		if len(found) >= 1 {
			for _, f := range found[1:] {
				if f.Digest != found[0].Digest {
					return v1.Descriptor{}, fmt.Errorf("digest prefix %q names more than one image", ref)
				}
			}
			// The view's own entry of the digest, if it has one.
			for _, f := range found {
				if s.mine(f) {
					return f, nil
				}
			}
			return found[0], nil
		}
	}
	return v1.Descriptor{}, fmt.Errorf("%w: %q", ErrNotFound, ref)
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s + strings.Repeat("0", len(s)%2))
	return err == nil && strings.ToLower(s) == s
}

// describe reads image d from the layout.
func (s *Store) describe(d v1.Descriptor) (*Image, error) {
	raw, err := os.ReadFile(s.blobPath(d.Digest))
	if err != nil {
		return nil, fmt.Errorf("image %s: manifest: %w", d.Digest, err)
	}
	m, err := v1.ParseManifest(strings.NewReader(string(raw)))
	if err != nil {
		return nil, fmt.Errorf("image %s: manifest: %w", d.Digest, err)
	}
	rawCfg, err := os.ReadFile(s.blobPath(m.Config.Digest))
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", d.Digest, err)
	}
	cf, err := v1.ParseConfigFile(strings.NewReader(string(rawCfg)))
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", d.Digest, err)
	}
	img := &Image{Name: d.Annotations[RefAnnotation], Owner: d.Annotations[OwnerAnnotation], Public: public(d),
		Digest: d.Digest.String(), Created: cf.Created.Time,
		Platform: cf.OS + "/" + cf.Architecture,
		Config: Config{Env: cf.Config.Env, Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd,
			WorkingDir: cf.Config.WorkingDir, User: cf.Config.User}}
	for i, l := range m.Layers {
		if i >= len(cf.RootFS.DiffIDs) {
			break
		}
		diff := cf.RootFS.DiffIDs[i]
		img.Size += l.Size
		img.Layers = append(img.Layers, Layer{Digest: l.Digest.String(), DiffID: diff.String(), Size: l.Size,
			Dir: filepath.Join(s.dir, "layers", diff.Hex, "root")})
	}
	return img, nil
}

// Remove deletes the view's own image named (or with digest) ref from
// the index, then the blobs and unpacked layers no other image uses. A
// public image of another owner is ErrNotFound to it: readable, never
// removable.
func (s *Store) Remove(ref string) (*Image, error) {
	var img *Image
	err := s.editEntry(ref, true, func(ix *v1.IndexManifest, i int) error {
		var err error
		if img, err = s.describe(ix.Manifests[i]); err != nil {
			return err
		}
		ix.Manifests = append(ix.Manifests[:i], ix.Manifests[i+1:]...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return img, nil
}

// Publish makes the view's own image ref readable by every owner (public
// true) or by its owner only again (false). Publishing shares the image
// as it is: replacing its name later (a new pull, snapshot or build)
// makes a private image until it is published again.
func (s *Store) Publish(ref string, pub bool) (*Image, error) {
	var img *Image
	err := s.editEntry(ref, false, func(ix *v1.IndexManifest, i int) error {
		d := &ix.Manifests[i]
		a := map[string]string{}
		for k, v := range d.Annotations {
			a[k] = v
		}
		delete(a, PublicAnnotation)
		if pub {
			a[PublicAnnotation] = "true"
		}
		d.Annotations = a
		var err error
		img, err = s.describe(*d)
		return err
	})
	return img, err
}

// editEntry finds the view's own entry ref under the lock, lets edit
// change the index (i is the entry's position), writes it and, with gc,
// removes what no image uses any more.
func (s *Store) editEntry(ref string, gc bool, edit func(ix *v1.IndexManifest, i int) error) error {
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	d, err := s.find(ref, true)
	if err != nil {
		return err
	}
	ix, err := s.readIndex()
	if err != nil {
		return err
	}
	for i, e := range ix.Manifests {
		if e.Digest == d.Digest && e.Annotations[RefAnnotation] == d.Annotations[RefAnnotation] && s.mine(e) {
			if err := edit(ix, i); err != nil {
				return err
			}
			if err := s.writeIndex(ix); err != nil {
				return err
			}
			if gc {
				return s.gc(ix)
			}
			return nil
		}
	}
	return fmt.Errorf("%w: %q", ErrNotFound, ref)
}

// gc removes blobs and unpacked layers that no image in ix uses. Callers
// hold the lock. Unpacked layers mounted by a live sandbox are kept while
// the sandbox holds a lease on them (see Lease).
func (s *Store) gc(ix *v1.IndexManifest) error {
	blobs := map[string]bool{}
	diffs := map[string]bool{}
	for _, d := range ix.Manifests {
		blobs[d.Digest.Hex] = true
		raw, err := os.ReadFile(s.blobPath(d.Digest))
		if err != nil {
			return fmt.Errorf("image store gc: %w", err)
		}
		m, err := v1.ParseManifest(strings.NewReader(string(raw)))
		if err != nil {
			return fmt.Errorf("image store gc: %w", err)
		}
		blobs[m.Config.Digest.Hex] = true
		for _, l := range m.Layers {
			blobs[l.Digest.Hex] = true
		}
		rawCfg, err := os.ReadFile(s.blobPath(m.Config.Digest))
		if err != nil {
			return fmt.Errorf("image store gc: %w", err)
		}
		cf, err := v1.ParseConfigFile(strings.NewReader(string(rawCfg)))
		if err != nil {
			return fmt.Errorf("image store gc: %w", err)
		}
		for _, h := range cf.RootFS.DiffIDs {
			diffs[h.Hex] = true
		}
	}
	for h := range s.leased() {
		diffs[h] = true
	}
	ents, _ := os.ReadDir(filepath.Join(s.dir, "oci", "blobs", "sha256"))
	for _, e := range ents {
		if !blobs[e.Name()] {
			if err := os.Remove(filepath.Join(s.dir, "oci", "blobs", "sha256", e.Name())); err != nil {
				return fmt.Errorf("image store gc: %w", err)
			}
		}
	}
	ents, _ = os.ReadDir(filepath.Join(s.dir, "layers"))
	for _, e := range ents {
		if !diffs[e.Name()] {
			if err := removeAll(filepath.Join(s.dir, "layers", e.Name())); err != nil {
				return fmt.Errorf("image store gc: %w", err)
			}
		}
	}
	return nil
}
