package server

import (
	"context"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/manager"
)

// uploadBody returns the content of a PUT .../files request, capped at
// max bytes: the body itself, or for multipart/form-data (curl -F
// file=@x) the part named "file". more, called once the content has been
// consumed, refuses a second "file" part.
func uploadBody(w http.ResponseWriter, r *http.Request, max int64) (io.Reader, func() error, error) {
	body := http.MaxBytesReader(w, r.Body, max)
	none := func() error { return nil }
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" {
		return body, none, nil
	}
	if params["boundary"] == "" {
		return nil, nil, errf(400, "bad_request", "multipart/form-data without a boundary")
	}
	mr := multipart.NewReader(body, params["boundary"])
	next := func() (*multipart.Part, error) {
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				return nil, nil
			}
			if err != nil {
				var mbe *http.MaxBytesError
				if errors.As(err, &mbe) {
					return nil, err
				}
				return nil, errf(400, "bad_request", "bad multipart body: %v", err)
			}
			if part.FormName() == "file" {
				return part, nil
			}
			part.Close()
		}
	}
	part, err := next()
	if err != nil {
		return nil, nil, err
	}
	if part == nil {
		return nil, nil, errf(400, "bad_request", `multipart body without a part named "file" (curl -F file=@NAME)`)
	}
	more := func() error {
		p, err := next()
		if err != nil {
			return err
		}
		if p != nil {
			return errf(400, "bad_request", `more than one part named "file": upload one file per request`)
		}
		return nil
	}
	return part, more, nil
}

// tarTimeout bounds a directory download.
const tarTimeout = 10 * time.Minute

// readTar streams directory p as a tar archive. The archive is made inside
// the sandbox (tar run through the agent, with the sandbox's own view of
// its files), so the host never resolves a path the sandbox controls; the
// server only relays the bytes, at most MaxFileBytes of them. A failure
// after the first byte aborts the response, so a client never mistakes a
// cut archive for a whole one.
func (s *Server) readTar(w http.ResponseWriter, r *http.Request, sb *manager.Sandbox, p string) error {
	fi, err := sb.Agent().Stat(r.Context(), p)
	if err != nil {
		return err
	}
	if fi.Type != agent.TypeDir {
		return errf(400, "not_a_directory", "%s is not a directory: download a file without format=tar", p)
	}
	// Refuse at once what is known to be too large: the sum of the
	// file sizes (a listing cut short by its own cap proves nothing; the
	// byte count while streaming still applies).
	if list, err := sb.Agent().List(r.Context(), p, 64); err == nil {
		var total int64
		for _, e := range list {
			total += e.Size
		}
		if total > s.cfg.MaxFileBytes {
			return errf(413, "too_large", "the files under %s hold %d bytes, more than the %d a download may have", p, total, s.cfg.MaxFileBytes)
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), tarTimeout)
	defer cancel()
	proc, err := sb.Agent().Exec(ctx, agent.ExecRequest{Argv: []string{"tar", "-C", p, "-cf", "-", "."}, Tag: "airlock-download"})
	if err != nil {
		return errf(500, "internal", "cannot run tar in the sandbox: %s", agentMessage(err))
	}
	defer proc.Close()
	var sent int64
	var stderr strings.Builder
	started := false
	for ev := range proc.Events() {
		switch ev.Type {
		case agent.EventStdout:
			if sent+int64(len(ev.Data)) > s.cfg.MaxFileBytes {
				if !started {
					return errf(413, "too_large", "the archive of %s is larger than %d bytes", p, s.cfg.MaxFileBytes)
				}
				panic(http.ErrAbortHandler)
			}
			if !started {
				w.Header().Set("Content-Type", "application/x-tar")
				w.Header().Set("X-Content-Type-Options", "nosniff")
				w.WriteHeader(200)
				started = true
			}
			if _, err := w.Write(ev.Data); err != nil {
				return nil // client gone; the deferred Close kills tar
			}
			sent += int64(len(ev.Data))
		case agent.EventStderr:
			if stderr.Len() < 4096 {
				stderr.Write(ev.Data)
			}
		case agent.EventExit:
			if ev.ExitCode == 0 && ev.Signal == "" {
				if !started {
					w.Header().Set("Content-Type", "application/x-tar")
					w.WriteHeader(200)
				}
				return nil
			}
		}
	}
	if !started {
		return errf(500, "internal", "tar failed in the sandbox: %s", strings.TrimSpace(stderr.String()))
	}
	panic(http.ErrAbortHandler)
}
