package e2b

import (
	"context"
	"errors"
	"net/http"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/store"
)

// envd's process.Process service over the agent. Every process started
// through it runs in the agent's background mode, so that, as with envd,
// it survives the stream that started it (the SDK's disconnect, a dropped
// connection); the Connect-Timeout-Ms of Start, when given, kills it.

// Keepalive bounds. The SDKs ask for pings with Keepalive-Ping-Interval
// (seconds).
const (
	defaultKeepalive = 50 * time.Second
	minKeepalive     = time.Second
	maxKeepalive     = 10 * time.Minute
)

func keepaliveInterval(h http.Header) time.Duration {
	if v, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && v > 0 {
		return min(max(time.Duration(v)*time.Second, minKeepalive), maxKeepalive)
	}
	return defaultKeepalive
}

// eproc is a process followed on behalf of E2B clients: one goroutine reads
// its output from the agent and hands each event to every connected
// stream. With no stream connected the output is dropped, as envd does;
// a slow stream slows the process down (back-pressure) instead of
// buffering without bound.
type eproc struct {
	b    *boxState
	pid  int
	tag  *string
	cfg  processConfig
	proc *agent.Process
	pty  bool // runs on a terminal: its output is pty data

	mu    sync.Mutex
	subs  map[*subscriber]struct{}
	done  chan struct{}
	end   *endEvent // set before done is closed, unless fail is
	fail  *Error
	timer *time.Timer
}

// subscriber is one stream following an eproc.
type subscriber struct {
	ch   chan *processEvent
	gone chan struct{}
	once sync.Once
}

func newEproc(b *boxState, proc *agent.Process, cfg processConfig, tag *string) *eproc {
	return &eproc{b: b, pid: proc.Pid, tag: tag, cfg: cfg, proc: proc,
		subs: map[*subscriber]struct{}{}, done: make(chan struct{})}
}

func (p *eproc) subscribe() *subscriber {
	s := &subscriber{ch: make(chan *processEvent, 8), gone: make(chan struct{})}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	return s
}

func (p *eproc) unsubscribe(s *subscriber) {
	s.once.Do(func() { close(s.gone) })
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

// broadcast hands e to every subscriber, waiting for each.
func (p *eproc) broadcast(e *processEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- e:
		case <-s.gone:
		}
	}
}

// pump follows the process until it exits or the agent goes away.
func (p *eproc) pump() {
	for ev := range p.proc.Events() {
		switch ev.Type {
		case agent.EventStdout:
			if p.pty {
				p.broadcast(&processEvent{Data: &dataEvent{Pty: ev.Data}})
				continue
			}
			p.broadcast(&processEvent{Data: &dataEvent{Stdout: ev.Data}})
		case agent.EventStderr:
			p.broadcast(&processEvent{Data: &dataEvent{Stderr: ev.Data}})
		case agent.EventExit:
			p.finish(endFor(agent.ExitStatus{Code: ev.ExitCode, Signal: ev.Signal}), nil)
			return
		}
	}
	why := p.b.h.sandboxEnded(context.Background(), p.b.sb)
	if why == "" {
		why = "the sandbox was killed or timed out"
	}
	// E2B's SDKs (and their tests) say "the sandbox was killed or reached
	// its end of life" when a call dies with its sandbox; airlock's reason
	// follows.
	p.finish(nil, errorf(CodeUnavailable, "lost the sandbox while following process %d: the sandbox was killed or reached its end of life while the request was in flight (%s)", p.pid, why))
}

// finish records how the process ended and wakes its streams.
func (p *eproc) finish(end *endEvent, fail *Error) {
	p.mu.Lock()
	p.end, p.fail = end, fail
	if p.timer != nil {
		p.timer.Stop()
	}
	close(p.done)
	p.mu.Unlock()
	p.b.removeProc(p)
	p.proc.Close()
	detail := map[string]any{"pid": p.pid, "via": "e2b"}
	if end != nil {
		detail["exit_code"], detail["status"] = end.ExitCode, end.Status
	} else {
		detail["error"] = fail.Message
	}
	p.b.h.m.Audit(context.Background(), p.b.sb.Owner(), p.b.sb.ID, actionExecResult, detail)
}

// setTimeout kills the process (its group) after d, as envd does with the
// Connect-Timeout-Ms of Start.
func (p *eproc) setTimeout(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return
	default:
	}
	p.timer = time.AfterFunc(d, func() {
		select {
		case <-p.done:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.b.sb.Agent().Signal(ctx, p.pid, syscall.SIGKILL)
	})
}

// signals maps the agent's signal names to numbers, for envd's status
// strings ("signal: killed").
var signals = map[string]syscall.Signal{
	"SIGHUP": syscall.SIGHUP, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT, "SIGILL": syscall.SIGILL,
	"SIGTRAP": syscall.SIGTRAP, "SIGABRT": syscall.SIGABRT, "SIGBUS": syscall.SIGBUS, "SIGFPE": syscall.SIGFPE,
	"SIGKILL": syscall.SIGKILL, "SIGUSR1": syscall.SIGUSR1, "SIGSEGV": syscall.SIGSEGV, "SIGUSR2": syscall.SIGUSR2,
	"SIGPIPE": syscall.SIGPIPE, "SIGALRM": syscall.SIGALRM, "SIGTERM": syscall.SIGTERM, "SIGXCPU": syscall.SIGXCPU,
	"SIGXFSZ": syscall.SIGXFSZ, "SIGSYS": syscall.SIGSYS,
}

// endFor builds envd's end event: like Go's os.ProcessState, a process
// killed by a signal has exit code -1, exited false and the status
// "signal: killed"; a non-zero exit carries its status as the error, which
// the SDKs use as CommandExitError's message.
func endFor(st agent.ExitStatus) *endEvent {
	if st.Signal != "" {
		status := "signal: " + st.Signal
		if s, ok := signals[st.Signal]; ok {
			status = "signal: " + s.String()
		}
		return &endEvent{ExitCode: -1, Status: status, Error: &status}
	}
	status := "exit status " + strconv.Itoa(st.Code)
	e := &endEvent{ExitCode: int32(st.Code), Exited: true, Status: status}
	if st.Code != 0 {
		e.Error = &status
	}
	return e
}

func (b *boxState) addProc(p *eproc) {
	b.mu.Lock()
	b.procs[p.pid] = p
	b.mu.Unlock()
}

func (b *boxState) removeProc(p *eproc) {
	b.mu.Lock()
	if b.procs[p.pid] == p {
		delete(b.procs, p.pid)
	}
	b.mu.Unlock()
}

// findProc returns the followed process a selector names.
func (b *boxState) findProc(sel *processSelector) (*eproc, int, error) {
	if sel == nil || (sel.Pid == nil) == (sel.Tag == nil) {
		return nil, 0, errorf(CodeInvalidArgument, "process selector: exactly one of pid and tag is required")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if sel.Pid != nil {
		return b.procs[int(*sel.Pid)], int(*sel.Pid), nil
	}
	for _, p := range b.procs {
		if p.tag != nil && *p.tag == *sel.Tag {
			return p, p.pid, nil
		}
	}
	return nil, 0, nil
}

// resolvePid finds the pid a selector names among the followed processes
// and, failing that, the agent's running ones (processes started through
// airlock's own API).
func (h *Handler) resolvePid(ctx context.Context, b *boxState, sel *processSelector) (*eproc, int, error) {
	p, pid, err := b.findProc(sel)
	if err != nil || p != nil {
		return p, pid, err
	}
	list, err := b.sb.Agent().Processes(ctx)
	if err != nil {
		return nil, 0, err
	}
	for _, pi := range list {
		if pi.Running && ((sel.Pid != nil && pi.Pid == pid) || (sel.Tag != nil && pi.Tag == *sel.Tag)) {
			return nil, pi.Pid, nil
		}
	}
	if sel.Tag != nil {
		return nil, 0, errorf(CodeNotFound, "process with tag %q not found", *sel.Tag)
	}
	return nil, 0, errorf(CodeNotFound, "process with pid %d not found", pid)
}

// envList turns envd's env map into KEY=VALUE pairs.
func envList(envs map[string]string) ([]string, error) {
	keys := make([]string, 0, len(envs))
	for k := range envs {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(envs[k], 0) >= 0 {
			return nil, errorf(CodeInvalidArgument, "bad environment variable %q", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+envs[k])
	}
	return out, nil
}

func (h *Handler) processStart(ctx context.Context, c *rpcCall, b *boxState, body []byte, send func(any) error) error {
	if e := rpcUser(c.r); e != nil {
		return e
	}
	var req startRequest
	if err := decodeMessage(body, &req); err != nil {
		return err
	}
	if req.Process == nil || req.Process.Cmd == "" {
		return errorf(CodeInvalidArgument, "process.cmd is required")
	}
	pty, perr := ptyOf(req.Pty)
	if perr != nil {
		return perr
	}
	env, err := envList(req.Process.Envs)
	if err != nil {
		return err
	}
	// E2B runs commands in the template's working directory (setWorkdir,
	// an image's WORKDIR), else in the home (see workDir).
	home := b.homeDir(ctx)
	cwd, _ := workDir(home, "")
	if wd := b.sb.WorkDir(); path.IsAbs(wd) && wd != sandboxHome {
		cwd = wd
	}
	if req.Process.Cwd != nil && *req.Process.Cwd != "" {
		sp, ok := workDir(home, *req.Process.Cwd)
		if !ok {
			return errorf(CodeInvalidArgument, "bad cwd")
		}
		cwd = sp
	}
	if _, set := req.Process.Envs["PWD"]; !set {
		// PWD names the directory as E2B code knows it (where it is the
		// workspace, /home/user), and shells take PWD for their working
		// directory when it names the same directory, so that `pwd` says
		// /home/user even where getcwd(2) says /workspace.
		env = append(env, "PWD="+fromSandbox(cwd))
	}
	tag := ""
	if req.Tag != nil {
		tag = *req.Tag
	}
	argv := append([]string{req.Process.Cmd}, req.Process.Args...)
	stdinOpen := req.Stdin == nil || *req.Stdin
	// Fail closed: nothing runs unless its audit record is written.
	if err := h.m.AuditFirst(ctx, b.sb.Owner(), b.sb.ID, store.ActionExec, map[string]any{"argv": argv, "via": "e2b"}); err != nil {
		return auditError(err)
	}
	proc, err := b.sb.Agent().Exec(ctx, agent.ExecRequest{Argv: argv, Cwd: cwd, Env: env, StdinOpen: stdinOpen,
		Tag: tag, Background: true, Pty: pty})
	if err != nil {
		h.m.Audit(ctx, b.sb.Owner(), b.sb.ID, actionExecResult, map[string]any{"argv": argv, "error": err.Error(), "via": "e2b"})
		return startError(err)
	}
	h.m.Audit(ctx, b.sb.Owner(), b.sb.ID, actionExecResult, map[string]any{"argv": argv, "pid": proc.Pid, "via": "e2b"})
	cfg := *req.Process
	p := newEproc(b, proc, cfg, req.Tag)
	p.pty = pty != nil
	s := p.subscribe()
	b.addProc(p)
	go p.pump()
	if c.timeout > 0 {
		p.setTimeout(c.timeout)
	}
	if err := send(&eventResponse{Event: &processEvent{Start: &startEvent{Pid: uint32(p.pid)}}}); err != nil {
		p.unsubscribe(s)
		return err
	}
	return follow(ctx, c, p, s, send)
}

// startError maps a failure to start a process: like envd, a command that
// cannot be started is an invalid argument.
func startError(err error) error {
	var ae *agent.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case agent.CodeNotFound, agent.CodePermissionDenied, agent.CodeInvalidArgument, agent.CodeNotADirectory:
			return errorf(CodeInvalidArgument, "starting the process: %s", ae.Message)
		}
	}
	return agentRPCError(err)
}

// follow streams a followed process's events until it ends or the stream
// goes away; the process keeps running in the latter case.
func follow(ctx context.Context, c *rpcCall, p *eproc, s *subscriber, send func(any) error) error {
	defer p.unsubscribe(s)
	keep := keepaliveInterval(c.r.Header)
	t := time.NewTicker(keep)
	defer t.Stop()
	for {
		select {
		case e := <-s.ch:
			if err := send(&eventResponse{Event: e}); err != nil {
				return err
			}
			t.Reset(keep)
		case <-p.done:
			for {
				select {
				case e := <-s.ch:
					if err := send(&eventResponse{Event: e}); err != nil {
						return err
					}
					continue
				default:
				}
				break
			}
			if p.fail != nil {
				return p.fail
			}
			return send(&eventResponse{Event: &processEvent{End: p.end}})
		case <-t.C:
			if err := send(&eventResponse{Event: &processEvent{Keepalive: &empty{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (h *Handler) processConnect(ctx context.Context, c *rpcCall, b *boxState, body []byte, send func(any) error) error {
	var req connectRequest
	if err := decodeMessage(body, &req); err != nil {
		return err
	}
	p, pid, err := h.resolvePid(ctx, b, req.Process)
	if err != nil {
		return err
	}
	if p == nil {
		// A process started through airlock's own API: follow it from
		// now on (the agent first replays the output it buffered).
		proc, err := b.sb.Agent().Attach(ctx, pid)
		if err != nil {
			return agentRPCError(err)
		}
		cfg := processConfig{}
		if list, err := b.sb.Agent().Processes(ctx); err == nil {
			for _, pi := range list {
				if pi.Pid == pid {
					cfg = agentConfig(pi)
				}
			}
		}
		p = newEproc(b, proc, cfg, nil)
		b.addProc(p)
		go p.pump()
	}
	s := p.subscribe()
	if err := send(&eventResponse{Event: &processEvent{Start: &startEvent{Pid: uint32(p.pid)}}}); err != nil {
		p.unsubscribe(s)
		return err
	}
	return follow(ctx, c, p, s, send)
}

// agentConfig describes a process the agent started in envd's terms.
func agentConfig(pi agent.ProcessInfo) processConfig {
	cfg := processConfig{}
	if len(pi.Argv) > 0 {
		cfg.Cmd, cfg.Args = pi.Argv[0], pi.Argv[1:]
	}
	if pi.Cwd != "" {
		cwd := fromSandbox(pi.Cwd)
		cfg.Cwd = &cwd
	}
	return cfg
}

func (h *Handler) processList(ctx context.Context, b *boxState) (any, error) {
	list, err := b.sb.Agent().Processes(ctx)
	if err != nil {
		return nil, agentRPCError(err)
	}
	b.mu.Lock()
	followed := make(map[int]*eproc, len(b.procs))
	for pid, p := range b.procs {
		followed[pid] = p
	}
	b.mu.Unlock()
	var out listResponse
	for _, pi := range list {
		if !pi.Running || pi.Tag == "airlock-metrics" {
			continue
		}
		info := processInfo{Pid: uint32(pi.Pid)}
		if p := followed[pi.Pid]; p != nil {
			cfg := p.cfg
			info.Config, info.Tag = &cfg, p.tag
		} else {
			cfg := agentConfig(pi)
			info.Config = &cfg
			if pi.Tag != "" {
				tag := pi.Tag
				info.Tag = &tag
			}
		}
		out.Processes = append(out.Processes, info)
	}
	return &out, nil
}

func (h *Handler) processSendInput(ctx context.Context, b *boxState, body []byte) (any, error) {
	var req sendInputRequest
	if err := decodeMessage(body, &req); err != nil {
		return nil, err
	}
	if req.Input == nil || (req.Input.Stdin == nil) == (req.Input.Pty == nil) {
		return nil, errorf(CodeInvalidArgument, "input: exactly one of stdin and pty is required")
	}
	in := req.Input.Stdin
	if in == nil {
		in = req.Input.Pty // a terminal's input is its stdin
	}
	_, pid, err := h.resolvePid(ctx, b, req.Process)
	if err != nil {
		return nil, err
	}
	if err := b.sb.Agent().WriteStdin(ctx, pid, *in, false); err != nil {
		return nil, agentRPCError(err)
	}
	return &empty{}, nil
}

func (h *Handler) processCloseStdin(ctx context.Context, b *boxState, body []byte) (any, error) {
	var req closeStdinRequest
	if err := decodeMessage(body, &req); err != nil {
		return nil, err
	}
	_, pid, err := h.resolvePid(ctx, b, req.Process)
	if err != nil {
		return nil, err
	}
	if err := b.sb.Agent().WriteStdin(ctx, pid, nil, true); err != nil {
		return nil, agentRPCError(err)
	}
	return &empty{}, nil
}

func (h *Handler) processSendSignal(ctx context.Context, b *boxState, body []byte) (any, error) {
	var req sendSignalRequest
	if err := decodeMessage(body, &req); err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch int32(req.Signal) {
	case signalSIGKILL:
		sig = syscall.SIGKILL
	case signalSIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, errorf(CodeInvalidArgument, "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM")
	}
	_, pid, err := h.resolvePid(ctx, b, req.Process)
	if err != nil {
		return nil, err
	}
	if err := b.sb.Agent().Signal(ctx, pid, sig); err != nil {
		return nil, agentRPCError(err)
	}
	return &empty{}, nil
}

// actionExecResult is the audit action of a process's outcome; the start
// is recorded (store.ActionExec) before the process runs.
const actionExecResult = "exec.result"

// auditError is the Connect error of an action refused because its audit
// record could not be written (manager.ErrAudit), or refused by the
// approval policy (PermissionDenied).
func auditError(err error) *Error {
	var apr *approval.Error
	if errors.As(err, &apr) {
		return errorf(CodePermissionDenied, "%v", err)
	}
	return errorf(CodeUnavailable, "%v", err)
}

// agentRPCError maps an agent failure to a Connect error.
func agentRPCError(err error) *Error {
	var ae *agent.Error
	if errors.As(err, &ae) {
		switch ae.Code {
		case agent.CodeNotFound:
			return errorf(CodeNotFound, "%s", ae.Message)
		case agent.CodeExists:
			return errorf(CodeAlreadyExists, "%s", ae.Message)
		case agent.CodeNotADirectory, agent.CodeIsADirectory, agent.CodeNotRegular, agent.CodeInvalidArgument,
			agent.CodeCrossDevice, agent.CodeTooLarge, agent.CodeNameTooLong:
			return errorf(CodeInvalidArgument, "%s", ae.Message)
		case agent.CodePermissionDenied:
			return errorf(CodePermissionDenied, "%s", ae.Message)
		case agent.CodeNoSpace, agent.CodeClosed:
			return errorf(CodeFailedPrecondition, "%s", ae.Message)
		case agent.CodeUnsupported:
			return errorf(CodeUnimplemented, "%s", ae.Message)
		}
		return errorf(CodeInternal, "%s: %s", ae.Code, ae.Message)
	}
	if errors.Is(err, agent.ErrClosed) || errors.Is(err, agent.ErrProtocol) {
		return errorf(CodeUnavailable, "the sandbox is not running: %v", err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return errorf(CodeDeadlineExceeded, "%v", err)
	}
	if errors.Is(err, context.Canceled) {
		return errorf(CodeCanceled, "%v", err)
	}
	return errorf(CodeInternal, "%v", err)
}
