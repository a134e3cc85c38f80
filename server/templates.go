package server

import (
	"encoding/base64"
	"errors"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/airlock-dev/airlock/imagestore"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/template"
)

// TemplateRequest is the body of POST /v1/templates.
type TemplateRequest struct {
	// Name names the image built.
	Name string `json:"name"`
	// Dockerfile is the Dockerfile's text.
	Dockerfile string `json:"dockerfile"`
	// Files is the build context: relative path -> base64 content.
	Files map[string]string `json:"files,omitempty"`
	// BuildArgs are ARG values.
	BuildArgs map[string]string `json:"build_args,omitempty"`
	// NoCache runs every step again.
	NoCache bool `json:"no_cache,omitempty"`
	// Runtime is the tier RUN steps run under ("" the server's default
	// runtime, as for sandboxes).
	Runtime string `json:"runtime,omitempty"`
}

// TemplateResult is the answer of POST /v1/templates.
type TemplateResult struct {
	Image  *imagestore.Image `json:"image"`
	Steps  int               `json:"steps"`
	Cached int               `json:"cached"`
	Log    string            `json:"log"`
}

// maxBuildLog caps the build log returned.
const maxBuildLog = 256 << 10

// builds bounds concurrent template builds (each runs sandboxes).
var builds = make(chan struct{}, 2)

// cappedLog keeps the first maxBuildLog bytes.
type cappedLog struct{ b strings.Builder }

func (c *cappedLog) Write(p []byte) (int, error) {
	if room := maxBuildLog - c.b.Len(); room > 0 {
		c.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// allowPull checks ref's registry against the server's allowlist.
func (s *Server) allowPull(ref string) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return errf(400, "bad_request", "image reference %q: %v", ref, err)
	}
	reg := r.Context().RegistryStr()
	if !slices.Contains(s.cfg.ImageRegistries, "*") && !slices.Contains(s.cfg.ImageRegistries, reg) {
		return errf(403, "forbidden", "registry %s is not allowed for pulls through the API; the server allows %q (airlock serve --image-registry HOST)", reg, s.cfg.ImageRegistries)
	}
	return nil
}

// buildTemplate builds a Dockerfile sent in the request.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) error {
	st, err := s.images(r)
	if err != nil {
		return err
	}
	var req TemplateRequest
	if err := decode(w, r, &req); err != nil {
		return err
	}
	if req.Name == "" || req.Dockerfile == "" {
		return errf(400, "bad_request", "name and dockerfile are required")
	}
	ctxTmp, err := st.TempDir("context-")
	if err != nil {
		return err
	}
	defer ctxTmp.Close()
	ctxDir := ctxTmp.Path
	for p, b64 := range req.Files {
		clean := path.Clean(p)
		if p == "" || path.IsAbs(p) || clean == ".." || strings.HasPrefix(clean, "../") || strings.ContainsRune(p, 0) || clean == "Dockerfile.airlock" {
			return errf(400, "bad_request", "files: bad path %q (relative, inside the context)", p)
		}
		data, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return errf(400, "bad_request", "files: %q is not base64: %v", p, err)
		}
		dst := filepath.Join(ctxDir, filepath.FromSlash(clean))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return err
		}
	}
	df := filepath.Join(ctxDir, "Dockerfile.airlock")
	if err := os.WriteFile(df, []byte(req.Dockerfile), 0o600); err != nil {
		return err
	}
	p, err := policy.Preset(policy.Strict)
	if err != nil {
		return err
	}
	rt := req.Runtime
	if rt == "" {
		rt = s.m.DefaultRuntime()
	}
	if p.Runtime, err = policy.ParseRuntime(rt); err != nil {
		return errf(422, "invalid_policy", "runtime: %v", err)
	}
	select {
	case builds <- struct{}{}:
		defer func() { <-builds }()
	case <-r.Context().Done():
		return r.Context().Err()
	}
	if err := s.m.AuditFirst(r.Context(), caller(r).id, "", "template.build", map[string]any{"name": req.Name}); err != nil {
		return err
	}
	var log cappedLog
	res, err := template.Build(r.Context(), template.Options{Dockerfile: df, Context: ctxDir, Name: req.Name, Store: st,
		StateDir: filepath.Dir(st.Dir()), Policy: p, Args: req.BuildArgs, NoCache: req.NoCache, Log: &log, AllowPull: s.allowPull})
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			return err
		}
		if ie := imageError(err); ie != err {
			return ie
		}
		return errf(422, "build_failed", "%v\n%s", err, log.b.String())
	}
	writeJSON(w, 201, TemplateResult{Image: res.Image, Steps: res.Steps, Cached: res.Cached, Log: log.b.String()})
	return nil
}
