package manager

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/policy"
)

// ErrNoSnapshot is returned (wrapped) for a snapshot id that does not
// name a snapshot of the caller's (or whose sandbox has ended: snapshots
// go with their sandbox).
var ErrNoSnapshot = errors.New("no such snapshot")

// SnapshotInfo describes a snapshot taken by MemorySnapshot.
type SnapshotInfo struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandbox_id"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
}

// snapshot is a snapshot image and what a fork of it needs.
type snapshot struct {
	SnapshotInfo
	owner  string
	image  string
	policy policy.Policy
	src    *Sandbox
	// baseImage is the digest of the image the snapshotted sandbox's root
	// was made from ("" without an image root): a fork's root is that
	// image with the snapshot's layers above (snaproot.go).
	baseImage string
}

// live reports whether the snapshot's sandbox is still running (its
// images go with it).
func (s *snapshot) live() bool {
	select {
	case <-s.src.ended:
		return false
	default:
		return true
	}
}

// snapshotQuota is Config.SnapshotQuota or its default.
func (m *Manager) snapshotQuota() int64 {
	if m.cfg.SnapshotQuota > 0 {
		return m.cfg.SnapshotQuota
	}
	return 8 << 30
}

// snapshotUse sums the sizes of the live snapshots.
func (m *Manager) snapshotUse() int64 {
	var n int64
	m.snaps.Range(func(k, v any) bool {
		if s := v.(*snapshot); s.live() {
			n += s.SizeBytes
		} else {
			m.snaps.Delete(k)
		}
		return true
	})
	return n
}

// resolveSnapshot finds req.Snapshot for a create: a fork runs under the
// snapshotted sandbox's runtime with its policy.
func (m *Manager) resolveSnapshot(req *CreateRequest) error {
	v, ok := m.snaps.Load(req.Snapshot)
	if !ok || v.(*snapshot).owner != req.Owner || !v.(*snapshot).live() {
		return fmt.Errorf("%w: %q", ErrNoSnapshot, req.Snapshot)
	}
	req.snap = v.(*snapshot)
	req.Runtime = string(req.snap.policy.Runtime)
	req.Image, req.Volumes, req.Network, req.Secrets = "", nil, policy.Network{}, nil
	return nil
}

// MemorySnapshot saves a running gvisor sandbox's whole state (processes,
// memory, open files, its tmpfs /workspace and /tmp) without stopping it,
// as an image under its state directory, deleted with it. A create naming
// the snapshot (CreateRequest.Snapshot) starts an independent copy.
// Native sandboxes cannot be snapshotted (ErrPolicy); the images of all
// snapshots together are capped by Config.SnapshotQuota (ErrLimit).
func (m *Manager) MemorySnapshot(ctx context.Context, owner, id string) (SnapshotInfo, error) {
	if m.remote() {
		return SnapshotInfo{}, m.refuseRemoteOp(ctx, owner, id, "memory snapshots", "memory_snapshot")
	}
	sb, err := m.Lookup(owner, id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	var p policy.Policy
	if err := json.Unmarshal(sb.rec.Policy, &p); err != nil {
		return SnapshotInfo{}, fmt.Errorf("manager: policy of %s: %w", id, err)
	}
	base, vols := m.imageOf(id), sb.hasVolumes()
	if t, err := tierOf(p.Runtime); err != nil {
		return SnapshotInfo{}, err
	} else if !t.Caps().MemorySnapshot {
		return SnapshotInfo{}, refuse(t, "memory snapshots and forks (pause freezes it instead)", "memory_snapshot")
	} else if !t.Caps().SnapshotVolumes && vols {
		return SnapshotInfo{}, refuse(t, "a memory snapshot of a sandbox with volumes or host directories (their files are shared and live on outside the snapshot)", "memory_snapshot_volumes")
	} else if !t.Caps().SnapshotEnvironments && base != "" {
		return SnapshotInfo{}, refuse(t, "a memory snapshot of a sandbox with an image root (snapshot its root to an image instead: POST /v1/sandboxes/{id}/snapshot)", "memory_snapshot_environments")
	}
	if used, quota := m.snapshotUse(), m.snapshotQuota(); used >= quota {
		return SnapshotInfo{}, fmt.Errorf("%w: snapshot images use %d bytes of the server's quota of %d (--snapshot-quota); kill sandboxes whose snapshots are not needed", ErrLimit, used, quota)
	}
	if err := m.AuditFirst(ctx, owner, id, "sandbox.memory_snapshot", nil); err != nil {
		return SnapshotInfo{}, err
	}
	b := make([]byte, 8)
	rand.Read(b)
	s := &snapshot{SnapshotInfo: SnapshotInfo{ID: "snap-" + hex.EncodeToString(b), SandboxID: id, CreatedAt: time.Now().UTC()},
		owner: owner, policy: p, src: sb, baseImage: base}
	s.image = filepath.Join(m.dir, id, "snapshots", s.ID)
	if err := m.snapshotImage(sb, s.image); err != nil {
		return SnapshotInfo{}, err
	}
	if base != "" && !hasRootDisk(s.image) {
		if err := m.fileSnapshotRoot(id, s.image); err != nil {
			os.RemoveAll(s.image)
			return SnapshotInfo{}, err
		}
	}
	filepath.WalkDir(s.image, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				s.SizeBytes += fi.Size()
			}
		}
		return nil
	})
	// The manifest, written once the image is whole, is what a restarted
	// server finds the snapshot by (loadSnapshots).
	if err := writeManifest(s); err != nil {
		os.RemoveAll(s.image)
		return SnapshotInfo{}, err
	}
	m.snaps.Store(s.ID, s)
	return s.SnapshotInfo, nil
}

// manifest is a snapshot's record on disk, next to its image
// (snapshots/SNAP.json): a restarted server reloads the snapshots of the
// sandboxes it takes over from them.
type manifest struct {
	SnapshotInfo
	Owner  string        `json:"owner"`
	Policy policy.Policy `json:"policy"`
	// BaseImage is snapshot.baseImage.
	BaseImage string `json:"base_image,omitempty"`
}

// writeManifest records s next to its image, atomically.
func writeManifest(s *snapshot) error {
	data, err := json.Marshal(manifest{SnapshotInfo: s.SnapshotInfo, Owner: s.owner, Policy: s.policy, BaseImage: s.baseImage})
	if err != nil {
		return fmt.Errorf("manager: snapshot manifest: %w", err)
	}
	tmp := s.image + ".json.tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("manager: snapshot manifest: %w", err)
	}
	if err := os.Rename(tmp, s.image+".json"); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("manager: snapshot manifest: %w", err)
	}
	return nil
}

// loadSnapshots reloads the snapshots of sb, a sandbox a restarted server
// took over, from their manifests: they count against the quota again and
// can be forked. An image without a manifest (the server died while
// writing it) or with one that does not belong to sb is removed.
func (m *Manager) loadSnapshots(sb *Sandbox) {
	dir := filepath.Join(m.dir, sb.ID, "snapshots")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	keep := map[string]bool{}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() {
			continue
		}
		var mf manifest
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err == nil {
			err = json.Unmarshal(data, &mf)
		}
		switch {
		case err != nil:
			m.cfg.Logf("sandbox %s: snapshot %s: unreadable manifest: %v; removing it", sb.ID, name, err)
		case mf.ID != name || mf.SandboxID != sb.ID || mf.Owner != sb.rec.Owner:
			m.cfg.Logf("sandbox %s: snapshot %s: manifest names snapshot %q of sandbox %q; removing it", sb.ID, name, mf.ID, mf.SandboxID)
		default:
			if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && fi.IsDir() {
				keep[name] = true
				m.snaps.Store(name, &snapshot{SnapshotInfo: mf.SnapshotInfo, owner: mf.Owner, policy: mf.Policy,
					image: filepath.Join(dir, name), src: sb, baseImage: mf.BaseImage})
				continue
			}
			m.cfg.Logf("sandbox %s: snapshot %s: manifest without an image; removing it", sb.ID, name)
		}
	}
	// What is left (bad manifests, images without one, a manifest's
	// temporary file) goes.
	for _, e := range ents {
		if !keep[strings.TrimSuffix(e.Name(), ".json")] {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// hasVolumes reports whether sb has volumes or host directories mounted,
// from its record (one written before "volumes" was recorded says only
// "env": an image root or volumes; without an image root, volumes).
func (sb *Sandbox) hasVolumes() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	var rs struct {
		Env  bool `json:"env"`
		Vols bool `json:"volumes"`
	}
	if json.Unmarshal(sb.rec.Runtime, &rs) != nil {
		return false
	}
	if rs.Vols {
		return true
	}
	return rs.Env && sb.m.imageOf(sb.ID) == ""
}
