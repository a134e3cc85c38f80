package server

import (
	"errors"
	"net/http"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/volume"
)

// VolumeRequest is the body of POST /v1/volumes.
type VolumeRequest struct {
	Name      string `json:"name"`
	SizeBytes int64  `json:"size_bytes"`
}

// VolumeList is the body of GET /v1/volumes.
type VolumeList struct {
	Volumes []volume.Volume `json:"volumes"`
}

func (s *Server) volumeRoutes(authed func(string, handler)) {
	authed("GET /v1/volumes", s.listVolumes)
	authed("POST /v1/volumes", s.createVolume)
	authed("GET /v1/volumes/{name}", s.getVolume)
	authed("DELETE /v1/volumes/{name}", s.deleteVolume)
}

// volumes returns the volume store as the caller sees it: its own
// volumes only (volume.Store.As; with --no-auth the operator's). Another
// key's volume is 404, like another key's sandbox.
func (s *Server) volumes(r *http.Request) (*volume.Store, error) {
	if v := s.m.Volumes(); v != nil {
		return v.As(caller(r).id), nil
	}
	return nil, errf(503, "unavailable", "this server has no volume store")
}

// volumeError maps volume store errors to API errors.
func volumeError(err error) error {
	switch {
	case errors.Is(err, volume.ErrNotFound):
		return errf(404, "not_found", "%v", err)
	case errors.Is(err, volume.ErrExists), errors.Is(err, volume.ErrInUse):
		return errf(409, "conflict", "%v", err)
	case errors.Is(err, volume.ErrInvalid):
		return errf(400, "bad_request", "%v", err)
	case errors.Is(err, unix.ENOSPC):
		return errf(507, "no_space", "%v", err)
	}
	return err
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) error {
	st, err := s.volumes(r)
	if err != nil {
		return err
	}
	vs, err := st.List()
	if err != nil {
		return volumeError(err)
	}
	writeJSON(w, 200, VolumeList{Volumes: vs})
	return nil
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) error {
	st, err := s.volumes(r)
	if err != nil {
		return err
	}
	var req VolumeRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	v, err := st.Create(req.Name, req.SizeBytes)
	if err != nil {
		return volumeError(err)
	}
	s.m.Audit(r.Context(), caller(r).id, "", "volume.create", map[string]any{"name": v.Name, "size_bytes": v.SizeBytes})
	writeJSON(w, 201, v)
	return nil
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) error {
	st, err := s.volumes(r)
	if err != nil {
		return err
	}
	v, err := st.Get(r.PathValue("name"))
	if err != nil {
		return volumeError(err)
	}
	writeJSON(w, 200, v)
	return nil
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	st, err := s.volumes(r)
	if err != nil {
		return err
	}
	v, err := st.Delete(r.PathValue("name"))
	if err != nil {
		return volumeError(err)
	}
	s.m.Audit(r.Context(), caller(r).id, "", "volume.delete", map[string]any{"name": v.Name})
	writeJSON(w, 200, v)
	return nil
}
