package server

import (
	"context"
	"net/http"

	"github.com/airlock-dev/airlock/manager"
)

// pauseSandbox freezes a sandbox (POST /v1/sandboxes/{id}/pause): every
// process stops where it stands, memory stays resident, the TTL counts on.
func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) error {
	return s.setPaused(w, r, s.m.Pause)
}

// resumeSandbox thaws a paused sandbox (POST /v1/sandboxes/{id}/resume).
func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) error {
	return s.setPaused(w, r, s.m.Resume)
}

func (s *Server) setPaused(w http.ResponseWriter, r *http.Request, op func(ctx context.Context, owner, id string) (manager.Info, error)) error {
	info, err := op(r.Context(), caller(r).id, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, 200, info)
	return nil
}

// errPaused is the answer to a request a paused sandbox cannot serve.
func errPaused(id string) error {
	return errf(409, "paused", "sandbox %s is paused: POST /v1/sandboxes/%s/resume first", id, id)
}

// memorySnapshot snapshots a running gvisor sandbox without stopping it
// (POST /v1/sandboxes/{id}/snapshots): 201 with the snapshot, whose id a
// create names as "snapshot" to fork the sandbox.
func (s *Server) memorySnapshot(w http.ResponseWriter, r *http.Request) error {
	snap, err := s.m.MemorySnapshot(r.Context(), caller(r).id, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, 201, snap)
	return nil
}
