package manager

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/airlock-dev/airlock/imagestore"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// A memory snapshot of a sandbox with an image root carries the root's
// changes with it: the tier copies the sandbox's upper directory, while the
// sandbox is stopped for the checkpoint, into the image
// (tier.SnapshotRootLayer). The manager files that copy as the top of the
// snapshot's layer chain, IMAGE/layers/0..N (lowest first): a snapshot of
// a fork also carries the fork's own lower layers, hard-linked. A fork's
// root is then the original's image (leased again, by digest) with the
// chain hard-linked into its own state directory (ROOT/layers/...) as
// read-only layers above it, and a fresh upper directory of its own: forks
// never share a writable layer, and the original's snapshots can go (with
// the original) while its forks run.

// snapLayersDir is where a snapshot image keeps its root's layer chain.
func snapLayersDir(image string) string { return filepath.Join(image, "layers") }

// rootLayersDir is where a sandbox's image root keeps the layers a fork
// got from its snapshot, above the image's own.
func rootLayersDir(sandboxDir string) string { return filepath.Join(sandboxDir, "root", "layers") }

// imageOf returns the digest of the image sandbox id was created from, ""
// if it has no image root.
func (m *Manager) imageOf(id string) string {
	b, err := os.ReadFile(filepath.Join(m.dir, id, "root", "image"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// layerChain lists the layer directories under dir (0..N), lowest first.
func layerChain(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ents))
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n < 0 || n >= len(ents) || !e.IsDir() || out[n] != "" {
			return nil, fmt.Errorf("layer chain %s: unexpected entry %q", dir, e.Name())
		}
		out[n] = filepath.Join(dir, e.Name())
	}
	return out, nil
}

// linkTree makes dst a copy of the tree src whose files are hard links
// (cp -al: directories are new, with src's owners, modes, times and
// extended attributes; files, whiteouts included, are the same inodes).
// Both are on the state directory's file system. Layers are never written
// once made, so sharing their files is safe.
func linkTree(src, dst string) error {
	if out, err := exec.Command("cp", "-al", "--", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("link layer %s: %v: %s", src, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// hasRootDisk reports whether snapshot image carries its root's changes
// as a disk copy of the tier's (tier.SnapshotRootDisk) rather than layers.
func hasRootDisk(image string) bool {
	_, err := os.Lstat(filepath.Join(image, tier.SnapshotRootDisk))
	return err == nil
}

// fileSnapshotRoot files the root layer the tier wrote in image
// (tier.SnapshotRootLayer) as the top of the snapshot's layer chain, below
// it the layers sandbox id's own root got from a snapshot.
func (m *Manager) fileSnapshotRoot(id, image string) error {
	top := filepath.Join(image, tier.SnapshotRootLayer)
	if _, err := os.Lstat(top); err != nil {
		return fmt.Errorf("manager: snapshot of an image root without its root layer: %w", err)
	}
	below, err := layerChain(rootLayersDir(filepath.Join(m.dir, id)))
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	dir := snapLayersDir(image)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("manager: snapshot layers: %w", err)
	}
	for i, l := range below {
		if err := linkTree(l, filepath.Join(dir, strconv.Itoa(i))); err != nil {
			return fmt.Errorf("manager: %w", err)
		}
	}
	if err := os.Rename(top, filepath.Join(dir, strconv.Itoa(len(below)))); err != nil {
		return fmt.Errorf("manager: snapshot layers: %w", err)
	}
	return nil
}

// snapshotBase returns the image a fork of s starts from (the original's,
// by digest, as the operator: the original was made from it), nil for a
// snapshot of a sandbox without an image root.
func (m *Manager) snapshotBase(s *snapshot) (*imagestore.Image, error) {
	if s.baseImage == "" {
		return nil, nil
	}
	if m.cfg.Images == nil {
		return nil, fmt.Errorf("%w: this server has no image store", ErrInvalid)
	}
	img, err := m.cfg.Images.Get(s.baseImage)
	if err != nil {
		return nil, fmt.Errorf("%w: the image snapshot %s's sandbox was created from is gone: %v", ErrInvalid, s.ID, err)
	}
	return img, nil
}

// forkLayers hard-links the layer chain of snapshot image into the fork's
// image root (sandbox directory dir) and returns the layers, lowest first,
// to put above the image's.
func forkLayers(image, dir string) ([]string, error) {
	chain, err := layerChain(snapLayersDir(image))
	if err != nil || len(chain) == 0 {
		return nil, fmt.Errorf("manager: the snapshot has no root layers: %v", err)
	}
	dst := rootLayersDir(dir)
	if err := os.Mkdir(dst, 0o700); err != nil {
		return nil, fmt.Errorf("manager: fork layers: %w", err)
	}
	var out []string
	for i, l := range chain {
		d := filepath.Join(dst, strconv.Itoa(i))
		if err := linkTree(l, d); err != nil {
			return nil, fmt.Errorf("manager: %w", err)
		}
		out = append(out, d)
	}
	return out, nil
}
