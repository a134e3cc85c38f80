package e2b

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/volume"
)

// E2B's volumes (POST/GET /volumes, GET/DELETE /volumes/{id}, and a
// create's volumeMounts) are airlock's named volumes of the key
// (docs/api.md, "Volumes"): a volume's E2B id is its name. E2B's volume
// content API (reading and writing a volume's files without a sandbox) is
// not served: mount the volume in a sandbox instead.

// DefaultVolumeBytes is the size of a volume made through E2B's API, which
// names none.
const DefaultVolumeBytes = 1 << 30

// volumeInfo is E2B's Volume (and VolumeAndToken).
type volumeInfo struct {
	VolumeID string  `json:"volumeID"`
	Name     string  `json:"name"`
	Token    string  `json:"token,omitempty"`
	Domain   *string `json:"domain"`
}

// volumeStore is the key's view of the server's volume store.
func (h *Handler) volumeStore(r *http.Request) (*volume.Store, error) {
	vs := h.m.Volumes()
	if vs == nil {
		return nil, apiErrorf(http.StatusNotImplemented, "this server has no volume store")
	}
	return vs.As(callerOf(r.Context()).id), nil
}

// volumeError maps the volume store's errors to E2B's.
func volumeError(err error, name string) error {
	switch {
	case errors.Is(err, volume.ErrNotFound):
		return apiErrorf(http.StatusNotFound, "volume '%s' not found", name)
	case errors.Is(err, volume.ErrExists):
		return apiErrorf(http.StatusConflict, "volume '%s' exists", name)
	case errors.Is(err, volume.ErrInUse):
		return apiErrorf(http.StatusConflict, "volume '%s' is mounted by a running sandbox", name)
	case errors.Is(err, volume.ErrInvalid):
		return apiErrorf(http.StatusBadRequest, "%v", err)
	}
	return err
}

func (h *Handler) createVolume(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	vs, err := h.volumeStore(r)
	if err != nil {
		return err
	}
	v, err := vs.Create(req.Name, DefaultVolumeBytes)
	if err != nil {
		return volumeError(err, req.Name)
	}
	h.m.Audit(r.Context(), callerOf(r.Context()).id, "", "volume.create", map[string]any{"name": v.Name, "via": "e2b"})
	writeJSON(w, http.StatusCreated, volumeInfo{VolumeID: v.Name, Name: v.Name})
	return nil
}

func (h *Handler) listVolumes(w http.ResponseWriter, r *http.Request) error {
	vs, err := h.volumeStore(r)
	if err != nil {
		return err
	}
	list, err := vs.List()
	if err != nil {
		return err
	}
	out := make([]volumeInfo, 0, len(list))
	for _, v := range list {
		out = append(out, volumeInfo{VolumeID: v.Name, Name: v.Name})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) getVolume(w http.ResponseWriter, r *http.Request) error {
	vs, err := h.volumeStore(r)
	if err != nil {
		return err
	}
	v, err := vs.Get(r.PathValue("id"))
	if err != nil {
		return volumeError(err, r.PathValue("id"))
	}
	writeJSON(w, http.StatusOK, volumeInfo{VolumeID: v.Name, Name: v.Name})
	return nil
}

func (h *Handler) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	vs, err := h.volumeStore(r)
	if err != nil {
		return err
	}
	if _, err := vs.Delete(r.PathValue("id")); err != nil {
		return volumeError(err, r.PathValue("id"))
	}
	h.m.Audit(r.Context(), callerOf(r.Context()).id, "", "volume.delete", map[string]any{"name": r.PathValue("id"), "via": "e2b"})
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// volumeMounts maps a create's volumeMounts ([{name, path}]) onto airlock's
// volume references; /home/user paths are the workspace's.
func volumeMounts(raw json.RawMessage) ([]manager.VolumeRef, error) {
	if !present(raw) {
		return nil, nil
	}
	var mounts []struct {
		Name string `json:"name"`
		Path string `json:"path"`
	}
	if err := json.Unmarshal(raw, &mounts); err != nil {
		return nil, apiErrorf(http.StatusBadRequest, "bad volumeMounts: %v", err)
	}
	out := make([]manager.VolumeRef, 0, len(mounts))
	for _, m := range mounts {
		p, ok := toSandbox(m.Path)
		if !ok || m.Name == "" {
			return nil, apiErrorf(http.StatusBadRequest, "bad volume mount %q at %q", m.Name, m.Path)
		}
		out = append(out, manager.VolumeRef{Name: m.Name, Path: p})
	}
	return out, nil
}
