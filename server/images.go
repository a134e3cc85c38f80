package server

import (
	"errors"
	"net/http"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/imagestore"
)

// PullRequest is the body of POST /v1/images.
type PullRequest struct {
	// Ref is the image to pull, e.g. "127.0.0.1:5000/py:3.12".
	Ref string `json:"ref"`
	// Platform is os/arch[/variant]; empty means linux and the host's arch.
	Platform string `json:"platform,omitempty"`
}

// ImageList is the body of GET /v1/images.
type ImageList struct {
	Images []imagestore.Image `json:"images"`
}

func (s *Server) imageRoutes(authed func(string, handler)) {
	authed("GET /v1/images", s.listImages)
	authed("POST /v1/images", s.pullImage)
	authed("GET /v1/images/{ref...}", s.getImage)
	authed("DELETE /v1/images/{ref...}", s.removeImage)
	authed("POST /v1/sandboxes/{id}/snapshot", s.snapshotSandbox)
	s.volumeRoutes(authed)
	authed("POST /v1/templates", s.buildTemplate)
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshot.
type SnapshotRequest struct {
	// Name names the new image; "" is localhost/airlock/<id>:latest.
	Name string `json:"name,omitempty"`
}

// snapshotSandbox turns an image sandbox's changes into a new image.
func (s *Server) snapshotSandbox(w http.ResponseWriter, r *http.Request) error {
	var req SnapshotRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	img, err := s.m.Snapshot(r.Context(), caller(r).id, r.PathValue("id"), req.Name)
	if err != nil {
		return imageError(err)
	}
	writeJSON(w, 201, img)
	return nil
}

// images returns the image store as the caller sees it: its own
// namespace of names plus the public images (imagestore.Store.As; with
// --no-auth the operator's). Another key's image is 404, like another
// key's sandbox.
func (s *Server) images(r *http.Request) (*imagestore.Store, error) {
	if s.cfg.Images == nil {
		return nil, errf(503, "unavailable", "this server has no image store")
	}
	return s.cfg.Images.As(caller(r).id), nil
}

// imageError maps image store errors to API errors.
func imageError(err error) error {
	switch {
	case errors.Is(err, imagestore.ErrNotFound):
		return errf(404, "not_found", "%v", err)
	case errors.Is(err, imagestore.ErrBadReference):
		return errf(400, "bad_request", "%v", err)
	case errors.Is(err, imagestore.ErrInvalidImage):
		return errf(422, "image_refused", "%v", err)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return errf(507, "no_space", "%v", err)
	case errors.Is(err, imagestore.ErrRegistry):
		return errf(502, "registry_error", "%v", err)
	}
	return err
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) error {
	st, err := s.images(r)
	if err != nil {
		return err
	}
	imgs, err := st.List()
	if err != nil {
		return imageError(err)
	}
	writeJSON(w, 200, ImageList{Images: imgs})
	return nil
}

// pullImage pulls an image. The server fetches from the registry the
// request names, so only registries on the server's allowlist
// (--image-registry) are reachable: the API must not become a way to make
// the server issue requests to arbitrary hosts.
func (s *Server) pullImage(w http.ResponseWriter, r *http.Request) error {
	st, err := s.images(r)
	if err != nil {
		return err
	}
	var req PullRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if err := s.allowPull(req.Ref); err != nil {
		return err
	}
	img, err := st.Pull(r.Context(), req.Ref, imagestore.PullOptions{Platform: req.Platform})
	if err != nil {
		return imageError(err)
	}
	writeJSON(w, 200, img)
	return nil
}

func (s *Server) getImage(w http.ResponseWriter, r *http.Request) error {
	st, err := s.images(r)
	if err != nil {
		return err
	}
	img, err := st.Get(r.PathValue("ref"))
	if err != nil {
		return imageError(err)
	}
	writeJSON(w, 200, img)
	return nil
}

func (s *Server) removeImage(w http.ResponseWriter, r *http.Request) error {
	st, err := s.images(r)
	if err != nil {
		return err
	}
	img, err := st.Remove(r.PathValue("ref"))
	if err != nil {
		return imageError(err)
	}
	writeJSON(w, 200, img)
	return nil
}
