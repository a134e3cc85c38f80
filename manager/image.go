package manager

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"

	"airlock/imagestore"
	"airlock/policy"
	"airlock/runtime/native"
)

// resolveImage looks up req.Image in the server's image store and adjusts
// p for it (the image's env and user; the request's env stays on top). It
// returns nil when the request names no image.
func (m *Manager) resolveImage(req *CreateRequest, p *policy.Policy) (*imagestore.Image, error) {
	if req.Image == "" {
		return nil, nil
	}
	if m.cfg.Images == nil {
		return nil, fmt.Errorf("%w: this server has no image store", ErrInvalid)
	}
	if p.Runtime != "" && p.Runtime != policy.RuntimeNative {
		return nil, fmt.Errorf("%w: image roots work with the native runtime only", ErrPolicy)
	}
	img, err := m.cfg.Images.Get(req.Image)
	if errors.Is(err, imagestore.ErrNotFound) {
		return nil, fmt.Errorf("%w: image %q is not in the server's image store (pull it first: POST /v1/images)", ErrInvalid, req.Image)
	}
	if err != nil {
		return nil, err
	}
	if err := img.ApplyTo(p); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
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
	return &native.ImageRoot{Layers: img.LayerDirs(), Dir: filepath.Join(dir, "root")}, nil
}
