package e2b

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-dev/airlock/imagestore"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/template"
)

// E2B's template builds from the SDK (Template.build): POST /v3/templates
// asks for a build, GET /templates/{id}/files/{hash} hands out an upload
// URL for each COPY's files (a tar, gzipped or not), POST
// /v2/templates/{id}/builds/{build} sends the steps, and GET
// .../status polls it with its log. airlock turns the steps into a
// Dockerfile for its own template builder (template.Build, with its cache),
// building the image under the template's name in the key's namespace, so
// that Sandbox.create(name) finds it.

// templateUploadPrefix is the path of upload URLs (authenticated by their
// signature, not an API key).
const templateUploadPrefix = "/e2b-template-files/"

// Limits of SDK template builds.
const (
	maxTemplateBuilds   = 16      // builds kept per server
	maxContextBytes     = 1 << 30 // unpacked files of one build
	maxContextEntries   = 100_000 // files of one build
	templateBuildTime   = 30 * time.Minute
	maxBuildLogEntries  = 10_000
	templateUploadMaxGz = 256 << 20 // an upload's bytes on the wire
)

// tmplLogEntry is E2B's BuildLogEntry.
type tmplLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
}

// tmplBuild is one SDK template build.
type tmplBuild struct {
	templateID, buildID, owner, name string
	tags                             []string

	mu       sync.Mutex
	ctx      *imagestore.Temp // the build context, files uploaded so far
	ctxBytes int64
	ctxFiles int
	uploaded map[string]bool
	started  bool
	status   string // waiting, building, ready, error
	entries  []tmplLogEntry
	reason   string
	created  time.Time
}

// log adds a log entry.
func (b *tmplBuild) log(level, msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.entries) < maxBuildLogEntries {
		b.entries = append(b.entries, tmplLogEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg})
	}
}

// logWriter turns the builder's log into entries, a line each.
type logWriter struct {
	b   *tmplBuild
	buf []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		w.b.log("info", string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// templateBuilds holds the server's SDK template builds.
type templateBuilds struct {
	mu     sync.Mutex
	builds map[string]*tmplBuild // template id -> build
	sem    chan struct{}
}

// build returns owner's build templateID (and buildID, if not empty).
func (h *Handler) tmplBuild(owner, templateID, buildID string) (*tmplBuild, error) {
	h.tb.mu.Lock()
	b := h.tb.builds[templateID]
	h.tb.mu.Unlock()
	if b == nil || b.owner != owner || (buildID != "" && b.buildID != buildID) {
		return nil, apiErrorf(http.StatusNotFound, "template build %s/%s not found", templateID, buildID)
	}
	return b, nil
}

// requestTemplate serves POST /v3/templates ({name, tags, ...}): a new
// build waiting for its files and steps.
func (h *Handler) requestTemplate(w http.ResponseWriter, r *http.Request) error {
	st := h.m.Images()
	if st == nil {
		return apiErrorf(http.StatusNotImplemented, "this server has no image store: templates cannot be built")
	}
	var req struct {
		Name  string   `json:"name"`
		Alias string   `json:"alias"`
		Tags  []string `json:"tags"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.Name == "" {
		req.Name = req.Alias
	}
	if req.Name == "" || len(req.Name) > 128 || strings.ContainsAny(req.Name, " \t\n\"'\\") {
		return apiErrorf(http.StatusBadRequest, "a template build needs a name (letters, digits, '-', '_', '.', '/', ':')")
	}
	for _, t := range req.Tags {
		if t != "" && t != "latest" && t != "default" {
			return apiErrorf(http.StatusBadRequest, "tags are not supported by airlock's templates (name the template NAME:TAG instead)")
		}
	}
	owner := callerOf(r.Context()).id
	tmp, err := st.As(owner).TempDir("e2b-build-")
	if err != nil {
		return err
	}
	id := make([]byte, 10)
	rand.Read(id)
	b := &tmplBuild{templateID: "tpl-" + hex.EncodeToString(id[:5]), buildID: "bld-" + hex.EncodeToString(id[5:]),
		owner: owner, name: req.Name, tags: []string{}, ctx: tmp, uploaded: map[string]bool{}, status: "waiting", created: time.Now()}
	h.tb.mu.Lock()
	if len(h.tb.builds) >= maxTemplateBuilds {
		// The oldest finished build makes room; else the server is busy.
		var oldest *tmplBuild
		for _, o := range h.tb.builds {
			o.mu.Lock()
			done := o.status == "ready" || o.status == "error" || (!o.started && time.Since(o.created) > time.Hour)
			o.mu.Unlock()
			if done && (oldest == nil || o.created.Before(oldest.created)) {
				oldest = o
			}
		}
		if oldest == nil {
			h.tb.mu.Unlock()
			tmp.Close()
			return apiErrorf(http.StatusTooManyRequests, "%d template builds are under way: try again later", len(h.tb.builds))
		}
		delete(h.tb.builds, oldest.templateID)
		oldest.mu.Lock()
		oldest.ctx.Close()
		oldest.mu.Unlock()
	}
	h.tb.builds[b.templateID] = b
	h.tb.mu.Unlock()
	writeJSON(w, http.StatusAccepted, map[string]any{"templateID": b.templateID, "buildID": b.buildID,
		"aliases": []string{b.name}, "names": []string{b.name}, "public": false, "tags": b.tags})
	return nil
}

// uploadToken signs an upload URL: it names the template and the files'
// hash, under the handler's key.
func (h *Handler) uploadToken(templateID, hash string) string {
	m := hmac.New(sha256.New, h.secret)
	m.Write([]byte("e2b-template-upload\x00" + templateID + "\x00" + hash))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// templateFiles serves GET /templates/{id}/files/{hash}: whether the
// build has those files, and where to upload them.
func (h *Handler) templateFiles(w http.ResponseWriter, r *http.Request) error {
	b, err := h.tmplBuild(callerOf(r.Context()).id, r.PathValue("id"), "")
	if err != nil {
		return err
	}
	hash := r.PathValue("hash")
	if _, err := hex.DecodeString(hash); err != nil || len(hash) != 64 {
		return apiErrorf(http.StatusBadRequest, "bad files hash %q", hash)
	}
	b.mu.Lock()
	present := b.uploaded[hash]
	b.mu.Unlock()
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	u := scheme + "://" + r.Host + templateUploadPrefix + b.templateID + "/" + hash + "?token=" + h.uploadToken(b.templateID, hash)
	writeJSON(w, http.StatusCreated, map[string]any{"present": present, "url": u})
	return nil
}

// serveTemplateUpload serves PUT /e2b-template-files/{id}/{hash}?token=:
// a COPY's files as a tar (gzipped or not), unpacked into the build's
// context. Only directories and regular files are accepted, at relative
// paths inside the context; anything else refuses the whole upload.
func (h *Handler) serveTemplateUpload(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, templateUploadPrefix)
	templateID, hash, ok := strings.Cut(rest, "/")
	if r.Method != http.MethodPut || !ok {
		writeAPIError(w, http.StatusMethodNotAllowed, "PUT "+templateUploadPrefix+"TEMPLATE/HASH?token=...")
		return
	}
	if !tokenOK(r.URL.Query().Get("token"), h.uploadToken(templateID, hash)) {
		writeAPIError(w, http.StatusUnauthorized, "bad or missing upload token")
		return
	}
	h.tb.mu.Lock()
	b := h.tb.builds[templateID]
	h.tb.mu.Unlock()
	if b == nil {
		writeAPIError(w, http.StatusNotFound, "template build "+templateID+" not found")
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started {
		writeAPIError(w, http.StatusConflict, "the build has started: files can no longer be added")
		return
	}
	if err := b.unpack(io.LimitReader(r.Body, templateUploadMaxGz+1)); err != nil {
		writeAPIError(w, http.StatusBadRequest, "upload of "+hash+": "+err.Error())
		return
	}
	b.uploaded[hash] = true
	w.WriteHeader(http.StatusOK)
}

// unpack extracts a tar (gzipped or not) into the build's context; the
// caller holds b.mu. The host resolves nothing the archive names through a
// link: only directories and regular files are made, with O_EXCL-free
// writes below the context, after checking each path is relative and
// clean, and its parent is a real directory.
func (b *tmplBuild) unpack(body io.Reader) error {
	br := bufio.NewReader(body)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer zr.Close()
		src = zr
	}
	tr := tar.NewReader(src)
	root := b.ctx.Path
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("bad tar: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if name == "." {
			continue
		}
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") || strings.ContainsRune(name, 0) || name == "Dockerfile.airlock" {
			return fmt.Errorf("path %q is not inside the context", hdr.Name)
		}
		if b.ctxFiles++; b.ctxFiles > maxContextEntries {
			return fmt.Errorf("more than %d files", maxContextEntries)
		}
		dst := filepath.Join(root, filepath.FromSlash(name))
		if err := realDirs(root, filepath.Dir(dst)); err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if fi, err := os.Lstat(dst); err == nil && !fi.IsDir() {
				return fmt.Errorf("%s is both a file and a directory", name)
			}
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if b.ctxBytes += hdr.Size; b.ctxBytes > maxContextBytes {
				return fmt.Errorf("the files are larger than %d bytes", maxContextBytes)
			}
			if fi, err := os.Lstat(dst); err == nil && !fi.Mode().IsRegular() {
				return fmt.Errorf("%s is not a regular file", name)
			}
			mode := os.FileMode(0o644)
			if hdr.Mode&0o111 != 0 {
				mode = 0o755
			}
			f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, io.LimitReader(tr, hdr.Size))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			os.Chmod(dst, mode)
		default:
			return fmt.Errorf("%s: only files and directories can be copied into a template (resolve symlinks: copy(..., { resolveSymlinks: true }))", name)
		}
	}
}

// realDirs checks that every directory from root down to dir is a real
// directory (no symlink), creating the missing ones.
func realDirs(root, dir string) error {
	rel, err := filepath.Rel(root, dir)
	if err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("%s is outside the context", dir)
	}
	cur := root
	if rel == "." {
		return nil
	}
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if errors.Is(err, os.ErrNotExist) {
			if err := os.Mkdir(cur, 0o755); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", cur)
		}
	}
	return nil
}

// templateStep is one of E2B's TemplateStep.
type templateStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash"`
	Force     bool     `json:"force"`
}

// dockerfileOf turns E2B's build request into a Dockerfile.
func dockerfileOf(from string, steps []templateStep) (string, error) {
	var b strings.Builder
	q := func(s string) string { j, _ := json.Marshal(s); return string(j) }
	b.WriteString("FROM " + from + "\n")
	user := ""
	for i, s := range steps {
		for _, a := range s.Args {
			if strings.ContainsAny(a, "\x00") {
				return "", fmt.Errorf("step %d (%s): an argument has a NUL byte", i+1, s.Type)
			}
		}
		arg := func(n int) string {
			if n < len(s.Args) {
				return s.Args[n]
			}
			return ""
		}
		switch s.Type {
		case "COPY":
			if arg(2) != "" || arg(3) != "" {
				return "", fmt.Errorf("step %d: copy with user or mode is not supported by airlock's builder: set them with a runCmd (chown, chmod) after the copy", i+1)
			}
			if arg(0) == "" || arg(1) == "" {
				return "", fmt.Errorf("step %d: copy needs a source and a destination", i+1)
			}
			fmt.Fprintf(&b, "COPY [%s, %s]\n", q(arg(0)), q(arg(1)))
		case "RUN":
			if u := arg(1); u != "" && u != user {
				fmt.Fprintf(&b, "USER %s\nRUN [\"/bin/sh\", \"-c\", %s]\n", u, q(arg(0)))
				if user != "" {
					fmt.Fprintf(&b, "USER %s\n", user)
				} else {
					b.WriteString("USER root\n")
				}
			} else {
				fmt.Fprintf(&b, "RUN [\"/bin/sh\", \"-c\", %s]\n", q(arg(0)))
			}
		case "ENV":
			if len(s.Args)%2 != 0 {
				return "", fmt.Errorf("step %d: env needs name and value pairs", i+1)
			}
			for j := 0; j < len(s.Args); j += 2 {
				k, v := s.Args[j], s.Args[j+1]
				if !validEnvName(k) || strings.ContainsAny(v, "\n\r") {
					return "", fmt.Errorf("step %d: bad env %q", i+1, k)
				}
				fmt.Fprintf(&b, "ENV %s=\"%s\"\n", k, strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`).Replace(v))
			}
		case "WORKDIR":
			if !strings.HasPrefix(arg(0), "/") || strings.ContainsAny(arg(0), "\n\r") {
				return "", fmt.Errorf("step %d: workdir %q must be an absolute path", i+1, arg(0))
			}
			fmt.Fprintf(&b, "WORKDIR %s\n", arg(0))
		case "USER":
			if arg(0) == "" || strings.ContainsAny(arg(0), " \t\n\r") {
				return "", fmt.Errorf("step %d: bad user %q", i+1, arg(0))
			}
			user = arg(0)
			fmt.Fprintf(&b, "USER %s\n", user)
		default:
			return "", fmt.Errorf("step %d: %s steps are not supported by airlock's builder", i+1, s.Type)
		}
	}
	return b.String(), nil
}

// validEnvName reports whether k is an environment variable name.
func validEnvName(k string) bool {
	if k == "" {
		return false
	}
	for i, c := range k {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// startTemplateBuild serves POST /v2/templates/{id}/builds/{build}: the
// steps; the build runs in the background (202).
func (h *Handler) startTemplateBuild(w http.ResponseWriter, r *http.Request) error {
	owner := callerOf(r.Context()).id
	b, err := h.tmplBuild(owner, r.PathValue("id"), r.PathValue("build"))
	if err != nil {
		return err
	}
	var req struct {
		FromImage         string          `json:"fromImage"`
		FromTemplate      string          `json:"fromTemplate"`
		FromImageRegistry json.RawMessage `json:"fromImageRegistry"`
		StartCmd          string          `json:"startCmd"`
		ReadyCmd          string          `json:"readyCmd"`
		Force             bool            `json:"force"`
		Steps             []templateStep  `json:"steps"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	from := req.FromImage
	switch {
	case present(req.FromImageRegistry):
		return apiErrorf(http.StatusBadRequest, "registry credentials (fromImageRegistry) are not supported: pull the image into the server's image store first (POST /v1/images)")
	case (req.StartCmd != "" || req.ReadyCmd != "") && h.tmplDir == "":
		return apiErrorf(http.StatusBadRequest, "this server keeps no state directory: setStartCmd and setReadyCmd cannot be recorded")
	case from != "" && req.FromTemplate != "":
		return apiErrorf(http.StatusBadRequest, "fromImage and fromTemplate are exclusive")
	case from == "":
		from = req.FromTemplate
	}
	if from == "" || strings.ContainsAny(from, " \t\n\r") {
		return apiErrorf(http.StatusBadRequest, "a template build needs fromImage or fromTemplate: an image or template of the server's image store this key may use")
	}
	st := h.m.Images().As(owner)
	if _, err := st.Get(from); err != nil {
		return apiErrorf(http.StatusBadRequest, "base %q is not in the server's image store (this key's images and templates and the published ones): pull it first (POST /v1/images)", from)
	}
	df, err := dockerfileOf(from, req.Steps)
	if err != nil {
		return apiErrorf(http.StatusBadRequest, "%v", err)
	}
	for _, s := range req.Steps {
		if s.Type == "COPY" {
			b.mu.Lock()
			ok := b.uploaded[s.FilesHash]
			b.mu.Unlock()
			if !ok {
				return apiErrorf(http.StatusBadRequest, "the files of copy %q (hash %s) were not uploaded", s.Args[0], s.FilesHash)
			}
		}
	}
	b.mu.Lock()
	if b.started {
		b.mu.Unlock()
		return apiErrorf(http.StatusConflict, "build %s has started already", b.buildID)
	}
	b.started, b.status = true, "building"
	b.mu.Unlock()
	if err := h.m.AuditFirst(r.Context(), owner, "", "template.build", map[string]any{"name": b.name, "via": "e2b", "template": b.templateID}); err != nil {
		return err
	}
	go h.runTemplateBuild(b, df, req.Force, startSpec{StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd})
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// runTemplateBuild builds b's Dockerfile df with airlock's builder.
func (h *Handler) runTemplateBuild(b *tmplBuild, df string, noCache bool, start startSpec) {
	fail := func(msg string) {
		b.log("error", msg)
		b.mu.Lock()
		b.status, b.reason = "error", msg
		b.mu.Unlock()
	}
	h.tb.sem <- struct{}{}
	defer func() { <-h.tb.sem }()
	// The context is not needed once built (the status stays for polling).
	defer func() {
		b.mu.Lock()
		b.ctx.Close()
		b.mu.Unlock()
	}()
	dfPath := filepath.Join(b.ctx.Path, "Dockerfile.airlock")
	if err := os.WriteFile(dfPath, []byte(df), 0o600); err != nil {
		fail(err.Error())
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(df), "\n") {
		b.log("info", "airlock: "+line)
	}
	p, err := policy.Preset(policy.Strict)
	if err == nil {
		p.Runtime, err = policy.ParseRuntime(h.m.DefaultRuntime())
	}
	if err != nil {
		fail(err.Error())
		return
	}
	st := h.m.Images().As(b.owner)
	ctx, cancel := context.WithTimeout(context.Background(), templateBuildTime)
	defer cancel()
	res, err := template.Build(ctx, template.Options{Dockerfile: dfPath, Context: b.ctx.Path, Name: b.name, Store: st,
		StateDir: filepath.Dir(st.Dir()), Policy: p, NoCache: noCache, Log: &logWriter{b: b},
		AllowPull: func(ref string) error {
			return fmt.Errorf("image %s is not in the server's image store: pull it first (POST /v1/images)", ref)
		}})
	if err != nil {
		fail("build failed: " + err.Error())
		return
	}
	// Recorded even when empty: a rebuild without them clears them.
	start.Digest = res.Image.Digest
	if h.tmplDir != "" {
		if err := h.saveStartSpec(b.owner, b.name, start); err != nil {
			fail("recording the start and ready commands: " + err.Error())
			return
		}
	}
	b.log("info", fmt.Sprintf("built %s (%s): %d steps, %d cached", b.name, res.Image.Digest, res.Steps, res.Cached))
	b.mu.Lock()
	b.status = "ready"
	b.mu.Unlock()
}

// templateBuildStatus serves GET /templates/{id}/builds/{build}/status
// (logsOffset): the state and the log entries from the offset.
func (h *Handler) templateBuildStatus(w http.ResponseWriter, r *http.Request) error {
	b, err := h.tmplBuild(callerOf(r.Context()).id, r.PathValue("id"), r.PathValue("build"))
	if err != nil {
		return err
	}
	off := 0
	if v := r.URL.Query().Get("logsOffset"); v != "" {
		if off, err = strconv.Atoi(v); err != nil || off < 0 {
			return apiErrorf(http.StatusBadRequest, "bad logsOffset")
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	status := b.status
	if status == "waiting" {
		status = "building"
	}
	entries := []tmplLogEntry{}
	if off < len(b.entries) {
		entries = append(entries, b.entries[off:]...)
	}
	logs := make([]string, 0, len(entries))
	for _, e := range entries {
		logs = append(logs, e.Message)
	}
	out := map[string]any{"buildID": b.buildID, "templateID": b.templateID, "status": status, "logEntries": entries, "logs": logs}
	if b.status == "error" {
		out["reason"] = map[string]any{"message": b.reason, "logEntries": []tmplLogEntry{}}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// templateAlias serves GET /templates/aliases/{alias}: 200 if a create may
// name it (templateFor: E2B's well-known templates, airlock's profiles, and
// the images and templates the key may use), else 404.
func (h *Handler) templateAlias(w http.ResponseWriter, r *http.Request) error {
	alias := r.PathValue("alias")
	_, image, err := h.templateFor(callerOf(r.Context()).id, alias)
	if err != nil || alias == "" {
		return apiErrorf(http.StatusNotFound, "template '%s' not found", alias)
	}
	// The well-known templates and profiles are every key's (public); an
	// image of the store is the key's own as far as it can tell.
	writeJSON(w, http.StatusOK, map[string]any{"templateID": alias, "public": image == ""})
	return nil
}
