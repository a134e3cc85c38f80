package manager

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/airlock-dev/airlock/imagestore"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// Images returns the image store CreateRequest.Image names images of
// (Config.Images); nil when the server has none.
func (m *Manager) Images() *imagestore.Store { return m.cfg.Images }

// resolveImage looks up req.Image in the server's image store and adjusts
// p for it (the image's env and user, or root when req.User asks; the
// request's env stays on top). It returns nil when the request names no
// image.
func (m *Manager) resolveImage(req *CreateRequest, p *policy.Policy) (*imagestore.Image, error) {
	if req.Image == "" {
		if req.User != "" {
			return nil, fmt.Errorf("%w: user %q needs an image root (\"image\"): the default root is the host's read-only /usr", ErrInvalid, req.User)
		}
		return nil, nil
	}
	if req.User != "" && req.User != "root" {
		return nil, fmt.Errorf("%w: user %q: the only user to ask for is \"root\" (uid 0 of the sandbox's own user namespace; default: the image's user)", ErrInvalid, req.User)
	}
	if m.cfg.Images == nil {
		return nil, fmt.Errorf("%w: this server has no image store", ErrInvalid)
	}
	if t, err := tierOf(p.Runtime); err != nil {
		return nil, err
	} else if !t.Caps().ImageRoots {
		return nil, refuse(t, "an image or template root", "image_roots")
	}
	if err := checkStaticAgent(m.agentBinary(p)); err != nil {
		return nil, err
	}
	// Among the owner's own images and the public ones only: another
	// key's image is not found, by name or by digest (imagestore.As).
	img, err := m.cfg.Images.As(req.Owner).Get(req.Image)
	if errors.Is(err, imagestore.ErrNotFound) {
		return nil, fmt.Errorf("%w: image %q is not in the server's image store (pull it first: POST /v1/images)", ErrInvalid, req.Image)
	}
	if err != nil {
		return nil, err
	}
	if err := img.ApplyTo(p); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	if req.User == "root" {
		p.User.UID, p.User.GID, p.User.Name, p.User.Root = 0, 0, "root", true
	}
	keys := make([]string, 0, len(req.Env))
	for k := range req.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p.SetEnv(k, req.Env[k])
	}
	return img, nil
}

// imageRoot leases img's layers for sandbox id and returns its root: the
// upper directory lives in the sandbox's own directory dir (on disk,
// removed with it, which also lapses the lease).
func (m *Manager) imageRoot(id, dir string, img *imagestore.Image) (*native.ImageRoot, error) {
	if img == nil {
		return nil, nil
	}
	if err := m.cfg.Images.Lease(id, img, dir); err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	// The base of later snapshots, by digest (a name may move).
	if err := os.WriteFile(filepath.Join(root, "image"), []byte(img.Digest+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	return &native.ImageRoot{Layers: img.LayerDirs(), Dir: root, Disks: m.diskPool()}, nil
}

// diskPoolSize is how many ready upper disks are kept per disk size.
const diskPoolSize = 2

// diskPool returns the pool of ready upper disks for image roots, opening
// it (StateDir/diskpool) on first use; nil once the manager is closed or if
// it cannot be opened (then every image create makes its own disk, as
// before: slower, not less isolated).
func (m *Manager) diskPool() *native.DiskPool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.disksTried {
		return m.disks
	}
	m.disksTried = true
	d, err := native.OpenDiskPool(filepath.Join(m.cfg.StateDir, "diskpool"), diskPoolSize)
	if err != nil {
		m.cfg.Logf("image roots: no pool of ready disks (each create formats its own): %v", err)
		return nil
	}
	m.disks = d
	return d
}

// closeDisks removes the ready disks (Close).
func (m *Manager) closeDisks() {
	m.mu.Lock()
	d := m.disks
	m.disks = nil
	m.mu.Unlock()
	if d != nil {
		if err := d.Close(); err != nil {
			m.cfg.Logf("image roots: remove the ready disks: %v", err)
		}
	}
}

// removeSandboxDir removes a sandbox's state directory, unmounting the
// upper filesystem of its image root first if it has one.
func removeSandboxDir(dir string) error {
	root := filepath.Join(dir, "root")
	if _, err := os.Lstat(root); err == nil {
		if err := native.RemoveImageRoot(root); err != nil {
			return err
		}
	}
	return os.RemoveAll(dir)
}

// ActionSandboxSnapshot is the audit action of Snapshot.
const ActionSandboxSnapshot = "sandbox.snapshot"

// Snapshot makes a new image of owner, named name in owner's namespace
// ("" names it localhost/airlock/<id>:latest), of the image sandbox id of owner was
// created from plus everything the sandbox has changed in its root so far.
// Files the sandbox writes meanwhile may or may not be in it.
func (m *Manager) Snapshot(ctx context.Context, owner, id, name string) (*imagestore.Image, error) {
	if m.remote() {
		return nil, m.notRemote("image snapshots of a sandbox's root")
	}
	sb, err := m.Lookup(owner, id)
	if err != nil {
		return nil, err
	}
	if m.cfg.Images == nil {
		return nil, fmt.Errorf("%w: this server has no image store", ErrInvalid)
	}
	root := filepath.Join(m.dir, sb.ID, "root")
	b, err := os.ReadFile(filepath.Join(root, "image"))
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox %s was not created from an image", ErrInvalid, sb.ID)
	}
	// By digest, as the operator: the sandbox was made from it, so its
	// layers are already the sandbox's (even if unpublished meanwhile).
	base, err := m.cfg.Images.Get(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("%w: the image sandbox %s was created from is gone: %v", ErrInvalid, sb.ID, err)
	}
	if name == "" {
		name = "localhost/airlock/" + sb.ID + ":latest"
	}
	sb.mu.Lock()
	idBase := sb.rec.UIDBase
	sb.mu.Unlock()
	if t, err := tier.Lookup(sb.runtime()); err == nil && t.Caps().UnmappedIDs {
		idBase = 0 // its upper directory holds the sandbox's own ids
	}
	if err := m.AuditFirst(ctx, owner, sb.ID, ActionSandboxSnapshot, map[string]any{"name": name, "base": base.Digest}); err != nil {
		return nil, err
	}
	// Named in the owner's own namespace: never another key's image.
	store := m.cfg.Images.As(owner)
	upper := (&native.ImageRoot{Dir: root}).UpperDir()
	chain, err := layerChain(rootLayersDir(filepath.Join(m.dir, sb.ID)))
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	if len(chain) == 0 {
		return store.Commit(ctx, base, upper, idBase, name)
	}
	return commitChain(ctx, store, base, chain, upper, idBase, name, sb.ID)
}

// commitChain commits a fork's root: each layer of the chain its snapshot
// gave it (snaproot.go), lowest first, then its upper directory, on base.
// The layers between are images of their own for a moment, named after
// the sandbox, and removed once the result holds their layers (removal
// keeps what another image uses), or when a commit fails.
func commitChain(ctx context.Context, store *imagestore.Store, base *imagestore.Image, chain []string, upper string, idBase int, name, id string) (*imagestore.Image, error) {
	var between []string
	defer func() {
		for _, n := range between {
			store.Remove(n)
		}
	}()
	img := base
	for i, l := range chain {
		n := fmt.Sprintf("localhost/airlock/%s-layer-%d:commit", id, i)
		next, err := store.Commit(ctx, img, l, idBase, n)
		if err != nil {
			return nil, fmt.Errorf("manager: commit layer %d of the fork's root: %w", i, err)
		}
		between = append(between, n)
		img = next
	}
	return store.Commit(ctx, img, upper, idBase, name)
}

// checkStaticAgent refuses image sandboxes when the agent binary needs a
// dynamic loader: an image has its own /lib (or none), not the host's.
func checkStaticAgent(bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("agent binary %s: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%w: image sandboxes need a statically linked airlock (CGO_ENABLED=0 go build); %s needs a dynamic loader the image may not have", ErrInvalid, bin)
		}
	}
	return nil
}
