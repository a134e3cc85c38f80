package manager

import (
	"fmt"
	"path"
	"strings"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/volume"
)

// VolumeRef puts a named volume (Config.Volumes) in a new sandbox,
// read-write at Path.
type VolumeRef struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// maxVolumes caps the volumes of one sandbox.
const maxVolumes = 16

// Volumes is the server's volume store (nil without one).
func (m *Manager) Volumes() *volume.Store { return m.cfg.Volumes }

// checkVolumes validates req.Volumes before anything is started.
func (m *Manager) checkVolumes(req *CreateRequest) error {
	if len(req.Volumes) == 0 {
		return nil
	}
	if m.cfg.Volumes == nil {
		return fmt.Errorf("%w: this server has no volume store", ErrInvalid)
	}
	if len(req.Volumes) > maxVolumes {
		return fmt.Errorf("%w: at most %d volumes", ErrInvalid, maxVolumes)
	}
	if t, err := tierOf(policy.Runtime(req.Runtime)); err != nil {
		return err
	} else if !t.Caps().Volumes {
		return refuse(t, "volumes", "volumes")
	}
	seen := map[string]bool{}
	for _, v := range req.Volumes {
		p := v.Path
		if !strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "/" || strings.ContainsRune(p, 0) {
			return fmt.Errorf("%w: volume path %q must be a clean absolute path other than /", ErrInvalid, p)
		}
		for _, r := range []string{"/proc", "/dev", "/sys", "/.airlock", "/etc"} {
			if p == r || strings.HasPrefix(p, r+"/") {
				return fmt.Errorf("%w: volume path %q is under %s", ErrInvalid, p, r)
			}
		}
		if seen[p] {
			return fmt.Errorf("%w: two volumes at %s", ErrInvalid, p)
		}
		seen[p] = true
		// The owner's own volumes only: another key's is not found.
		if _, err := m.cfg.Volumes.As(req.Owner).Get(v.Name); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	return nil
}

// useVolumes mounts owner's volumes refs for sandbox id (state directory
// dir, whose removal ends the use).
func (m *Manager) useVolumes(id, dir, owner string, refs []VolumeRef) ([]native.VolumeMount, error) {
	var out []native.VolumeMount
	for _, v := range refs {
		mnt, err := m.cfg.Volumes.As(owner).Use(v.Name, id, dir)
		if err != nil {
			return nil, fmt.Errorf("manager: %w", err)
		}
		out = append(out, native.VolumeMount{Dir: mnt, Target: v.Path})
	}
	return out, nil
}
