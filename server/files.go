package server

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"math"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/store"
)

func utf8Valid(b []byte) bool { return utf8.Valid(b) }

// Path rules for the file API. The agent performs every operation inside
// the sandbox, so even a path that passes these checks can only reach the
// sandbox's own files; the checks make the API's contract explicit: only
// the workspace and /tmp are addressable.
const maxPathLen = 4096

// roots are the sandbox directories the file API may address.
var roots = []string{"/workspace", "/tmp"}

// CleanPath validates a file API path and returns it absolute and clean.
// Relative paths are relative to /workspace. It refuses NUL bytes, paths
// that leave /workspace and /tmp (lexically, after resolving ".."), and
// over-long paths. Symlinks are resolved later, inside the sandbox.
func CleanPath(p string) (string, error) {
	if p == "" {
		return "", errf(400, "bad_path", "missing path")
	}
	if len(p) > maxPathLen || strings.IndexByte(p, 0) >= 0 || !utf8.ValidString(p) {
		return "", errf(400, "bad_path", "path is too long, contains a NUL byte or is not UTF-8")
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", errf(400, "bad_path", "path %q contains '..'", p)
		}
	}
	if !path.IsAbs(p) {
		p = "/workspace/" + p
	}
	p = path.Clean(p)
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return p, nil
		}
	}
	return "", errf(400, "bad_path", "path %q is outside /workspace and /tmp", p)
}

// agentStatus maps an agent error to an HTTP status.
func agentStatus(err error) (int, string, bool) {
	var ae *agent.Error
	if !errors.As(err, &ae) {
		if errors.Is(err, agent.ErrClosed) {
			return 409, "not_running", true
		}
		return 0, "", false
	}
	switch ae.Code {
	case agent.CodeNotFound:
		return 404, "file_not_found", true
	case agent.CodeExists:
		return 409, "exists", true
	case agent.CodeNotADirectory, agent.CodeIsADirectory, agent.CodeNotRegular, agent.CodeInvalidArgument, agent.CodeCrossDevice:
		return 400, ae.Code, true
	case agent.CodePermissionDenied:
		return 403, "permission_denied", true
	case agent.CodeTooLarge:
		return 413, "too_large", true
	case agent.CodeNameTooLong:
		return 400, "name_too_long", true
	case agent.CodeNoSpace:
		return 507, "no_space", true
	case agent.CodeClosed:
		return 409, "closed", true
	case agent.CodeLimit:
		return 429, "limit_reached", true
	case agent.CodeTimeout:
		return 504, "timeout", true
	}
	return 500, ae.Code, true
}

func agentMessage(err error) string {
	var ae *agent.Error
	if errors.As(err, &ae) {
		return ae.Message
	}
	return err.Error()
}

// onlyParams refuses query parameters other than allowed.
func onlyParams(r *http.Request, allowed ...string) error {
	for k := range r.URL.Query() {
		ok := false
		for _, a := range allowed {
			ok = ok || k == a
		}
		if !ok {
			return errf(400, "bad_request", "unknown query parameter %q", k)
		}
	}
	return nil
}

func pathParam(r *http.Request) (string, error) {
	if err := onlyParams(r, "path", "mode", "depth"); err != nil {
		return "", err
	}
	q := r.URL.Query()
	if len(q["path"]) > 1 {
		return "", errf(400, "bad_path", "repeated path parameter")
	}
	return CleanPath(q.Get("path"))
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) error {
	format := r.URL.Query().Get("format")
	if format != "" {
		// Remove it before pathParam, which refuses unknown parameters.
		q := r.URL.Query()
		if len(q["format"]) > 1 || (format != "tar" && format != "raw") {
			return errf(400, "bad_request", "format must be raw (a file's content, the default) or tar (a directory)")
		}
		q.Del("format")
		r.URL.RawQuery = q.Encode()
	}
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if format == "tar" {
		// A directory's size is not known up front: any read_file rule
		// holds a tar download.
		if err := s.approve(r, approval.Action{Kind: approval.KindReadFile, Sandbox: sb.ID, Path: p + " (tar)", Size: math.MaxInt64}); err != nil {
			return err
		}
		return s.readTar(w, r, sb, p)
	}
	if s.gate != nil {
		fi, err := sb.Agent().Stat(r.Context(), p)
		if err != nil {
			return err
		}
		if err := s.approve(r, approval.Action{Kind: approval.KindReadFile, Sandbox: sb.ID, Path: p, Size: fi.Size}); err != nil {
			return err
		}
	}
	rc, err := sb.Agent().ReadFile(r.Context(), p)
	if err != nil {
		return err
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(200)
	io.Copy(w, rc)
	return nil
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	var mode os.FileMode
	if m := r.URL.Query().Get("mode"); m != "" {
		n, err := strconv.ParseUint(m, 8, 32)
		if err != nil || n > 0o7777 {
			return errf(400, "bad_request", "mode must be octal permission bits, e.g. 0755")
		}
		mode = os.FileMode(n & 0o777)
		if n&0o4000 != 0 {
			mode |= os.ModeSetuid
		}
		if n&0o2000 != 0 {
			mode |= os.ModeSetgid
		}
		if n&0o1000 != 0 {
			mode |= os.ModeSticky
		}
	}
	if r.ContentLength > s.cfg.MaxFileBytes {
		return errf(413, "too_large", "file larger than %d bytes", s.cfg.MaxFileBytes)
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	k := caller(r)
	if err := s.m.AuditFirst(r.Context(), k.id, sb.ID, store.ActionFileWrite, map[string]any{"path": p}); err != nil {
		return err
	}
	body, more, err := uploadBody(w, r, s.cfg.MaxFileBytes)
	if err != nil {
		return err
	}
	n, err := sb.Agent().WriteFile(r.Context(), p, body, mode)
	if err == nil {
		err = more()
	}
	detail := map[string]any{"path": p, "bytes": n}
	if err != nil {
		detail["error"] = err.Error()
	}
	s.m.Audit(r.Context(), k.id, sb.ID, store.ActionFileWrite+".result", detail)
	if err != nil {
		// A capped body that overflowed leaves a partial file: remove it.
		// The agent abandons the write asynchronously, so the file may
		// be created after a first Remove: remove until it stays gone.
		var mbe *http.MaxBytesError
		var ae *apiError
		if errors.As(err, &mbe) || errors.As(err, &ae) {
			ctx := context.WithoutCancel(r.Context())
			for range 10 {
				sb.Agent().Remove(ctx, p)
				time.Sleep(20 * time.Millisecond)
				if _, serr := sb.Agent().Stat(ctx, p); errors.Is(serr, fs.ErrNotExist) {
					break
				}
			}
		}
		return err
	}
	writeJSON(w, 200, map[string]any{"path": p, "bytes": n})
	return nil
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	if p == "/workspace" || p == "/tmp" {
		return errf(400, "bad_path", "refusing to remove %s itself", p)
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if err := s.m.AuditFirst(r.Context(), caller(r).id, sb.ID, "file.remove", map[string]string{"path": p}); err != nil {
		return err
	}
	if err := sb.Agent().Remove(r.Context(), p); err != nil {
		return err
	}
	w.WriteHeader(204)
	return nil
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if q.Get("path") == "" {
		q.Set("path", "/workspace")
		r.URL.RawQuery = q.Encode()
	}
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	depth := 1
	if d := q.Get("depth"); d != "" {
		if depth, err = strconv.Atoi(d); err != nil || depth < 1 || depth > 64 {
			return errf(400, "bad_request", "depth must be 1..64")
		}
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	list, err := sb.Agent().List(r.Context(), p, depth)
	truncated := false
	var ae *agent.Error
	if errors.As(err, &ae) && ae.Code == agent.CodeTooLarge {
		truncated, err = true, nil
	}
	if err != nil {
		return err
	}
	if list == nil {
		list = []agent.FileInfo{}
	}
	writeJSON(w, 200, map[string]any{"entries": list, "truncated": truncated})
	return nil
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	fi, err := sb.Agent().Stat(r.Context(), p)
	if err != nil {
		return err
	}
	writeJSON(w, 200, fi)
	return nil
}

// PathRequest is the body of POST .../files/mkdir.
type PathRequest struct {
	Path string `json:"path"`
}

// MoveRequest is the body of POST .../files/move.
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) error {
	var req PathRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	p, err := CleanPath(req.Path)
	if err != nil {
		return err
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if err := sb.Agent().Mkdir(r.Context(), p); err != nil {
		return err
	}
	writeJSON(w, 200, map[string]string{"path": p})
	return nil
}

func (s *Server) move(w http.ResponseWriter, r *http.Request) error {
	var req MoveRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	from, err := CleanPath(req.From)
	if err != nil {
		return err
	}
	to, err := CleanPath(req.To)
	if err != nil {
		return err
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	if err := s.m.AuditFirst(r.Context(), caller(r).id, sb.ID, "file.move", map[string]string{"from": from, "to": to}); err != nil {
		return err
	}
	if err := sb.Agent().Move(r.Context(), from, to); err != nil {
		return err
	}
	writeJSON(w, 200, map[string]string{"from": from, "to": to})
	return nil
}
