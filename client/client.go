// Package client is the Go SDK for airlock's HTTP API (api/openapi.yaml).
//
//	c, err := client.FromEnv() // $AIRLOCK_URL, $AIRLOCK_API_KEY; or client.New(url, key)
//	sb, _ := c.Create(ctx, client.CreateRequest{TTL: 10 * time.Minute})
//	res, _ := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "echo hi", TimeLimit: time.Minute})
//
// Every duration is a time.Duration (TTL, TimeLimit, CodeRequest.Timeout,
// SetTimeout); the float seconds fields Timeout of CreateRequest and
// ExecRequest remain for older callers (prefer the durations).
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Error is an API error response.
type Error struct {
	// Status is the HTTP status code.
	Status int
	// Code is the machine-readable error code, e.g. "not_found".
	Code string
	// Message explains the error.
	Message string
}

// Error implements error.
func (e *Error) Error() string {
	return fmt.Sprintf("airlock: %d %s: %s", e.Status, e.Code, e.Message)
}

// StatusOf returns the HTTP status of an *Error in err's chain, or 0.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// Client talks to one airlock server. It is safe for concurrent use.
type Client struct {
	base  string
	token string
	// HTTP is the underlying client; replace it to tune transports.
	HTTP *http.Client
}

// New returns a client for the server at baseURL authenticating with token
// (empty for a --no-auth server).
func New(baseURL, token string) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	return &Client{base: strings.TrimRight(baseURL, "/"), token: token, HTTP: &http.Client{Transport: tr}}
}

// Layer is one isolation mechanism and its state.
type Layer struct {
	Name   string `json:"name"`
	State  string `json:"state"`
	Detail string `json:"detail,omitempty"`
}

// Limits are resource overrides for a new sandbox; zero keeps the preset.
type Limits struct {
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	CPUs        float64 `json:"cpus,omitempty"`
	Pids        int64   `json:"pids,omitempty"`
	DiskBytes   int64   `json:"disk_bytes,omitempty"`
}

// CreateRequest describes a sandbox to create.
type CreateRequest struct {
	Profile  string            `json:"profile,omitempty"`
	Limits   *Limits           `json:"limits,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// TTL is how long the sandbox lives before it is killed; 0 means the
	// server's default.
	TTL time.Duration `json:"-"`
	// Timeout is the TTL in seconds, the form older callers use; prefer
	// TTL. Setting both to different values is an error.
	Timeout float64 `json:"timeout,omitempty"`
	// Network is the network policy; nil means mode none.
	Network *Network `json:"network,omitempty"`
	// Secrets are headers the egress proxy injects (see Secret).
	Secrets []Secret `json:"secrets,omitempty"`
	// Runtime is the isolation tier, native or gvisor; "" means the
	// server's default.
	Runtime string `json:"runtime,omitempty"`
	// Image makes the root from an image of the server's store
	// (writable, on disk); "" means the host-derived root.
	Image string `json:"image,omitempty"`
	// User "root" runs an image sandbox as uid 0 of its own user namespace
	// with the capabilities package managers need there; "" means the
	// image's user.
	User string `json:"user,omitempty"`
	// Volumes mounts named volumes read-write: [{"name", "path"}].
	Volumes []VolumeRef `json:"volumes,omitempty"`
	// Snapshot forks a gvisor sandbox from one of its snapshots
	// (Client.MemorySnapshot).
	Snapshot string `json:"snapshot,omitempty"`
}

// VolumeRef puts a named volume in a sandbox at Path.
type VolumeRef struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// Sandbox describes a sandbox.
type Sandbox struct {
	ID         string            `json:"id"`
	State      string            `json:"state"`
	Profile    string            `json:"profile"`
	Metadata   map[string]string `json:"metadata"`
	CreatedAt  time.Time         `json:"created_at"`
	ExpiresAt  *time.Time        `json:"expires_at,omitempty"`
	EndedAt    *time.Time        `json:"ended_at,omitempty"`
	EndReason  string            `json:"end_reason,omitempty"`
	Reattached bool              `json:"reattached,omitempty"`
	Enforced   []Layer           `json:"enforced,omitempty"`
	// Runtime is the isolation tier the sandbox runs under.
	Runtime string `json:"runtime,omitempty"`
	// Paused is set while the sandbox is frozen (Pause).
	Paused bool `json:"paused,omitempty"`
}

// ExecRequest describes a process to run.
type ExecRequest struct {
	Argv       []string          `json:"argv,omitempty"`
	Shell      string            `json:"shell,omitempty"`
	Cwd        string            `json:"cwd,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Stdin      string            `json:"stdin,omitempty"`
	StdinOpen  bool              `json:"stdin_open,omitempty"`
	Tag        string            `json:"tag,omitempty"`
	Background bool              `json:"background,omitempty"`
	// TimeLimit kills a foreground process (and its group) after this
	// long; 0 means the server's default (60 s).
	TimeLimit time.Duration `json:"-"`
	// Timeout is TimeLimit in seconds, the form older callers use; prefer
	// TimeLimit. Setting both to different values is an error.
	Timeout   float64 `json:"timeout,omitempty"`
	MaxOutput int     `json:"max_output,omitempty"`
}

// MarshalJSON sends TTL as the API's seconds.
func (r CreateRequest) MarshalJSON() ([]byte, error) {
	type plain CreateRequest
	p := plain(r)
	s, err := wireSeconds("TTL", r.TTL, r.Timeout)
	if err != nil {
		return nil, err
	}
	p.Timeout = s
	return json.Marshal(p)
}

// MarshalJSON sends TimeLimit as the API's seconds; stdin that is not
// UTF-8 is refused (JSON would carry it altered).
func (r ExecRequest) MarshalJSON() ([]byte, error) {
	if !utf8.ValidString(r.Stdin) {
		return nil, errStdinNotText
	}
	type plain ExecRequest
	p := plain(r)
	s, err := wireSeconds("TimeLimit", r.TimeLimit, r.Timeout)
	if err != nil {
		return nil, err
	}
	p.Timeout = s
	return json.Marshal(p)
}

// wireSeconds is the seconds the API takes for a duration field d and
// its deprecated seconds twin secs. A duration under a millisecond is
// refused: it is a count of seconds given as a time.Duration
// (Timeout: 60 instead of 60*time.Second), which would otherwise be 60 ns.
func wireSeconds(field string, d time.Duration, secs float64) (float64, error) {
	switch {
	case d < 0 || secs < 0:
		return 0, fmt.Errorf("airlock: %s %v: not negative", field, d)
	case d > 0 && d < time.Millisecond:
		return 0, fmt.Errorf("airlock: %s %v is under a millisecond: a time.Duration, e.g. %d*time.Second", field, d, int64(d))
	case d > 0 && secs != 0 && secs != d.Seconds():
		return 0, fmt.Errorf("airlock: %s %v and the deprecated seconds field %gs differ: set one", field, d, secs)
	case d > 0:
		return d.Seconds(), nil
	}
	return secs, nil
}

// ExecResult is the outcome of a foreground process.
type ExecResult struct {
	Pid        int     `json:"pid"`
	ExitCode   int     `json:"exit_code"`
	Signal     string  `json:"signal,omitempty"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	Truncated  bool    `json:"truncated"`
	Status     string  `json:"status"`
	DurationMS float64 `json:"duration_ms"`
}

// Process describes a process known to a sandbox's agent.
type Process struct {
	Pid        int       `json:"pid"`
	Argv       []string  `json:"argv"`
	Tag        string    `json:"tag,omitempty"`
	Cwd        string    `json:"cwd,omitempty"`
	Background bool      `json:"background,omitempty"`
	Running    bool      `json:"running"`
	ExitCode   int       `json:"exit_code"`
	Signal     string    `json:"signal,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	ExitedAt   time.Time `json:"exited_at,omitzero"`
}

// FileInfo describes a path inside a sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Type    string    `json:"type"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"`
	ModTime time.Time `json:"mtime"`
	Target  string    `json:"target,omitempty"`
}

// Metrics is a sandbox's resource use now.
type Metrics struct {
	CPUSeconds      float64 `json:"cpu_seconds"`
	MemoryBytes     int64   `json:"memory_bytes"`
	PeakMemoryBytes int64   `json:"peak_memory_bytes"`
	Pids            int64   `json:"pids"`
	OOMKills        int64   `json:"oom_kills"`
	DiskUsedBytes   int64   `json:"disk_used_bytes"`
	DiskTotalBytes  int64   `json:"disk_total_bytes"`
}

// Info describes the server.
type Info struct {
	Version string `json:"version"`
	// Commit and BuildDate are the VCS revision the server was built from
	// and that commit's time ("" when its build carries neither).
	Commit    string   `json:"commit,omitempty"`
	BuildDate string   `json:"build_date,omitempty"`
	Runtimes  []string `json:"runtimes"`
	Enforced  []Layer  `json:"enforced"`
	Auth      bool     `json:"auth"`
	// PoolIdle is how many ready sandboxes the warm pool holds.
	PoolIdle int `json:"pool_idle"`
	// PoolReserve is, with the Kubernetes backend, how many sandboxes of
	// each pooled profile the server keeps claimed and enrolled
	// (serve --pool-reserve).
	PoolReserve int `json:"pool_reserve"`
	// DefaultRuntime is the runtime of a create without one.
	DefaultRuntime string `json:"default_runtime"`
	// RuntimeCapabilities says what each runtime can do beyond exec and
	// files; a request for what its runtime lacks is refused with 422.
	RuntimeCapabilities map[string]RuntimeCaps `json:"runtime_capabilities,omitempty"`
}

// RuntimeCaps is what one runtime can do (GET /v1/info).
type RuntimeCaps struct {
	ImageRoots bool `json:"image_roots"`
	Volumes    bool `json:"volumes"`
	// HostDirs: writable host directories (airlock run --mount).
	HostDirs       bool   `json:"host_dirs"`
	Pause          string `json:"pause,omitempty"` // "freeze", "checkpoint", or "" (cannot pause)
	MemorySnapshot bool   `json:"memory_snapshot"`
	// SnapshotEnvironments: memory snapshots of sandboxes with an image
	// root too.
	SnapshotEnvironments bool `json:"memory_snapshot_environments"`
	// SnapshotVolumes: memory snapshots of sandboxes with volumes or host
	// directories too.
	SnapshotVolumes bool `json:"memory_snapshot_volumes"`
	Network         bool `json:"network"`
	ForkWithNetwork bool `json:"fork_with_network"`
	AttachNetwork   bool `json:"attach_network"`
	AdoptRunning    bool `json:"adopt_running"`
	Pooled          bool `json:"pooled"`
}

// Has reports whether the runtime has the capability named as in its JSON
// form ("image_roots", "pause", ...).
func (c RuntimeCaps) Has(name string) bool {
	b, _ := json.Marshal(c)
	var m map[string]any
	json.Unmarshal(b, &m)
	v := m[name]
	return v == true || (v != nil && v != false && v != "")
}

// newRequest builds a request to path (with query) and a JSON or raw body.
func (c *Client) newRequest(ctx context.Context, method, path string, q url.Values, body io.Reader) (*http.Request, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("airlock: build request: %w", err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// do sends a request and returns the response if it is 2xx, an *Error
// otherwise.
func (c *Client) do(req *http.Request) (*http.Response, error) {
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("airlock: %s %s: %w", req.Method, req.URL.Path, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	return nil, errorOf(resp)
}

// errorOf reads an API error response into an *Error.
func errorOf(resp *http.Response) *Error {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var env struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	e := &Error{Status: resp.StatusCode}
	if json.Unmarshal(b, &env) == nil && env.Error.Code != "" {
		e.Code, e.Message = env.Error.Code, env.Error.Message
	} else {
		e.Code, e.Message = "http_error", strings.TrimSpace(string(b))
	}
	return e
}

// call sends in as JSON (if not nil) and decodes the response into out
// (if not nil).
func (c *Client) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("airlock: encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := c.newRequest(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("airlock: decode %s %s response: %w", method, path, err)
	}
	return nil
}

func sbPath(id string, rest ...string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + strings.Join(rest, "")
}

// Info describes the server and the isolation it enforces.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	var out Info
	return &out, c.call(ctx, "GET", "/v1/info", nil, nil, &out)
}

// Create creates a sandbox.
func (c *Client) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	var out Sandbox
	return &out, c.call(ctx, "POST", "/v1/sandboxes", nil, req, &out)
}

// Get describes a sandbox.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	var out Sandbox
	return &out, c.call(ctx, "GET", sbPath(id), nil, nil, &out)
}

// List lists the caller's sandboxes having all of the metadata labels;
// states filters by state (default: running only).
func (c *Client) List(ctx context.Context, metadata map[string]string, states ...string) ([]Sandbox, error) {
	q := url.Values{}
	for k, v := range metadata {
		q.Set("metadata."+k, v)
	}
	if len(states) > 0 {
		q.Set("state", strings.Join(states, ","))
	}
	// Follow the pages to the end.
	var all []Sandbox
	for {
		var out struct {
			Sandboxes []Sandbox `json:"sandboxes"`
			Next      string    `json:"next"`
		}
		if err := c.call(ctx, "GET", "/v1/sandboxes", q, nil, &out); err != nil {
			return all, err
		}
		all = append(all, out.Sandboxes...)
		if out.Next == "" || len(out.Sandboxes) == 0 {
			return all, nil
		}
		q.Set("after", out.Next)
	}
}

// Kill kills a sandbox.
func (c *Client) Kill(ctx context.Context, id string) error {
	return c.call(ctx, "DELETE", sbPath(id), nil, nil, nil)
}

// SetTimeout makes the sandbox expire d from now.
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) (*Sandbox, error) {
	var out Sandbox
	return &out, c.call(ctx, "POST", sbPath(id, "/timeout"), nil, map[string]float64{"timeout": d.Seconds()}, &out)
}

// Metrics reads a sandbox's resource use.
func (c *Client) Metrics(ctx context.Context, id string) (*Metrics, error) {
	var out Metrics
	return &out, c.call(ctx, "GET", sbPath(id, "/metrics"), nil, nil, &out)
}

// Exec runs a process to completion and returns its result.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest) (*ExecResult, error) {
	req.Background = false
	var out ExecResult
	return &out, c.call(ctx, "POST", sbPath(id, "/exec"), nil, req, &out)
}

// Start starts a background process and returns its pid at once.
func (c *Client) Start(ctx context.Context, id string, req ExecRequest) (int, error) {
	req.Background = true
	var out struct {
		Pid int `json:"pid"`
	}
	return out.Pid, c.call(ctx, "POST", sbPath(id, "/exec"), nil, req, &out)
}

// Event is one Server-Sent Event of a process stream.
type Event struct {
	// Type is "start", "stdout", "stderr", "exit" or "error".
	Type string
	// Data is the output of stdout/stderr events.
	Data []byte
	// Pid is set on start events.
	Pid int
	// ExitCode, Signal and Status are set on exit events.
	ExitCode int
	Signal   string
	Status   string
}

// Stream is a process's event stream.
type Stream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
	// queued are the events of a server that answered with a whole
	// result instead of a stream (a command that never started: not
	// found, not executable).
	queued []Event
}

// Next returns the next event, or io.EOF after the last.
func (s *Stream) Next() (Event, error) {
	if s.sc == nil {
		if len(s.queued) == 0 {
			return Event{}, io.EOF
		}
		ev := s.queued[0]
		s.queued = s.queued[1:]
		return ev, nil
	}
	var typ string
	var data []byte
	for s.sc.Scan() {
		line := s.sc.Text()
		switch {
		case line == "":
			if typ == "" {
				continue
			}
			return parseEvent(typ, data)
		case strings.HasPrefix(line, "event: "):
			typ = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			data = append(data, line[len("data: "):]...)
		}
	}
	if err := s.sc.Err(); err != nil {
		return Event{}, fmt.Errorf("airlock: read event stream: %w", err)
	}
	return Event{}, io.EOF
}

func parseEvent(typ string, data []byte) (Event, error) {
	var raw struct {
		Data     string `json:"data"`
		DataB64  string `json:"data_b64"`
		Pid      int    `json:"pid"`
		ExitCode int    `json:"exit_code"`
		Signal   string `json:"signal"`
		Status   string `json:"status"`
		Message  string `json:"message"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return Event{}, fmt.Errorf("airlock: bad %s event: %w", typ, err)
	}
	ev := Event{Type: typ, Pid: raw.Pid, ExitCode: raw.ExitCode, Signal: raw.Signal, Status: raw.Status}
	switch {
	case raw.DataB64 != "":
		b, err := base64.StdEncoding.DecodeString(raw.DataB64)
		if err != nil {
			return Event{}, fmt.Errorf("airlock: bad %s event: %w", typ, err)
		}
		ev.Data = b
	case raw.Data != "":
		ev.Data = []byte(raw.Data)
	case raw.Message != "":
		ev.Data = []byte(raw.Message)
	}
	return ev, nil
}

// Close ends the stream (a foreground exec's process is then killed; an
// attached process only detaches).
func (s *Stream) Close() error { return s.body.Close() }

func (c *Client) stream(ctx context.Context, method, path string, in any) (*Stream, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("airlock: encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := c.newRequest(ctx, method, path, nil, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return resultStream(resp.Body, path)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	return &Stream{body: resp.Body, sc: sc}, nil
}

// resultStream turns a whole ExecResult (the answer for a command that
// could not start) into the events a stream would have carried.
func resultStream(body io.ReadCloser, path string) (*Stream, error) {
	defer body.Close()
	var res ExecResult
	if err := json.NewDecoder(io.LimitReader(body, 64<<20)).Decode(&res); err != nil {
		return nil, fmt.Errorf("airlock: decode %s result: %w", path, err)
	}
	s := &Stream{body: io.NopCloser(strings.NewReader(""))}
	if res.Stdout != "" {
		s.queued = append(s.queued, Event{Type: "stdout", Data: []byte(res.Stdout)})
	}
	if res.Stderr != "" {
		s.queued = append(s.queued, Event{Type: "stderr", Data: []byte(res.Stderr)})
	}
	s.queued = append(s.queued, Event{Type: "exit", Pid: res.Pid, ExitCode: res.ExitCode, Signal: res.Signal, Status: res.Status})
	return s, nil
}

// ExecStream runs a process and streams its events.
func (c *Client) ExecStream(ctx context.Context, id string, req ExecRequest) (*Stream, error) {
	req.Background = false
	return c.stream(ctx, "POST", sbPath(id, "/exec"), req)
}

// Attach streams a running (or recently exited background) process's
// buffered and live output and its exit.
func (c *Client) Attach(ctx context.Context, id string, pid int) (*Stream, error) {
	return c.stream(ctx, "GET", sbPath(id, "/processes/", strconv.Itoa(pid), "/events"), nil)
}

// Processes lists the processes of a sandbox.
func (c *Client) Processes(ctx context.Context, id string) ([]Process, error) {
	var out struct {
		Processes []Process `json:"processes"`
	}
	return out.Processes, c.call(ctx, "GET", sbPath(id, "/processes"), nil, nil, &out)
}

// errStdinNotText refuses stdin the API's JSON cannot carry unaltered.
var errStdinNotText = errors.New("airlock: stdin is not UTF-8 text: the API carries stdin as text (write bytes with WriteFile)")

// WriteStdin writes to a process's stdin, closing it after if close. The
// API carries text: data that is not UTF-8 is refused, never altered.
func (c *Client) WriteStdin(ctx context.Context, id string, pid int, data string, close bool) error {
	if !utf8.ValidString(data) {
		return errStdinNotText
	}
	return c.call(ctx, "POST", sbPath(id, "/processes/", strconv.Itoa(pid), "/stdin"), nil,
		map[string]any{"data": data, "close": close}, nil)
}

// Signal sends a signal ("TERM", "KILL", ...) to a process's group.
func (c *Client) Signal(ctx context.Context, id string, pid int, sig string) error {
	return c.call(ctx, "POST", sbPath(id, "/processes/", strconv.Itoa(pid), "/signal"), nil,
		map[string]string{"signal": sig}, nil)
}

// KillProcesses kills every workload process of the sandbox (its
// descendants and code-context interpreters too) without ending the
// sandbox, and returns how many were killed.
func (c *Client) KillProcesses(ctx context.Context, id string) (int, error) {
	var out struct {
		Killed int `json:"killed"`
	}
	err := c.call(ctx, "POST", sbPath(id, "/kill-processes"), nil, struct{}{}, &out)
	return out.Killed, err
}

// ReadFile reads a file from the sandbox.
func (c *Client) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	req, err := c.newRequest(ctx, "GET", sbPath(id, "/files"), url.Values{"path": {path}}, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("airlock: read %s: %w", path, err)
	}
	return b, nil
}

// WriteFile writes r to a file in the sandbox (mode 0 keeps the default),
// streaming it, and returns the bytes written.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, mode uint32) (int64, error) {
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode), 8))
	}
	req, err := c.newRequest(ctx, "PUT", sbPath(id, "/files"), q, r)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		Bytes int64 `json:"bytes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("airlock: decode write response: %w", err)
	}
	return out.Bytes, nil
}

// Remove removes a file or directory tree.
func (c *Client) Remove(ctx context.Context, id, path string) error {
	return c.call(ctx, "DELETE", sbPath(id, "/files"), url.Values{"path": {path}}, nil, nil)
}

// ListFiles lists a directory tree depth levels deep (0 means 1).
func (c *Client) ListFiles(ctx context.Context, id, path string, depth int) ([]FileInfo, error) {
	q := url.Values{"path": {path}}
	if depth > 0 {
		q.Set("depth", strconv.Itoa(depth))
	}
	var out struct {
		Entries []FileInfo `json:"entries"`
	}
	return out.Entries, c.call(ctx, "GET", sbPath(id, "/files/list"), q, nil, &out)
}

// Stat describes a path without following a final symlink.
func (c *Client) Stat(ctx context.Context, id, path string) (*FileInfo, error) {
	var out FileInfo
	return &out, c.call(ctx, "GET", sbPath(id, "/files/stat"), url.Values{"path": {path}}, nil, &out)
}

// Mkdir creates a directory and its parents.
func (c *Client) Mkdir(ctx context.Context, id, path string) error {
	return c.call(ctx, "POST", sbPath(id, "/files/mkdir"), nil, map[string]string{"path": path}, nil)
}

// Move renames a path.
func (c *Client) Move(ctx context.Context, id, from, to string) error {
	return c.call(ctx, "POST", sbPath(id, "/files/move"), nil, map[string]string{"from": from, "to": to}, nil)
}
