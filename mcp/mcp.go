// Package mcp serves airlock's sandboxes as Model Context Protocol tools:
// run_command, run_code, write_file, read_file, list_files,
// create_sandbox, list_sandboxes and kill_sandbox. It sits on the manager like the HTTP API does; every operation
// on a sandbox's files or processes runs inside the sandbox through its
// agent.
//
// # Sessions and the default sandbox
//
// A tool called without a sandbox_id uses the session's default sandbox,
// created on first use and killed when the session ends: when stdin closes
// for stdio, when the client deletes the session or it idles past
// Config.SessionTimeout for streamable HTTP. Each use pushes the default
// sandbox's expiry Config.SandboxTimeout into the future, so it only
// expires when left idle. Sandboxes made with create_sandbox are not tied
// to a session: they live until their timeout or kill_sandbox.
//
// # Results
//
// Output is returned as text content, images (files read, figures of
// run_code) as image content. A failure of the user's code (non-zero exit,
// signal, timeout, exception) is a tool error (isError) carrying its output,
// never a protocol error. Output beyond Config.MaxOutput per stream is cut
// from the middle, with a note saying how much was cut.
package mcp

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
)

// Defaults of Config.
const (
	DefaultSandboxTimeout = 30 * time.Minute
	DefaultCallTimeout    = 60 * time.Second
	DefaultMaxCallTimeout = 10 * time.Minute
	DefaultSessionTimeout = 5 * time.Minute
	DefaultMaxOutput      = 32 << 10
	DefaultMaxReadText    = 128 << 10
	DefaultMaxReadImage   = 5 << 20
	DefaultMaxWrite       = 32 << 20
)

// Config configures a Service.
type Config struct {
	// Manager runs the sandboxes. Required.
	Manager *manager.Manager
	// Version is reported to clients as the server's version.
	Version string
	// Profile is the policy preset of sandboxes created without one
	// (session defaults, create_sandbox without a profile); "" means
	// strict.
	Profile string
	// Limits override the profile's limits for sandboxes created without
	// their own; zero fields keep the profile's.
	Limits manager.Limits
	// Network is the network policy of the sandboxes the tools create;
	// the zero value means none. create_sandbox may narrow it (none, or
	// fewer allowed hosts), never widen it.
	Network policy.Network
	// Secrets are headers the egress proxy adds to requests of every
	// sandbox the tools create (API keys the code must not see).
	Secrets []egress.Secret
	// SandboxTimeout is how long a session's default sandbox may stay
	// idle before it expires, and the TTL of create_sandbox without a
	// timeout; 0 means DefaultSandboxTimeout.
	SandboxTimeout time.Duration
	// CallTimeout bounds one run_command or run_code call that does not
	// ask for its own timeout; 0 means DefaultCallTimeout.
	CallTimeout time.Duration
	// MaxCallTimeout is the largest timeout a call may ask for; 0 means
	// DefaultMaxCallTimeout (or CallTimeout if that is larger).
	MaxCallTimeout time.Duration
	// SessionTimeout closes streamable HTTP sessions idle this long (and
	// so kills their default sandbox); 0 means DefaultSessionTimeout. A
	// client that comes back within it with the same Mcp-Session-Id gets
	// the same session and sandbox.
	SessionTimeout time.Duration
	// MaxOutput caps each of stdout and stderr in a result, in bytes; 0
	// means DefaultMaxOutput.
	MaxOutput int
	// MaxReadText caps the text read_file returns; 0 means
	// DefaultMaxReadText.
	MaxReadText int
	// MaxReadImage is the largest image read_file returns as an image; 0
	// means DefaultMaxReadImage.
	MaxReadImage int
	// MaxWrite caps the content of write_file; 0 means DefaultMaxWrite.
	MaxWrite int
	// Interpreter runs code cells for run_code; nil means
	// AgentInterpreter.
	Interpreter Interpreter
	// Logf logs operational events; log.Printf if nil.
	Logf func(format string, args ...any)
	// Approvals holds tool calls for a human (docs/approvals.md),
	// asking through MCP elicitation when the client supports it; nil
	// lets every call run at once.
	Approvals *approval.Gate
}

// Service is the MCP server over one Manager. One Service serves any
// number of sessions, over stdio, in-memory and HTTP transports.
type Service struct {
	cfg Config
	m   *manager.Manager
	srv *sdk.Server

	mu       sync.Mutex
	sessions map[*sdk.ServerSession]*session
	closed   bool
	wg       sync.WaitGroup
}

// New returns a Service with its tools registered.
func New(cfg Config) (*Service, error) {
	if cfg.Manager == nil {
		return nil, errors.New("mcp: Manager is required")
	}
	if cfg.SandboxTimeout <= 0 {
		cfg.SandboxTimeout = DefaultSandboxTimeout
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.MaxCallTimeout <= 0 {
		cfg.MaxCallTimeout = max(DefaultMaxCallTimeout, cfg.CallTimeout)
	}
	if cfg.CallTimeout > cfg.MaxCallTimeout {
		return nil, fmt.Errorf("mcp: call timeout %s above the maximum %s", cfg.CallTimeout, cfg.MaxCallTimeout)
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = DefaultMaxOutput
	}
	if cfg.MaxReadText <= 0 {
		cfg.MaxReadText = DefaultMaxReadText
	}
	if cfg.MaxReadImage <= 0 {
		cfg.MaxReadImage = DefaultMaxReadImage
	}
	if cfg.MaxWrite <= 0 {
		cfg.MaxWrite = DefaultMaxWrite
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	if cfg.Network.Mode == "" {
		cfg.Network.Mode = policy.NetNone
	}
	if err := (egress.Policy{Mode: string(cfg.Network.Mode), Allow: cfg.Network.Allow, Deny: cfg.Network.Deny}).Validate(); err != nil {
		return nil, fmt.Errorf("mcp: network policy: %w", err)
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Interpreter == nil {
		cfg.Interpreter = AgentInterpreter{}
	}
	s := &Service{cfg: cfg, m: cfg.Manager, sessions: map[*sdk.ServerSession]*session{}}
	s.srv = sdk.NewServer(&sdk.Implementation{Name: "airlock", Title: "airlock sandbox", Version: cfg.Version},
		&sdk.ServerOptions{Instructions: s.instructions(), Capabilities: &sdk.ServerCapabilities{}})
	s.addTools()
	if cfg.Approvals != nil {
		s.srv.AddReceivingMiddleware(s.approvalMiddleware)
	}
	return s, nil
}

// Server returns the underlying MCP server, e.g. to Run it on a transport.
func (s *Service) Server() *sdk.Server { return s.srv }

// Run serves one session on t (e.g. &sdk.StdioTransport{}) until the client
// disconnects or ctx ends, then kills the session's default sandbox.
func (s *Service) Run(ctx context.Context, t sdk.Transport) error {
	err := s.srv.Run(ctx, dropCancelled{t})
	s.wg.Wait()
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// Close ends every session's default sandbox and refuses new sessions'
// tool calls. It does not close the Manager.
func (s *Service) Close() error {
	s.mu.Lock()
	s.closed = true
	all := make([]*session, 0, len(s.sessions))
	for _, se := range s.sessions {
		all = append(all, se)
	}
	s.mu.Unlock()
	for _, se := range all {
		s.endSession(se)
	}
	s.wg.Wait()
	return nil
}

func (s *Service) instructions() string {
	return `airlock runs code in isolated, disposable Linux sandboxes (namespaces, seccomp, Landlock, cgroup limits) on this machine.
Use run_command for shell commands, write_file/read_file/list_files for files (the working directory is /workspace; /tmp is writable too), run_code for stateful Python/JavaScript/bash cells (variables persist between calls; matplotlib figures come back as images).
Without sandbox_id, all tools of this session share one sandbox, created on first use and destroyed when the session ends; files persist between calls until then.
Sandboxes have a fixed memory/CPU/process budget and only the host's tools (python3, sh, coreutils...). ` + s.networkText() + `
A non-zero exit, a timeout or an exception is reported as a tool error carrying the output.`
}

// session is one MCP session's state.
type session struct {
	ss *sdk.ServerSession

	mu         sync.Mutex
	owner      string
	ownerLimit int
	defaultID  string
	ended      bool
}

// caller is who a tool call acts for.
func callerOf(req *sdk.CallToolRequest) Caller {
	var c Caller
	if req == nil || req.Extra == nil || req.Extra.TokenInfo == nil {
		return c
	}
	c.Owner = req.Extra.TokenInfo.UserID
	if n, ok := req.Extra.TokenInfo.Extra[maxSandboxesKey].(int); ok {
		c.MaxSandboxes = n
	}
	return c
}

// sessionOf returns the session of a call, registering it (and a watcher
// that ends it when the client goes away) on first sight.
func (s *Service) sessionOf(req *sdk.CallToolRequest) (*session, error) {
	ss := req.Session
	if ss == nil {
		return nil, errors.New("no MCP session")
	}
	c := callerOf(req)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("the airlock MCP server is shutting down")
	}
	se := s.sessions[ss]
	if se == nil {
		se = &session{ss: ss, owner: c.Owner, ownerLimit: c.MaxSandboxes}
		s.sessions[ss] = se
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			ss.Wait()
			s.endSession(se)
		}()
	}
	if se.owner != c.Owner {
		// The transport binds sessions to their user; this is a second
		// line of defence.
		return nil, errors.New("this MCP session belongs to another API key")
	}
	return se, nil
}

// endSession kills the session's default sandbox and forgets it.
func (s *Service) endSession(se *session) {
	se.mu.Lock()
	id := se.defaultID
	se.ended, se.defaultID = true, ""
	se.mu.Unlock()
	if id != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := s.m.Kill(ctx, se.owner, id)
		cancel()
		if err != nil && !errors.Is(err, manager.ErrNotRunning) && !errors.Is(err, manager.ErrNotFound) {
			s.cfg.Logf("mcp: kill default sandbox %s: %v", id, err)
		}
	}
	s.mu.Lock()
	if s.sessions[se.ss] == se {
		delete(s.sessions, se.ss)
	}
	s.mu.Unlock()
}

// userError is a failure to report to the model as a tool error, with a
// message written for it.
type userError struct{ msg string }

func (e *userError) Error() string { return e.msg }

func userErr(format string, args ...any) error {
	return &userError{msg: fmt.Sprintf(format, args...)}
}

// sandbox returns the sandbox a call addresses: the named one, or the
// session's default (created if needed). note tells the model about a
// replaced default sandbox.
func (s *Service) sandbox(ctx context.Context, req *sdk.CallToolRequest, id string) (sb *manager.Sandbox, note string, err error) {
	se, err := s.sessionOf(req)
	if err != nil {
		return nil, "", err
	}
	if id != "" {
		sb, err := s.m.Lookup(se.owner, id)
		if err != nil {
			return nil, "", s.lookupError(ctx, se.owner, id, err)
		}
		return sb, "", nil
	}
	se.mu.Lock()
	defer se.mu.Unlock()
	if se.ended {
		return nil, "", errors.New("this MCP session has ended")
	}
	if se.defaultID != "" {
		sb, err := s.m.Lookup(se.owner, se.defaultID)
		if err == nil && sb.Agent().Err() != nil {
			// The agent is gone but the manager may not have noticed
			// yet: give it a moment to record why.
			select {
			case <-sb.Ended():
			case <-time.After(time.Second):
			}
			err = manager.ErrNotRunning
		}
		if err == nil && s.touch(ctx, se.owner, sb.ID) == nil {
			return sb, "", nil
		}
		info, gerr := s.m.Get(ctx, se.owner, se.defaultID)
		why := "it is gone"
		if gerr == nil && info.EndReason != "" {
			why = info.EndReason
		}
		note = fmt.Sprintf("Note: this session's previous sandbox %s ended (%s); this call runs in a fresh sandbox, so files and state from before are gone.", se.defaultID, why)
		se.defaultID = ""
	}
	info, err := s.m.Create(ctx, manager.CreateRequest{Owner: se.owner, OwnerLimit: se.ownerLimit,
		Profile: s.cfg.Profile, Limits: s.cfg.Limits, Timeout: s.cfg.SandboxTimeout,
		Network: s.cfg.Network, Secrets: s.cfg.Secrets,
		Metadata: map[string]string{"created_by": "mcp", "mcp_role": "session-default"}})
	if err != nil {
		return nil, "", s.createError(err)
	}
	se.defaultID = info.ID
	sb, err = s.m.Lookup(se.owner, info.ID)
	if err != nil {
		return nil, "", fmt.Errorf("the new sandbox %s ended at once: %w", info.ID, err)
	}
	return sb, note, nil
}

// touch makes an idle sandbox's expiry SandboxTimeout from now. It only
// writes when less than half of that is left, so that a busy session does
// not turn every call into a store write and an audit event.
func (s *Service) touch(ctx context.Context, owner, id string) error {
	info, err := s.m.Get(ctx, owner, id)
	if err != nil {
		return err
	}
	if info.ExpiresAt != nil && time.Until(*info.ExpiresAt) > s.cfg.SandboxTimeout/2 {
		return nil
	}
	_, err = s.m.SetTimeout(ctx, owner, id, s.cfg.SandboxTimeout)
	return err
}

func (s *Service) lookupError(ctx context.Context, owner, id string, err error) error {
	if errors.Is(err, manager.ErrNotRunning) {
		why := ""
		if info, gerr := s.m.Get(ctx, owner, id); gerr == nil && info.EndReason != "" {
			why = " (" + info.EndReason + ")"
		}
		return userErr("sandbox %s has ended%s; omit sandbox_id to use this session's sandbox, or create_sandbox for a new one", id, why)
	}
	return userErr("no running sandbox %q; list_sandboxes shows yours, and omitting sandbox_id uses this session's sandbox", id)
}

func (s *Service) createError(err error) error {
	switch {
	case errors.Is(err, manager.ErrLimit):
		return userErr("cannot create a sandbox: %v; kill_sandbox one you no longer need", err)
	case errors.Is(err, manager.ErrPolicy), errors.Is(err, manager.ErrInvalid):
		return userErr("cannot create a sandbox: %v", err)
	case errors.Is(err, manager.ErrClosed):
		return userErr("cannot create a sandbox: the server is shutting down")
	}
	return fmt.Errorf("cannot create a sandbox: %w", err)
}

// networkText tells the model what network the sandboxes have.
func (s *Service) networkText() string {
	n := s.cfg.Network
	var b strings.Builder
	switch n.Mode {
	case policy.NetAllowlist:
		fmt.Fprintf(&b, "Network: only these destinations are reachable, through an HTTP/SOCKS proxy that HTTP_PROXY, HTTPS_PROXY and ALL_PROXY point to (pip, curl, requests, urllib use it; raw sockets and DNS do not work): %s", strings.Join(n.Allow, ", "))
	case policy.NetOpen:
		b.WriteString("Network: public destinations are reachable through an HTTP/SOCKS proxy that HTTP_PROXY, HTTPS_PROXY and ALL_PROXY point to (pip, curl, requests, urllib use it; raw sockets and DNS do not work); private and local addresses are not")
	default:
		return "There is no network access: nothing can be downloaded or installed."
	}
	if len(n.Deny) > 0 {
		fmt.Fprintf(&b, "; never: %s", strings.Join(n.Deny, ", "))
	}
	b.WriteString(". A refused connection gets HTTP 403 from the proxy, whose status line and body say why (\"airlock: ...\"); for HTTPS, curl prints only the code, curl -v shows the reason.")
	return b.String()
}
