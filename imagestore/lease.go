package imagestore

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

var leaseName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// Lease records that holder (a sandbox id) mounts img's layers, so that
// removing the image keeps the unpacked layers until Release. The caller
// holds the image (Get) and takes the lease before mounting.
func (s *Store) Lease(holder string, img *Image) error {
	if !leaseName.MatchString(holder) {
		return fmt.Errorf("image lease: bad holder name %q", holder)
	}
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	var b strings.Builder
	for _, l := range img.Layers {
		if _, err := os.Stat(l.Dir); err != nil {
			return fmt.Errorf("image %s: layer %s: %w (removed meanwhile?)", img.Digest, l.DiffID, err)
		}
		b.WriteString(strings.TrimPrefix(l.DiffID, "sha256:") + "\n")
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "leases"), 0o700); err != nil {
		return fmt.Errorf("image lease: %w", err)
	}
	return writeFileAtomic(filepath.Join(s.dir, "leases", holder), []byte(b.String()))
}

// Release drops holder's lease (a missing lease is not an error).
func (s *Store) Release(holder string) error {
	if !leaseName.MatchString(holder) {
		return fmt.Errorf("image lease: bad holder name %q", holder)
	}
	if err := os.Remove(filepath.Join(s.dir, "leases", holder)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("image lease: %w", err)
	}
	return nil
}

// leased returns the layer diff ids (hex) that leases hold.
func (s *Store) leased() map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir(filepath.Join(s.dir, "leases"))
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(s.dir, "leases", e.Name()))
		if err != nil {
			continue
		}
		for _, h := range strings.Fields(string(b)) {
			out[h] = true
		}
	}
	return out
}
