package imagestore

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// Compiled on first use (see ociBlobName).
var leaseName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`) })

// Lease records that holder (a sandbox id) mounts img's layers, so that
// removing the image keeps the unpacked layers until Release, or until the
// path alive (the sandbox's own directory; "" for none) no longer exists:
// a lease outlives no sandbox, even one whose launcher crashed. The caller
// takes the lease before mounting.
func (s *Store) Lease(holder string, img *Image, alive string) error {
	if !leaseName().MatchString(holder) {
		return fmt.Errorf("image lease: bad holder name %q", holder)
	}
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if strings.ContainsAny(alive, "\n\x00") {
		return fmt.Errorf("image lease: bad path %q", alive)
	}
	var b strings.Builder
	if alive != "" {
		b.WriteString("alive " + alive + "\n")
	}
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
	if !leaseName().MatchString(holder) {
		return fmt.Errorf("image lease: bad holder name %q", holder)
	}
	if err := os.Remove(filepath.Join(s.dir, "leases", holder)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("image lease: %w", err)
	}
	return nil
}

// leased returns the layer diff ids (hex) that leases hold, removing
// leases whose holder is gone. Callers hold the lock.
func (s *Store) leased() map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir(filepath.Join(s.dir, "leases"))
	for _, e := range ents {
		p := filepath.Join(s.dir, "leases", e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 0 && strings.HasPrefix(lines[0], "alive ") {
			if _, err := os.Stat(strings.TrimPrefix(lines[0], "alive ")); os.IsNotExist(err) {
				_ = os.Remove(p) // the sandbox is gone
				continue
			}
			lines = lines[1:]
		}
		for _, h := range lines {
			out[strings.TrimSpace(h)] = true
		}
	}
	return out
}
