package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// maxExitedBackground bounds how many exited background processes (and
// their output rings) the agent retains for Processes and Attach.
const maxExitedBackground = 16

// drainGrace is how long after a process exits the agent waits, while its
// output pipes are still open (a descendant holds them) and quiet, before
// reporting the exit anyway. Output written later still reaches the ring.
const drainGrace = 10 * time.Millisecond

var bufPool = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

// proc is a process started by the agent.
type proc struct {
	a          *agent
	pid        int
	argv       []string
	tag, cwd   string
	background bool
	started    time.Time

	mu         sync.Mutex
	cond       sync.Cond
	ring       outRing
	followers  []*follower
	producers  int // pipe readers waiting for ring space
	exited     bool
	exit       exitMsg
	exitedAt   time.Time
	eof        [2]bool
	pipeFd     [2]int
	busy       [2]atomic.Bool // a pipe reader holds data not yet in the ring
	done       bool           // exit reported to followers
	ownerGone  bool           // foreground: the starting stream went away
	graceTimer *time.Timer

	stdinMu sync.Mutex
	stdin   *os.File // nil once closed
}

// follower is one stream following a process's output.
type follower struct {
	s        *astream
	cursor   int64 // absolute ring offset of the next record to send
	end      int64 // stop here and send the exit; -1 until known
	detached bool
	owner    bool
	snapshot bool // stop at end even if the process has not exited
}

func (p *proc) info() ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return ProcessInfo{
		Pid: p.pid, Argv: p.argv, Tag: p.tag, Cwd: p.cwd, Background: p.background,
		Running: !p.exited, ExitCode: p.exit.Code, Signal: p.exit.Signal,
		StartedAt: p.started, ExitedAt: p.exitedAt,
	}
}

// startReaper reaps every child (ours and orphans reparented to us) on
// SIGCHLD and dispatches exit statuses to the processes we started.
func (a *agent) startReaper() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		for range ch {
			a.forkMu.Lock()
			a.reapAll()
			a.forkMu.Unlock()
		}
	}()
}

// waitAll is wait4's __WALL: clone children and traced threads too.
const waitAll = 0x40000000

// reapAll reaps every exited child without blocking and reports whether any
// child is left. The caller holds forkMu exclusively.
//
// A child or orphan that calls ptrace(PTRACE_TRACEME) makes the agent its
// tracer; the agent never traces, so such a task is killed at its first
// ptrace-stop (a stop is never mistaken for an exit), and traced threads
// are reaped with __WALL so that their processes' exits are reported.
func (a *agent) reapAll() bool {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG|waitAll, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil { // ECHILD: no children at all
			return false
		}
		if pid == 0 {
			return true
		}
		if ws.Stopped() || ws.Continued() {
			if ws.Stopped() {
				syscall.Kill(pid, syscall.SIGKILL) // the whole thread group
			}
			continue
		}
		a.mu.Lock()
		p := a.procs[pid]
		a.mu.Unlock()
		if p != nil {
			p.setExit(ws)
		} else {
			helperExited(pid, ws) // a computer-use tool run, or an orphan
		}
	}
}

// killDescendants SIGKILLs every live descendant of the agent found in
// /proc and returns how many it signalled.
func killDescendants() int {
	pids := descendants()
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return len(pids)
}

// signalNames maps Linux signal numbers to names.
var signalNames = [...]string{
	1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT",
	7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2",
	13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM", 16: "SIGSTKFLT", 17: "SIGCHLD",
	18: "SIGCONT", 19: "SIGSTOP", 20: "SIGTSTP", 21: "SIGTTIN", 22: "SIGTTOU",
	23: "SIGURG", 24: "SIGXCPU", 25: "SIGXFSZ", 26: "SIGVTALRM", 27: "SIGPROF",
	28: "SIGWINCH", 29: "SIGIO", 30: "SIGPWR", 31: "SIGSYS",
}

func signalName(sig syscall.Signal) string {
	if int(sig) > 0 && int(sig) < len(signalNames) {
		return signalNames[sig]
	}
	return "SIG" + strconv.Itoa(int(sig))
}

// setExit records the exit status; called by the reaper.
func (p *proc) setExit(ws syscall.WaitStatus) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return
	}
	p.exited = true
	p.exitedAt = time.Now()
	switch {
	case ws.Exited():
		p.exit = exitMsg{Code: ws.ExitStatus()}
	case ws.Signaled():
		p.exit = exitMsg{Code: 128 + int(ws.Signal()), Signal: signalName(ws.Signal())}
	}
	if !p.background {
		// A foreground command's process tree ends with it: whatever it
		// left running in its process group (a fork bomb's copies, a
		// forgotten "&") is killed. The group cannot have been reused: a
		// pgid stays taken while any member lives.
		syscall.Kill(-p.pid, syscall.SIGKILL)
	}
	p.maybeDoneLocked()
}

// maybeDoneLocked reports the exit to followers once the process has exited
// and its output is drained: both pipes at EOF, or quiet (nothing buffered in
// the pipe or in a reader's hands) since drainGrace.
func (p *proc) maybeDoneLocked() {
	if p.done || !p.exited {
		return
	}
	if !(p.eof[0] && p.eof[1]) {
		quiet := true
		for i := range 2 {
			if p.eof[i] {
				continue
			}
			if outputPending(p.pipeFd[i]) || p.busy[i].Load() {
				quiet = false
			}
		}
		if !quiet || time.Since(p.exitedAt) < drainGrace {
			if p.graceTimer == nil {
				p.graceTimer = time.AfterFunc(drainGrace, p.graceCheck)
			} else {
				p.graceTimer.Reset(drainGrace)
			}
			return
		}
	}
	p.done = true
	if p.graceTimer != nil {
		p.graceTimer.Stop()
	}
	for _, f := range p.followers {
		if f.end < 0 {
			f.end = p.ring.tail
		}
	}
	p.cond.Broadcast()
	go p.afterDone()
}

func (p *proc) graceCheck() {
	p.mu.Lock()
	p.maybeDoneLocked()
	p.mu.Unlock()
}

// afterDone closes stdin and retires the process from the table.
func (p *proc) afterDone() {
	p.closeStdin()
	p.mu.Lock()
	forget := !p.background && p.ownerGone
	p.mu.Unlock()
	if forget {
		p.a.forget(p)
	} else if p.background {
		p.a.retireBackground(p)
	}
}

// forget removes a process from the table.
func (a *agent) forget(p *proc) {
	a.mu.Lock()
	if a.procs[p.pid] == p {
		delete(a.procs, p.pid)
	}
	a.mu.Unlock()
}

// retireBackground keeps an exited background process for later listing
// and attaching, evicting the oldest beyond maxExitedBackground.
func (a *agent) retireBackground(p *proc) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.exited = append(a.exited, p)
	for len(a.exited) > maxExitedBackground {
		old := a.exited[0]
		a.exited[0] = nil
		a.exited = a.exited[1:]
		if a.procs[old.pid] == old {
			delete(a.procs, old.pid)
		}
	}
}

// readPipe copies one output pipe into the ring until EOF. It holds no buffer
// while the pipe is idle.
func (p *proc) readPipe(i int, f *os.File) {
	kind := kindStdout + byte(i)
	rc, err := f.SyscallConn()
	if err != nil {
		p.pipeEOF(i, f)
		return
	}
	for {
		var bp *[]byte
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			p.busy[i].Store(true)
			b := bufPool.Get().(*[]byte)
			for {
				n, rerr = syscall.Read(int(fd), *b)
				if rerr != syscall.EINTR {
					break
				}
			}
			if rerr == syscall.EAGAIN {
				bufPool.Put(b)
				p.busy[i].Store(false)
				return false
			}
			bp = b
			return true
		})
		if err == nil {
			err = rerr
		}
		if err != nil || n <= 0 { // EOF or error
			if bp != nil {
				bufPool.Put(bp)
			}
			p.pipeEOF(i, f)
			return
		}
		p.appendOut(i, kind, (*bp)[:n])
		bufPool.Put(bp)
	}
}

func (p *proc) pipeEOF(i int, f *os.File) {
	p.mu.Lock()
	p.eof[i] = true
	p.busy[i].Store(false)
	p.maybeDoneLocked()
	p.mu.Unlock()
	f.Close()
}

// appendOut adds output to the ring, waiting while the slowest active
// follower is a full ring behind.
func (p *proc) appendOut(i int, kind byte, data []byte) {
	p.mu.Lock()
	need := int64(ringHeader + len(data))
	for {
		min := p.ring.tail
		for _, f := range p.followers {
			if !f.detached && (f.end < 0 || f.cursor < f.end) && f.cursor < min {
				min = f.cursor
			}
		}
		if p.ring.tail+need-min <= int64(p.ring.max) {
			break
		}
		p.producers++
		p.cond.Wait()
		p.producers--
	}
	p.ring.evictFor(len(data))
	p.ring.append(kind, data)
	p.busy[i].Store(false)
	p.cond.Broadcast()
	p.mu.Unlock()
}

// follow streams the process's output from the follower's cursor, then the
// exit. It returns when the exit is sent or the stream goes away.
func (p *proc) follow(f *follower) {
	defer func() {
		p.mu.Lock()
		for i, g := range p.followers {
			if g == f {
				p.followers = append(p.followers[:i], p.followers[i+1:]...)
				break
			}
		}
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	for {
		p.mu.Lock()
		for !f.detached && f.cursor >= p.ring.tail && (f.end < 0 || f.cursor < f.end) {
			p.cond.Wait()
		}
		if f.detached {
			p.mu.Unlock()
			return
		}
		if f.end >= 0 && f.cursor >= f.end {
			exit := p.exit
			if f.snapshot && !p.done {
				exit = exitMsg{Running: true}
			}
			p.mu.Unlock()
			f.s.finish(FrameExit, exit)
			if f.owner && !p.background {
				p.a.forget(p)
			}
			return
		}
		if f.cursor < p.ring.head {
			f.cursor = p.ring.head
		}
		kind, n := p.ring.record(f.cursor)
		bp := bufPool.Get().(*[]byte)
		buf := (*bp)[:n]
		p.ring.copyOut(f.cursor+ringHeader, buf)
		f.cursor += int64(ringHeader + n)
		if p.producers > 0 {
			p.cond.Broadcast()
		}
		p.mu.Unlock()
		t := FrameStdout
		if kind == kindStderr {
			t = FrameStderr
		}
		err := f.s.sendData(t, buf)
		bufPool.Put(bp)
		if err != nil {
			return
		}
	}
}

// newFollower adds a follower starting at the oldest retained output.
func (p *proc) newFollower(s *astream, owner bool) *follower {
	f := &follower{s: s, end: -1, owner: owner}
	p.mu.Lock()
	f.cursor = p.ring.head
	if p.done {
		f.end = p.ring.tail
	}
	p.followers = append(p.followers, f)
	p.mu.Unlock()
	return f
}

// watch detaches the follower when its stream goes away; a foreground
// process whose starting stream goes away before it exits is killed with
// its whole process group.
func (p *proc) watch(f *follower) {
	f.s.onGone(func() {
		p.mu.Lock()
		f.detached = true
		kill := false
		if f.owner && !p.background {
			p.ownerGone = true
			kill = !p.exited
			if p.done {
				go p.a.forget(p)
			}
		}
		p.cond.Broadcast()
		p.mu.Unlock()
		if kill && p.pid > 0 {
			syscall.Kill(-p.pid, syscall.SIGKILL)
		}
	})
}

// closeStdin closes the process's stdin, interrupting a blocked writer.
func (p *proc) closeStdin() {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
}

// writeStdin writes the stream's Data to stdin until EOF, then closes stdin
// if asked. A reset of the stream interrupts a blocked write.
func (p *proc) writeStdin(s *astream, closeAtEOF bool) (int64, error) {
	var total int64
	s.onGone(func() {
		p.stdinMu.Lock()
		if p.stdin != nil {
			p.stdin.SetWriteDeadline(time.Unix(1, 0))
		}
		p.stdinMu.Unlock()
	})
	for {
		data, eof, err := s.recv()
		if err != nil {
			return total, err
		}
		if eof {
			break
		}
		p.stdinMu.Lock()
		stdin := p.stdin
		p.stdinMu.Unlock()
		if stdin == nil {
			return total, &Error{Code: CodeClosed, Message: fmt.Sprintf("stdin of process %d is closed", p.pid)}
		}
		// Chunks written by concurrent streams may interleave.
		for rest := data; len(rest) > 0; {
			n, err := stdin.Write(rest)
			total += int64(n)
			rest = rest[n:]
			if err == nil {
				continue
			}
			if s.isGone() {
				return total, errStreamGone
			}
			if errors.Is(err, os.ErrDeadlineExceeded) { // another stream was reset
				stdin.SetWriteDeadline(time.Time{})
				continue
			}
			return total, &Error{Code: CodeClosed, Message: fmt.Sprintf("writing stdin of process %d: %v", p.pid, err)}
		}
		s.consumed(len(data))
	}
	if closeAtEOF {
		p.closeStdin()
	}
	return total, nil
}

func (s *astream) isGone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gone
}

// lookPath finds an executable like the shell does, in the given PATH.
func lookPath(name, path, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	if path == "" {
		path = "/usr/local/bin:/usr/bin:/bin"
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		file := filepath.Join(dir, name)
		if st, err := os.Stat(file); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return file, nil
		}
	}
	return "", &Error{Code: CodeNotFound, Message: fmt.Sprintf("executable %q not found in PATH", name)}
}

// mergeEnv returns base with the entries of extra added or replacing.
func mergeEnv(base, extra []string) ([]string, error) {
	if len(extra) == 0 {
		return base, nil
	}
	out := make([]string, 0, len(base)+len(extra))
	idx := make(map[string]int, len(base)+len(extra))
	for _, kv := range append(append([]string(nil), base...), extra...) {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.IndexByte(kv, 0) >= 0 {
			return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("bad environment entry %q", kv)}
		}
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out, nil
}

func getenv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

func (a *hostConn) handleExec(s *astream, payload []byte) (any, error) {
	var req execMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	argv := req.Argv
	switch {
	case len(argv) > 0 && req.Shell != "":
		return nil, &Error{Code: CodeInvalidArgument, Message: "both argv and shell given"}
	case req.Shell != "":
		argv = []string{"/bin/sh", "-c", req.Shell}
	case len(argv) == 0:
		return nil, &Error{Code: CodeInvalidArgument, Message: "neither argv nor shell given"}
	}
	cwd, err := a.resolve(req.Cwd, true)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(cwd); err != nil {
		return nil, fmt.Errorf("working directory: %w", err)
	} else if !st.IsDir() {
		return nil, &Error{Code: CodeNotADirectory, Message: fmt.Sprintf("working directory %s is not a directory", cwd)}
	}
	env, err := mergeEnv(a.env, req.Env)
	if err != nil {
		return nil, err
	}
	path, err := lookPath(argv[0], getenv(env, "PATH"), cwd)
	if err != nil {
		return nil, err
	}

	fds, err := stdioPipes()
	if err != nil {
		return nil, err
	}
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{uintptr(fds[0]), uintptr(fds[3]), uintptr(fds[5])},
		Sys:   theWorkload.sysProcAttr(&syscall.SysProcAttr{Setpgid: true, Credential: workloadCred, AmbientCaps: workloadCaps}),
	}
	var pty *ptyExec
	if req.Pty != nil {
		// A terminal (pty_linux.go) replaces the stdin and stdout pipes;
		// the stderr pipe stays, unused, and reads EOF at once.
		if pty, err = newPtyExec(*req.Pty); err != nil {
			for _, fd := range fds {
				syscall.Close(fd)
			}
			return nil, err
		}
		for _, i := range []int{0, 1, 2, 3} {
			syscall.Close(fds[i])
		}
		fds[0], fds[1], fds[2], fds[3] = -1, pty.stdinW, pty.stdoutR, -1
		child := pty.childFd()
		attr.Files = []uintptr{child, child, child}
		attr.Sys = pty.sysProcAttr()
		req.StdinOpen = true
	}
	p := &proc{a: a.agent, argv: argv, tag: req.Tag, cwd: cwd, background: req.Background,
		ring: outRing{max: RingSize}, pipeFd: [2]int{fds[2], fds[4]}}
	p.cond.L = &p.mu
	// The owner follows from the first byte: register it before the fork.
	f := p.newFollower(s, true)
	a.forkMu.RLock()
	a.mu.Lock()
	closing := a.closing
	a.mu.Unlock()
	pid, err := 0, error(&Error{Code: CodeClosed, Message: "agent is shutting down"})
	if !closing {
		err = theSpawner.run(func() (ferr error) {
			pid, ferr = syscall.ForkExec(path, argv, attr)
			return ferr
		})
	}
	if err == nil {
		p.pid = pid
		p.started = time.Now()
		a.mu.Lock()
		a.procs[pid] = p
		a.mu.Unlock()
		if pty != nil {
			a.rememberPty(pid, pty.master)
			pty.master = nil
		}
	}
	a.forkMu.RUnlock()
	if pty != nil {
		pty.close() // now, so that the master reads EOF once the child's copies close
	}
	syscall.Close(fds[0])
	syscall.Close(fds[3])
	syscall.Close(fds[5])
	if err != nil {
		syscall.Close(fds[1])
		syscall.Close(fds[2])
		syscall.Close(fds[4])
		return nil, startError(path, err)
	}
	for _, fd := range []int{fds[1], fds[2], fds[4]} {
		syscall.SetNonblock(fd, true)
	}
	if req.StdinStream || req.StdinOpen {
		p.stdin = os.NewFile(uintptr(fds[1]), "stdin")
	} else {
		syscall.Close(fds[1])
	}
	go p.readPipe(0, os.NewFile(uintptr(fds[2]), "stdout"))
	go p.readPipe(1, os.NewFile(uintptr(fds[4]), "stderr"))

	p.watch(f)
	s.send(FrameStarted, startedMsg{Pid: pid}) // if the stream is gone, follow returns at once
	if req.StdinStream {
		go func() {
			if _, err := p.writeStdin(s, !req.StdinOpen); err != nil && !req.StdinOpen {
				p.closeStdin()
			}
		}()
	}
	p.follow(f)
	return nil, nil
}

// stdioPipes makes the three pipes of a process's standard input, output
// and error: stdin r,w; stdout r,w; stderr r,w (close-on-exec).
func stdioPipes() (fds [6]int, err error) {
	for i := 0; i < 6; i += 2 {
		if err := syscall.Pipe2(fds[i:i+2], syscall.O_CLOEXEC); err != nil {
			for j := 0; j < i; j++ {
				syscall.Close(fds[j])
			}
			return fds, fmt.Errorf("creating pipes: %w", err)
		}
	}
	return fds, nil
}

// outOfTasks are what programs print when they cannot create a process or
// thread (fork/clone's EAGAIN): node's thread pool assertion, Python's and
// the shells' messages.
var outOfTasks = []string{"Resource temporarily unavailable", "uv_thread_create", "can't start new thread", "Cannot fork", "pthread_create"}

// startError explains a failure to start a process. fork's EAGAIN means
// the sandbox's pids limit (threads count too) is full; so does a kernel
// that died during start-up saying it could not create a thread.
func startError(what string, err error) error {
	limited := errors.Is(err, syscall.EAGAIN)
	for _, m := range outOfTasks {
		limited = limited || strings.Contains(err.Error(), m)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Code: CodeTimeout, Message: fmt.Sprintf("%s did not start in time (%v): the sandbox may be overloaded (CPU limit, memory) or its startup files hang", what, err)}
	}
	if limited {
		return &Error{Code: CodeLimit, Message: fmt.Sprintf("cannot start %s: the sandbox's process limit (pids) is reached (%v); end processes (POST .../kill-processes) or create the sandbox with a higher limits.pids", what, syscall.EAGAIN)}
	}
	return fmt.Errorf("starting %s: %w", what, err)
}

func (a *agent) lookup(pid int) (*proc, error) {
	a.mu.Lock()
	p := a.procs[pid]
	a.mu.Unlock()
	if p == nil {
		return nil, &Error{Code: CodeNotFound, Message: fmt.Sprintf("no process %d", pid)}
	}
	return p, nil
}

func (a *hostConn) handleAttach(s *astream, payload []byte) (any, error) {
	var req pidMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	p, err := a.lookup(req.Pid)
	if err != nil {
		return nil, err
	}
	f := p.newFollower(s, false)
	if req.Snapshot {
		p.mu.Lock()
		f.snapshot = true
		if f.end < 0 {
			f.end = p.ring.tail
		}
		p.mu.Unlock()
	}
	p.watch(f)
	s.send(FrameStarted, p.info())
	p.follow(f)
	return nil, nil
}

func (a *hostConn) handleProcesses(s *astream, payload []byte) (any, error) {
	if err := decodeJSON(payload, &emptyMsg{}); err != nil {
		return nil, invalid(err)
	}
	a.mu.Lock()
	procs := make([]*proc, 0, len(a.procs))
	for _, p := range a.procs {
		procs = append(procs, p)
	}
	a.mu.Unlock()
	sort.Slice(procs, func(i, j int) bool { return procs[i].started.Before(procs[j].started) })
	var items itemWriter
	for i, p := range procs {
		if i == MaxListEntries {
			return truncMsg{Truncated: true}, items.flush(s)
		}
		info := p.info()
		info.Argv = shortArgv(info.Argv)
		if err := items.add(s, info); err != nil {
			return nil, err
		}
	}
	return truncMsg{}, items.flush(s)
}

// Items frames are batched up to itemBatch bytes; one item may be at most
// maxItem bytes, so a frame never exceeds itemBatch+maxItem, which must stay
// under 3/4 of InitialWindow: the host grants credit back in quarters of the
// window, so that much credit always comes back.
const (
	itemBatch = 64 << 10
	maxItem   = 96 << 10
)

// shortArgv bounds an argv for listings to about 8 KiB: long arguments are
// cut and marked with "...", later ones dropped.
func shortArgv(argv []string) []string {
	const total, each = 8 << 10, 1 << 10
	n := 0
	for _, a := range argv {
		n += len(a)
	}
	if n <= total {
		return argv
	}
	out := make([]string, 0, len(argv))
	n = 0
	for _, a := range argv {
		if len(a) > each {
			a = a[:each] + "..."
		}
		if n+len(a) > total {
			return append(out, "...")
		}
		n += len(a)
		out = append(out, a)
	}
	return out
}

// itemWriter batches JSON items into Items frames.
type itemWriter struct {
	buf []byte
}

func (w *itemWriter) add(s *astream, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding item: %w", err)
	}
	if len(b) > maxItem {
		return &Error{Code: CodeTooLarge, Message: fmt.Sprintf("list item of %d bytes", len(b))}
	}
	if len(w.buf)+len(b)+2 > itemBatch && len(w.buf) > 0 {
		if err := w.flush(s); err != nil {
			return err
		}
	}
	if len(w.buf) == 0 {
		w.buf = append(w.buf, '[')
	} else {
		w.buf = append(w.buf, ',')
	}
	w.buf = append(w.buf, b...)
	return nil
}

func (w *itemWriter) flush(s *astream) error {
	if len(w.buf) == 0 {
		return nil
	}
	w.buf = append(w.buf, ']')
	err := s.sendWhole(FrameItems, w.buf)
	w.buf = w.buf[:0]
	return err
}

func (a *hostConn) handleStdin(s *astream, payload []byte) (any, error) {
	var req stdinMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	p, err := a.lookup(req.Pid)
	if err != nil {
		return nil, err
	}
	p.stdinMu.Lock()
	open := p.stdin != nil
	p.stdinMu.Unlock()
	if !open {
		return nil, &Error{Code: CodeClosed, Message: fmt.Sprintf("stdin of process %d is closed", req.Pid)}
	}
	n, err := p.writeStdin(s, req.Close)
	if err != nil {
		return nil, err
	}
	return countMsg{Bytes: n}, nil
}

func (a *hostConn) handleSignal(s *astream, payload []byte) (any, error) {
	var req signalMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	if req.Signal < 0 || req.Signal > 64 {
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("bad signal %d", req.Signal)}
	}
	p, err := a.lookup(req.Pid)
	if err != nil {
		return nil, err
	}
	if err := syscall.Kill(-p.pid, syscall.Signal(req.Signal)); err != nil {
		if err == syscall.ESRCH {
			return nil, &Error{Code: CodeNotFound, Message: fmt.Sprintf("process group %d has no live process", p.pid)}
		}
		return nil, fmt.Errorf("signalling process group %d: %w", p.pid, err)
	}
	return emptyMsg{}, nil
}
