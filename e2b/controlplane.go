package e2b

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/imagestore"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
)

// templateKey is the metadata label that records a sandbox's E2B template.
// It is hidden from E2B's view of the metadata.
const templateKey = "e2b.template"

// autoResumeKey is the metadata label ("true") of a sandbox created with
// autoResume: traffic to it resumes it when paused. Hidden like templateKey,
// as is manager.OnTimeoutKey (autoPause).
const autoResumeKey = "e2b.auto_resume"

// hiddenKey reports whether a metadata key is airlock's own, kept out of
// E2B's view of the metadata and refused in a create's.
func hiddenKey(k string) bool {
	return k == templateKey || k == autoResumeKey || k == manager.OnTimeoutKey || k == manager.PauseMemoryKey
}

// E2B's well-known templates, served by the profile in Config.Profile.
var knownTemplates = []string{"base", "code-interpreter-v1", "code-interpreter"}

// caller is the authenticated API key.
type caller struct {
	id           string
	maxSandboxes int
}

type callerKey struct{}

func callerOf(ctx context.Context) caller {
	c, _ := ctx.Value(callerKey{}).(caller)
	return c
}

// controlHandler is a control-plane handler; a returned *apiError becomes
// E2B's JSON error.
type controlHandler func(w http.ResponseWriter, r *http.Request) error

func (h *Handler) controlRoutes() *http.ServeMux {
	mux := http.NewServeMux()
	route := func(pattern string, f controlHandler) { mux.Handle(pattern, h.authed(f)) }
	route("POST /sandboxes", func(w http.ResponseWriter, r *http.Request) error { return h.create(w, r, 15) })
	route("POST /v2/sandboxes", func(w http.ResponseWriter, r *http.Request) error { return h.create(w, r, 300) })
	route("GET /sandboxes", func(w http.ResponseWriter, r *http.Request) error { return h.list(w, r, false) })
	route("GET /v2/sandboxes", func(w http.ResponseWriter, r *http.Request) error { return h.list(w, r, true) })
	route("GET /sandboxes/{id}", h.getInfo)
	route("DELETE /sandboxes/{id}", h.kill)
	route("POST /sandboxes/{id}/timeout", h.setTimeout)
	route("POST /sandboxes/{id}/refreshes", h.refresh)
	route("POST /sandboxes/{id}/connect", func(w http.ResponseWriter, r *http.Request) error { return h.connect(w, r, false) })
	route("POST /v2/sandboxes/{id}/connect", func(w http.ResponseWriter, r *http.Request) error { return h.connect(w, r, true) })
	route("GET /sandboxes/{id}/metrics", h.metrics)
	unsupported := func(what string) controlHandler {
		return func(w http.ResponseWriter, r *http.Request) error {
			if _, err := h.running(r, r.PathValue("id")); err != nil {
				return err
			}
			return apiErrorf(http.StatusNotImplemented, "%s is not supported by airlock", what)
		}
	}
	route("POST /sandboxes/{id}/pause", h.pause)
	route("POST /sandboxes/{id}/resume", h.resume)
	route("POST /sandboxes/{id}/fork", h.fork)
	route("POST /sandboxes/{id}/snapshots", h.createSnapshot)
	route("GET /snapshots", h.listSnapshots)
	route("DELETE /templates/{id}", h.deleteTemplate)
	route("POST /v3/templates", h.requestTemplate)
	route("GET /templates/{id}/files/{hash}", h.templateFiles)
	route("POST /v2/templates/{id}/builds/{build}", h.startTemplateBuild)
	route("GET /templates/{id}/builds/{build}/status", h.templateBuildStatus)
	route("GET /templates/aliases/{alias}", h.templateAlias)
	route("POST /volumes", h.createVolume)
	route("GET /volumes", h.listVolumes)
	route("GET /volumes/{id}", h.getVolume)
	route("DELETE /volumes/{id}", h.deleteVolume)
	route("GET /secrets", h.listSecrets)
	route("POST /secrets", h.createSecret)
	route("GET /secrets/{id}", h.getSecret)
	route("POST /secrets/{id}", h.updateSecret)
	route("DELETE /secrets/{id}", h.deleteSecret)
	route("PUT /sandboxes/{id}/network", h.updateNetwork)
	route("GET /sandboxes/{id}/logs", unsupported("reading sandbox logs"))
	route("GET /v2/sandboxes/{id}/logs", unsupported("reading sandbox logs"))
	// Everything else an E2B client may call (templates, volumes, secrets,
	// teams...) is answered in E2B's error format.
	mux.Handle("/", h.authed(func(w http.ResponseWriter, r *http.Request) error {
		return apiErrorf(http.StatusNotImplemented, "%s %s is not part of the E2B API airlock serves (sandboxes only; see docs/e2b.md)", r.Method, r.URL.Path)
	}))
	return mux
}

// authed authenticates the API key and maps a handler's error to JSON.
func (h *Handler) authed(f controlHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := h.authenticate(r)
		if err != nil {
			writeAPIError(w, http.StatusUnauthorized, err.Error())
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), callerKey{}, c))
		if err := f(w, r); err != nil {
			status, msg := controlStatus(err)
			if status >= 500 && status != http.StatusNotImplemented && status != http.StatusServiceUnavailable {
				h.cfg.Logf("e2b: %s %s: %v", r.Method, r.URL.Path, err)
			}
			writeAPIError(w, status, msg)
		}
	})
}

// authenticate checks X-API-KEY (or an Authorization bearer token, which
// E2B also accepts) against airlock's API keys.
func (h *Handler) authenticate(r *http.Request) (caller, error) {
	if h.cfg.NoAuth {
		return caller{}, nil
	}
	secret := r.Header.Get(headerAPIKey)
	if secret == "" {
		if a := r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
			secret = strings.TrimSpace(a[7:])
		}
	}
	if secret == "" {
		return caller{}, errors.New("missing API key: set E2B_API_KEY to an airlock API key (airlock keys create --e2b prints the form E2B SDKs accept)")
	}
	k, err := h.cfg.Store.Authenticate(r.Context(), airlockKey(secret))
	if err != nil {
		return caller{}, errors.New("invalid or revoked API key")
	}
	if h.cfg.NoteKey != nil {
		h.cfg.NoteKey(r, k.ID)
	}
	return caller{id: k.ID, maxSandboxes: k.MaxSandboxes}, nil
}

// controlStatus maps an error to an HTTP status and message.
func controlStatus(err error) (int, string) {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.status, ae.msg
	}
	switch {
	case errors.Is(err, manager.ErrNotFound), errors.Is(err, manager.ErrNotRunning):
		return http.StatusNotFound, "sandbox not found"
	case errors.Is(err, manager.ErrLimit):
		return http.StatusTooManyRequests, err.Error()
	case errors.Is(err, manager.ErrPolicy), errors.Is(err, manager.ErrInvalid):
		return http.StatusBadRequest, err.Error()
	case errors.Is(err, manager.ErrClosed), errors.Is(err, manager.ErrNetwork):
		return http.StatusServiceUnavailable, err.Error()
	}
	return http.StatusInternalServerError, err.Error()
}

// decodeBody decodes an optional JSON body. Unknown fields are ignored:
// newer SDKs add fields, and those that matter are checked explicitly.
func decodeBody(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil {
		return apiErrorf(http.StatusBadRequest, "reading the request: %v", err)
	}
	if len(body) > 1<<20 {
		return apiErrorf(http.StatusRequestEntityTooLarge, "request body larger than 1 MiB")
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return apiErrorf(http.StatusBadRequest, "malformed JSON: %v", err)
	}
	return nil
}

// autoResumeWanted reports whether a create's autoResume asks for
// anything. Older SDKs always send it, as {"enabled": false} (or a bare
// false): that asks for nothing. Anything else asks for a paused sandbox
// to be resumed by traffic to it.
func autoResumeWanted(raw json.RawMessage) bool {
	if !present(raw) {
		return false
	}
	var v struct {
		Enabled *bool `json:"enabled"`
	}
	if err := json.Unmarshal(raw, &v); err == nil {
		return v.Enabled != nil && *v.Enabled
	}
	var b bool
	if err := json.Unmarshal(raw, &b); err == nil {
		return b
	}
	return true
}

// present reports whether an optional JSON value was given.
func present(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s != "" && s != "null" && s != "{}" && s != "[]"
}

// newSandbox is the body of POST /sandboxes and /v2/sandboxes.
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *float64          `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             json.RawMessage   `json:"network"`
	MCP                 json.RawMessage   `json:"mcp"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          json.RawMessage   `json:"autoResume"`
	VolumeMounts        json.RawMessage   `json:"volumeMounts"`
	IAM                 json.RawMessage   `json:"iam"`
}

// sandboxCreated is E2B's Sandbox schema: the answer to create and connect.
type sandboxCreated struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// templateFor maps an E2B template to an airlock profile and, for a
// template that is an image or template of the server's image store, that
// image's name (the sandbox's root). E2B's well-known templates and the
// profile names come first; a name that is none of these is E2B's 404.
// Images are those owner may use (its own and the public ones,
// imagestore.Store.As): another key's template is the same 404.
func (h *Handler) templateFor(owner, template string) (profile, image string, err error) {
	for _, t := range knownTemplates {
		if template == t {
			return h.cfg.Profile, "", nil
		}
	}
	if _, err := policy.Preset(policy.Profile(template)); err == nil && template != "" {
		return template, "", nil
	}
	if st := h.m.Images(); st != nil {
		_, err := st.As(owner).Get(template)
		if err == nil {
			return h.cfg.Profile, template, nil
		}
		if !errors.Is(err, imagestore.ErrNotFound) {
			return "", "", apiErrorf(http.StatusBadRequest, "template %q: %v", template, err)
		}
	}
	return "", "", apiErrorf(http.StatusNotFound, "template '%s' not found: airlock serves the templates base and code-interpreter-v1, its profiles strict, standard and light, and the images and templates of its image store this key may use: its own (POST /v1/templates, POST /v1/images) and the published ones (airlock image publish)", template)
}

// timeoutSeconds converts an E2B timeout in seconds.
func timeoutSeconds(v *float64, def float64) (time.Duration, error) {
	s := def
	if v != nil && *v != 0 {
		s = *v
	}
	if s < 0 || s > 1e7 || math.IsNaN(s) {
		return 0, apiErrorf(http.StatusBadRequest, "timeout must be a positive number of seconds")
	}
	return time.Duration(s * float64(time.Second)), nil
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, defTimeout float64) error {
	var req newSandbox
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.TemplateID == "" {
		req.TemplateID = "base"
	}
	switch {
	case present(req.MCP):
		return apiErrorf(http.StatusBadRequest, "MCP gateways are not supported by airlock")
	case present(req.IAM):
		return apiErrorf(http.StatusBadRequest, "IAM tokens are not supported by airlock")
	}
	network, secrets, err := networkFor(req.AllowInternetAccess, req.Network, false)
	if err != nil {
		return err
	}
	volumes, err := volumeMounts(req.VolumeMounts)
	if err != nil {
		return err
	}
	if err := h.networkAllowed(network); err != nil {
		return err
	}
	for k := range req.Metadata {
		if hiddenKey(k) {
			return apiErrorf(http.StatusBadRequest, "metadata key %q is reserved", k)
		}
	}
	c := callerOf(r.Context())
	secrets, secretNames, err := h.resolveSecrets(c.id, secrets)
	if err != nil {
		return err
	}
	var snap *snapRecord
	profile, image := "", ""
	if h.snaps != nil {
		if rec, ok := h.snaps.find(c.id, req.TemplateID); ok {
			snap = &rec
		}
	}
	if snap == nil {
		var err error
		if profile, image, err = h.templateFor(c.id, req.TemplateID); err != nil {
			return err
		}
	}
	ttl, err := timeoutSeconds(req.Timeout, defTimeout)
	if err != nil {
		return err
	}
	md := make(map[string]string, len(req.Metadata)+1)
	for k, v := range req.Metadata {
		md[k] = v
	}
	md[templateKey] = req.TemplateID
	if req.AutoPause != nil && *req.AutoPause {
		md[manager.OnTimeoutKey] = "pause"
		if req.AutoPauseMemory != nil && !*req.AutoPauseMemory {
			md[manager.PauseMemoryKey] = "false"
		}
	}
	if autoResumeWanted(req.AutoResume) {
		md[autoResumeKey] = "true"
	}
	// E2B code expects its home to be /home/user (a link to the workspace
	// in airlock sandboxes); commands also get PWD (see processStart).
	env := map[string]string{"E2B_SANDBOX": "true", "HOME": E2BHome}
	for k, v := range req.EnvVars {
		env[k] = v
	}
	creq := manager.CreateRequest{Owner: c.id, OwnerLimit: c.maxSandboxes,
		Profile: profile, Image: image, Env: env, Metadata: md, Timeout: ttl, Network: network, Secrets: secrets, Volumes: volumes}
	if snap != nil {
		md[templateKey] = snap.ID
		own := len(req.EnvVars) > 0 || len(secrets) > 0 || present(req.Network) || req.AllowInternetAccess != nil
		info, kind, err := h.createFromSnapshot(r.Context(), *snap, creq, own)
		if err != nil {
			return err
		}
		h.cfg.Logf("e2b: %s created from %s snapshot %s", info.ID, kind, snap.ID)
		writeJSON(w, http.StatusCreated, h.created(info.ID, snap.ID))
		return nil
	}
	info, err := h.m.Create(r.Context(), creq)
	if err != nil {
		return err
	}
	if image != "" {
		if spec, ok := h.startSpecFor(c.id, image); ok {
			sb, err := h.m.Lookup(c.id, info.ID)
			if err == nil {
				err = startTemplate(r.Context(), sb, h.box(sb).homeDir(r.Context()), spec)
			}
			if err != nil {
				if kerr := h.m.Kill(context.WithoutCancel(r.Context()), c.id, info.ID); kerr != nil {
					h.cfg.Logf("e2b: kill of %s after its start command failed: %v", info.ID, kerr)
				}
				return err
			}
		}
	}
	if len(secretNames) > 0 {
		hosts := make([]string, 0, len(secrets))
		for _, s := range secrets {
			hosts = append(hosts, s.Host+" "+s.Header)
		}
		h.m.Audit(r.Context(), c.id, info.ID, "e2b.secret_use", map[string]any{"secrets": secretNames, "headers": hosts})
	}
	writeJSON(w, http.StatusCreated, h.created(info.ID, req.TemplateID))
	return nil
}

func (h *Handler) created(id, template string) sandboxCreated {
	c := sandboxCreated{SandboxID: id, TemplateID: template, Alias: template, ClientID: "airlock",
		EnvdVersion: EnvdVersion, EnvdAccessToken: h.envdToken(id), TrafficAccessToken: h.trafficToken(id)}
	if h.cfg.Domain != "" {
		d := h.cfg.Domain
		c.Domain = &d
	}
	return c
}

// sandboxDetail is E2B's SandboxDetail and ListedSandbox.
type sandboxDetail struct {
	SandboxID    string            `json:"sandboxID"`
	TemplateID   string            `json:"templateID"`
	Alias        string            `json:"alias,omitempty"`
	ClientID     string            `json:"clientID"`
	CPUCount     int               `json:"cpuCount"`
	MemoryMB     int64             `json:"memoryMB"`
	DiskSizeMB   int64             `json:"diskSizeMB"`
	StartedAt    string            `json:"startedAt"`
	EndAt        string            `json:"endAt"`
	EnvdVersion  string            `json:"envdVersion"`
	Metadata     map[string]string `json:"metadata"`
	State        string            `json:"state"`
	VolumeMounts []struct{}        `json:"volumeMounts"`
	Domain       *string           `json:"domain"`
	// AllowInternetAccess and Network are in getInfo only.
	AllowInternetAccess *bool          `json:"allowInternetAccess,omitempty"`
	Network             map[string]any `json:"network,omitempty"`
	Lifecycle           *lifecycle     `json:"lifecycle,omitempty"`
	startedAt           time.Time
}

// lifecycle is E2B's SandboxLifecycle: what the end of the timeout does
// (kill or pause) and whether traffic resumes a paused sandbox.
type lifecycle struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// templateOf returns the E2B template a sandbox was created from, or its
// profile for sandboxes created through airlock's own API.
func templateOf(in *manager.Info) string {
	if t := in.Metadata[templateKey]; t != "" {
		return t
	}
	return in.Profile
}

func detailOf(in *manager.Info) sandboxDetail {
	d := sandboxDetail{SandboxID: in.ID, TemplateID: templateOf(in), ClientID: "airlock",
		StartedAt: in.CreatedAt.UTC().Format(time.RFC3339Nano), EnvdVersion: EnvdVersion,
		Metadata: map[string]string{}, State: "running", VolumeMounts: []struct{}{}, startedAt: in.CreatedAt}
	if in.Paused {
		d.State = "paused"
	}
	d.Alias = d.TemplateID
	if in.ExpiresAt != nil {
		d.EndAt = in.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	for k, v := range in.Metadata {
		if !hiddenKey(k) {
			d.Metadata[k] = v
		}
	}
	if p, err := policy.Preset(policy.Profile(in.Profile)); err == nil {
		d.CPUCount = int(math.Ceil(p.Limits.CPUs))
		d.MemoryMB = p.Limits.MemoryBytes >> 20
		d.DiskSizeMB = p.Limits.DiskBytes >> 20
	}
	return d
}

// running returns the caller's running sandbox id, or a 404.
func (h *Handler) running(r *http.Request, id string) (manager.Info, error) {
	in, err := h.m.Get(r.Context(), callerOf(r.Context()).id, id)
	if err == nil && in.State != "running" {
		err = manager.ErrNotRunning
	}
	if errors.Is(err, manager.ErrNotFound) || errors.Is(err, manager.ErrNotRunning) {
		return in, apiErrorf(http.StatusNotFound, "sandbox %q not found", id)
	}
	return in, err
}

func (h *Handler) getInfo(w http.ResponseWriter, r *http.Request) error {
	in, err := h.running(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	d := detailOf(&in)
	d.Lifecycle = &lifecycle{OnTimeout: "kill", AutoResume: in.Metadata[autoResumeKey] == "true"}
	if in.Metadata[manager.OnTimeoutKey] == "pause" {
		d.Lifecycle.OnTimeout = "pause"
	}
	if ni, err := h.m.Network(r.Context(), callerOf(r.Context()).id, in.ID); err == nil {
		d.AllowInternetAccess, d.Network = networkView(ni)
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := h.m.Kill(r.Context(), callerOf(r.Context()).id, id); err != nil {
		if errors.Is(err, manager.ErrNotFound) || errors.Is(err, manager.ErrNotRunning) {
			return apiErrorf(http.StatusNotFound, "sandbox %q not found", id)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Timeout *float64 `json:"timeout"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.Timeout == nil || *req.Timeout <= 0 {
		return apiErrorf(http.StatusBadRequest, "timeout must be a positive number of seconds")
	}
	d, err := timeoutSeconds(req.Timeout, 0)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if _, err := h.running(r, id); err != nil {
		return err
	}
	if _, err := h.m.SetTimeout(r.Context(), callerOf(r.Context()).id, id, d); err != nil {
		if errors.Is(err, manager.ErrNotFound) || errors.Is(err, manager.ErrNotRunning) {
			return apiErrorf(http.StatusNotFound, "sandbox %q not found", id)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// extend makes a running sandbox live at least d from now; it never
// shortens its life.
func (h *Handler) extend(r *http.Request, in manager.Info, d time.Duration) error {
	if in.ExpiresAt != nil && !in.ExpiresAt.Before(time.Now().Add(d)) {
		return nil
	}
	_, err := h.m.SetTimeout(r.Context(), callerOf(r.Context()).id, in.ID, d)
	if errors.Is(err, manager.ErrNotFound) || errors.Is(err, manager.ErrNotRunning) {
		return apiErrorf(http.StatusNotFound, "sandbox %q not found", in.ID)
	}
	return err
}

func (h *Handler) refresh(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Duration *float64 `json:"duration"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	d, err := timeoutSeconds(req.Duration, 15)
	if err != nil {
		return err
	}
	in, err := h.running(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := h.extend(r, in, d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) connect(w http.ResponseWriter, r *http.Request, v2 bool) error {
	var req struct {
		Timeout *float64 `json:"timeout"`
		Memory  *bool    `json:"memory"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	def := 300.0
	if !v2 && req.Timeout == nil {
		return apiErrorf(http.StatusBadRequest, "timeout is required")
	}
	d, err := timeoutSeconds(req.Timeout, def)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	in, err := h.running(r, id)
	if err != nil {
		return err
	}
	if in.Paused {
		// E2B's connect resumes a paused sandbox and answers 201;
		// onResume: 'reboot' (memory: false) drops its processes.
		return h.resumeFor(w, r, id, d, req.Memory != nil && !*req.Memory)
	}
	if err := h.extend(r, in, d); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, h.created(id, templateOf(&in)))
	return nil
}

// maxMetricSamples bounds the samples kept per sandbox.
const maxMetricSamples = 720

// metricSample is one of E2B's SandboxMetric.
type metricSample struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int     `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	MemCache      int64   `json:"memCache"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

// metricRange parses getMetrics' start and end (Unix seconds, optional).
func metricRange(q url.Values) (start, end int64, err error) {
	start, end = math.MinInt64, math.MaxInt64
	for _, p := range []struct {
		name string
		v    *int64
	}{{"start", &start}, {"end", &end}} {
		if s := q.Get(p.name); s != "" {
			n, perr := strconv.ParseInt(s, 10, 64)
			if perr != nil {
				return 0, 0, apiErrorf(http.StatusBadRequest, "%s must be a Unix time in seconds, not %q", p.name, s)
			}
			*p.v = n
		}
	}
	if start > end {
		return 0, 0, apiErrorf(http.StatusBadRequest, "start is after end")
	}
	return start, end, nil
}

// metrics serves getMetrics. E2B samples every sandbox every few seconds;
// airlock reads the counters when asked: each call takes a sample of now
// and adds it to the sandbox's series (the last 720 are kept), and the
// answer is the series' samples within start..end (Unix seconds). A
// sandbox asked once has one sample.
func (h *Handler) metrics(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	start, end, err := metricRange(r.URL.Query())
	if err != nil {
		return err
	}
	in, err := h.running(r, id)
	if err != nil {
		return err
	}
	sb, err := h.m.Lookup(callerOf(r.Context()).id, id)
	if err != nil {
		return apiErrorf(http.StatusNotFound, "sandbox %q not found", id)
	}
	mt, err := h.m.Metrics(r.Context(), callerOf(r.Context()).id, id)
	if err != nil {
		if errors.Is(err, manager.ErrNotFound) || errors.Is(err, manager.ErrNotRunning) {
			return apiErrorf(http.StatusNotFound, "sandbox %q not found", id)
		}
		return err
	}
	d := detailOf(&in)
	now := time.Now()
	// The CPU use is the average since the sandbox started.
	pct := 0.0
	if el := now.Sub(in.CreatedAt).Seconds(); el > 0 && d.CPUCount > 0 {
		pct = 100 * mt.CPUSeconds / el / float64(d.CPUCount)
	}
	sample := metricSample{Timestamp: now.UTC().Format(time.RFC3339Nano), TimestampUnix: now.Unix(),
		CPUCount: d.CPUCount, CPUUsedPct: pct, MemUsed: mt.MemoryBytes, MemTotal: d.MemoryMB << 20,
		DiskUsed: mt.DiskUsedBytes, DiskTotal: mt.DiskTotalBytes}
	b := h.box(sb)
	b.mu.Lock()
	if len(b.metrics) >= maxMetricSamples {
		b.metrics = append(b.metrics[:0], b.metrics[1:]...)
	}
	b.metrics = append(b.metrics, sample)
	out := make([]metricSample, 0, len(b.metrics))
	for _, m := range b.metrics {
		if m.TimestampUnix >= start && m.TimestampUnix <= end {
			out = append(out, m)
		}
	}
	b.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
	return nil
}

// metadataFilter parses E2B's metadata query: "k=v&k2=v2" with each key
// and value URL-encoded, itself URL-encoded as one parameter.
func metadataFilter(q string) (map[string]string, error) {
	out := map[string]string{}
	if q == "" {
		return out, nil
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return nil, apiErrorf(http.StatusBadRequest, "bad metadata filter: %v", err)
	}
	for k, vs := range vals {
		if len(vs) != 1 {
			return nil, apiErrorf(http.StatusBadRequest, "metadata filter repeats %q", k)
		}
		if uk, err := url.QueryUnescape(k); err == nil {
			k = uk
		}
		v := vs[0]
		if uv, err := url.QueryUnescape(v); err == nil {
			v = uv
		}
		if k == templateKey {
			return nil, apiErrorf(http.StatusBadRequest, "metadata key %q is reserved", templateKey)
		}
		out[k] = v
	}
	return out, nil
}

// pageToken is the opaque cursor of GET /v2/sandboxes.
func pageToken(d *sandboxDetail) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(d.startedAt.UnixNano(), 10) + "/" + d.SandboxID))
}

func parsePageToken(s string) (int64, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		ns, id, ok := strings.Cut(string(b), "/")
		if n, perr := strconv.ParseInt(ns, 10, 64); ok && perr == nil {
			return n, id, nil
		}
	}
	return 0, "", apiErrorf(http.StatusBadRequest, "bad nextToken")
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request, v2 bool) error {
	q := r.URL.Query()
	md, err := metadataFilter(q.Get("metadata"))
	if err != nil {
		return err
	}
	wantRunning, wantPaused := true, true
	if st := q["state"]; len(st) > 0 {
		wantRunning, wantPaused = false, false
		for _, v := range st {
			for _, s := range strings.Split(v, ",") {
				switch s {
				case "running":
					wantRunning = true
				case "paused":
					wantPaused = true
				default:
					return apiErrorf(http.StatusBadRequest, "unknown state %q (want running or paused)", s)
				}
			}
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" && v2 {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return apiErrorf(http.StatusBadRequest, "limit must be between 1 and 1000")
		}
		limit = n
	}
	var after time.Time
	if v := q.Get("startedAfter"); v != "" {
		if after, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return apiErrorf(http.StatusBadRequest, "bad startedAfter %q: want RFC 3339", v)
		}
	}
	desc := true
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		desc = false
	default:
		return apiErrorf(http.StatusBadRequest, "order must be asc or desc")
	}
	var infos []manager.Info
	if wantRunning || wantPaused {
		if infos, err = h.m.List(r.Context(), callerOf(r.Context()).id, manager.ListOptions{Metadata: md}); err != nil {
			return err
		}
	}
	template := q.Get("template")
	all := make([]sandboxDetail, 0, len(infos))
	for i := range infos {
		d := detailOf(&infos[i])
		if (template != "" && d.TemplateID != template) || d.startedAt.Before(after) ||
			(infos[i].Paused && !wantPaused) || (!infos[i].Paused && !wantRunning) {
			continue
		}
		all = append(all, d)
	}
	less := func(a, b *sandboxDetail) bool {
		if a.SandboxID == b.SandboxID {
			return false
		}
		if !a.startedAt.Equal(b.startedAt) {
			return a.startedAt.Before(b.startedAt) != desc
		}
		return (a.SandboxID < b.SandboxID) != desc
	}
	sort.Slice(all, func(i, j int) bool { return less(&all[i], &all[j]) })
	if v2 {
		if tok := q.Get("nextToken"); tok != "" {
			ns, id, err := parsePageToken(tok)
			if err != nil {
				return err
			}
			cur := sandboxDetail{SandboxID: id, startedAt: time.Unix(0, ns)}
			i := sort.Search(len(all), func(i int) bool { return less(&cur, &all[i]) })
			all = all[i:]
		}
		w.Header().Set("X-Total-Running", strconv.Itoa(len(infos)))
		if len(all) > limit {
			all = all[:limit]
			w.Header().Set("X-Next-Token", pageToken(&all[limit-1]))
		}
	}
	writeJSON(w, http.StatusOK, all)
	return nil
}
