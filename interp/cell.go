package interp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

// syncPrefix starts a sync marker; a token of tokenLen hex digits and a NUL
// follow.
var syncPrefix = []byte("\x00airlock-sync:")

const (
	tokenLen  = 32
	markerLen = 14 + tokenLen + 1 // len(syncPrefix) + token + NUL
	// deathDrain bounds how long a dead kernel's output is waited for when
	// something outside its process group still holds its pipes.
	deathDrain = 2 * time.Second
	// msgEOFGrace is how long a kernel that closed its message pipe has to
	// exit before it is killed.
	msgEOFGrace = 500 * time.Millisecond
)

var streamNames = [2]string{"stdout", "stderr"}

func newToken() string {
	var b [tokenLen / 2]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// cell runs one request (or the start-up handshake) against a process: it
// reads output and messages, orders them, applies the caps and drives the
// interrupt ladder.
type cell struct {
	k       *Kernel
	p       *proc
	token   string
	n       int
	emit    func(Output)
	startup bool   // waiting for ready: output is discarded
	diag    []byte // start-up: the beginning of stderr, for errors
	timeout time.Duration

	maxOutput, used int
	resBudget       int
	res             *ExecResult
	stdout, stderr  strings.Builder

	seen    [2]int  // markers with our token read from each stream
	acked   [2]int  // markers covered by the messages handled so far
	blocked [2]bool // a stream waits, after a marker, for its message
	pending []kmsg  // messages waiting for their markers
	errMsg  *kmsg
	done    bool // the cell ended (end or ready handled)
	died    bool // the process died before the cell ended

	reason string // why the cell was interrupted: timeout, interrupt, cancel
	steps  []step // the rest of the interrupt ladder
	stepT  *time.Timer
	ctxErr error // Execute's context ended
}

// step is a rung of the interrupt ladder: do runs after the previous rung.
type step struct {
	after time.Duration
	do    func()
}

// maxBlocked bounds the output held back after a marker while its message
// is on the way; beyond it, output goes out unordered.
const maxBlocked = 1 << 20

// run processes the cell until it ends or the kernel dies.
func (c *cell) run(ctx context.Context, timeout time.Duration) error {
	p := c.p
	var timeoutC, stepC, deathC <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timeoutC = t.C
	}
	defer func() {
		if c.stepT != nil {
			c.stepT.Stop()
		}
	}()
	var deathT *time.Timer
	setDeath := func(d time.Duration) {
		if deathT != nil {
			deathT.Stop()
		}
		deathT = time.NewTimer(d)
		deathC = deathT.C
	}
	defer func() {
		if deathT != nil {
			deathT.Stop()
		}
	}()
	ctxDone := ctx.Done()
	var intr chan struct{}
	if !c.startup {
		intr = c.k.intr
	}
	chunks, msgs, exited := p.chunks, p.msgs, p.exited
	if p.msgEOF {
		msgs = nil
	}
	stop := p.stop
	// Output left from the previous cell (after its end) comes first.
	for i := range p.hold {
		if len(p.hold[i]) > 0 {
			c.feed(i, nil, p.eof[i])
		}
	}
	for {
		select {
		case ch := <-chunks:
			if ch.eof {
				p.eof[ch.stream] = true
				c.feed(ch.stream, nil, true)
			} else {
				c.feed(ch.stream, (*ch.buf)[:ch.n], false)
				ch.release()
			}
		case m := <-msgs:
			if m.eof {
				p.msgEOF = true
				msgs = nil
				if !p.dead {
					setDeath(msgEOFGrace)
				}
			} else {
				c.pending = append(c.pending, m)
			}
		case <-exited:
			p.dead = true
			exited = nil
			p.killGroup() // stragglers holding the pipes
			setDeath(deathDrain)
		case <-deathC:
			deathC = nil
			if !p.dead {
				p.kill(killProtocol, "it closed its message pipe")
				setDeath(deathDrain + msgEOFGrace)
				break
			}
			return c.finishDead()
		case <-stop:
			p.eof = [2]bool{true, true}
			p.msgEOF = true
			p.dead = true
			return c.finishDead()
		case <-timeoutC:
			timeoutC = nil
			stepC = c.interrupt("timeout")
		case <-ctxDone:
			ctxDone = nil
			c.ctxErr = ctx.Err()
			if c.startup {
				return fmt.Errorf("interp: starting %s kernel: %w", c.k.cfg.Language, ctx.Err())
			}
			stepC = c.interrupt("cancel")
		case <-intr:
			stepC = c.interrupt("interrupt")
		case <-stepC:
			stepC = c.nextStep()
		}
		c.drainPending(false)
		if c.done {
			return c.ctxErr
		}
		if p.dead && p.msgEOF && p.eof[0] && p.eof[1] {
			return c.finishDead()
		}
	}
}

// interrupt starts the interrupt ladder, if not started yet, and returns
// the channel of its timer.
func (c *cell) interrupt(reason string) <-chan time.Time {
	if c.reason == "" {
		c.reason = reason
	}
	if c.stepT != nil {
		return c.stepT.C
	}
	p, n, kill := c.p, c.n, c.k.cfg.KillAfter
	killStep := step{kill - kill/2, func() { p.kill(killInterrupt, "") }}
	switch p.lang {
	case Python:
		// KeyboardInterrupt; then ^C for the children holding it up (and
		// for it again).
		c.steps = []step{
			{0, func() { p.signal(syscall.SIGINT, false) }},
			{kill / 2, func() { p.signal(syscall.SIGINT, true) }},
			killStep,
		}
	case Bash:
		// ^C for the foreground job; then, in case the ^C landed between
		// the cell and its end report, a nudge.
		c.steps = []step{
			{0, func() { p.signal(syscall.SIGINT, true) }},
			{kill / 2, func() { go p.write(bashNudge(n, c.token)) }},
			killStep,
		}
	default:
		// No signals (see kernels/javascript.js): the kernel enforces
		// timeouts itself and ends a cell that awaits on request.
		c.steps = []step{
			{0, func() { go p.write(jsInterrupt(n)) }},
			{kill, killStep.do},
		}
	}
	c.stepT = time.NewTimer(c.steps[0].after)
	return c.stepT.C
}

// nextStep runs the ladder's next rung and returns the channel of the
// timer for the one after, if any.
func (c *cell) nextStep() <-chan time.Time {
	s := c.steps[0]
	c.steps = c.steps[1:]
	s.do()
	if len(c.steps) == 0 {
		return nil
	}
	c.stepT.Reset(c.steps[0].after)
	return c.stepT.C
}

// feed processes stream data: it removes sync markers, counting ours, and
// passes the rest on, except that it holds back a possible partial marker or
// UTF-8 sequence at the end, output after a marker until the message the
// marker announces has been handled (so that results come in order), and
// output after the end of the cell (for the next cell).
func (c *cell) feed(i int, data []byte, eof bool) {
	p := c.p
	if len(p.hold[i]) > 0 {
		data = append(p.hold[i], data...)
		p.hold[i] = nil
	}
	if c.blocked[i] {
		if len(data) <= maxBlocked && !c.done {
			p.hold[i] = append([]byte(nil), data...)
			return
		}
		c.blocked[i] = false
	}
	for len(data) > 0 {
		if c.done {
			p.hold[i] = append([]byte(nil), data...)
			return
		}
		j := bytes.IndexByte(data, 0)
		if j >= 0 {
			j = bytes.Index(data, syncPrefix)
		}
		if j < 0 {
			keep := 0
			if !eof {
				keep = partialPrefix(data, syncPrefix)
				keep += incompleteRune(data[:len(data)-keep])
			}
			c.output(i, data[:len(data)-keep])
			if keep > 0 {
				p.hold[i] = append([]byte(nil), data[len(data)-keep:]...)
			}
			return
		}
		c.output(i, data[:j])
		rest := data[j:]
		if len(rest) < markerLen {
			if eof {
				c.output(i, rest)
			} else {
				p.hold[i] = append([]byte(nil), rest...)
			}
			return
		}
		tok := rest[len(syncPrefix) : markerLen-1]
		if rest[markerLen-1] != 0 || !isHex(tok) {
			c.output(i, rest[:1]) // a NUL that starts no marker
			data = rest[1:]
			continue
		}
		data = rest[markerLen:]
		if string(tok) != c.token {
			continue // a stale marker of an earlier cell
		}
		c.seen[i]++
		c.drainPending(false)
		if !c.done && c.acked[i] < c.seen[i] {
			c.blocked[i] = true
			if len(data) > 0 {
				p.hold[i] = append([]byte(nil), data...)
			}
			return
		}
	}
}

// partialPrefix returns the length of the longest suffix of data that is a
// proper prefix of prefix.
func partialPrefix(data, prefix []byte) int {
	n := len(prefix) - 1
	if n > len(data) {
		n = len(data)
	}
	for ; n > 0; n-- {
		if bytes.HasSuffix(data, prefix[:n]) {
			return n
		}
	}
	return 0
}

// incompleteRune returns the length of an incomplete UTF-8 sequence at the
// end of data (0 to 3).
func incompleteRune(data []byte) int {
	for k := 1; k <= 3 && k <= len(data); k++ {
		b := data[len(data)-k]
		if utf8.RuneStart(b) {
			if b >= 0xC0 && !utf8.FullRune(data[len(data)-k:]) {
				return k
			}
			return 0
		}
	}
	return 0
}

func isHex(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// output delivers user output under the cap.
func (c *cell) output(i int, b []byte) {
	if len(b) == 0 {
		return
	}
	if c.startup {
		if i == 1 && len(c.diag) < 4096 {
			c.diag = append(c.diag, b[:min(len(b), 4096-len(c.diag))]...)
		}
		return
	}
	room := c.maxOutput - c.used
	if room <= 0 {
		c.res.Truncated = true
		return
	}
	if len(b) > room {
		cut := room
		for cut > 0 && !utf8.RuneStart(b[cut]) && room-cut < 3 {
			cut--
		}
		b = b[:cut]
		c.res.Truncated = true
	}
	c.used += len(b)
	s := string(b)
	if i == 0 {
		c.stdout.WriteString(s)
		c.res.Stdout = c.stdout.String()
	} else {
		c.stderr.WriteString(s)
		c.res.Stderr = c.stderr.String()
	}
	if c.emit != nil && s != "" {
		c.emit(Output{Type: streamNames[i], Text: s})
	}
}

// drainPending handles the messages whose markers have been read (all of
// them if force), and lets blocked streams go on once their markers are
// covered.
func (c *cell) drainPending(force bool) {
handle:
	for len(c.pending) > 0 && !c.done {
		m := c.pending[0]
		current := m.N == c.n // else sent for an earlier cell, from a thread
		if !force && current {
			for i := 0; i < 2; i++ {
				if m.Sync[i] > c.seen[i] && !c.p.eof[i] {
					break handle
				}
			}
		}
		c.pending[0] = kmsg{}
		c.pending = c.pending[1:]
		if current {
			for i := 0; i < 2; i++ {
				c.acked[i] = max(c.acked[i], m.Sync[i])
			}
		}
		c.handle(m)
	}
	for i := 0; i < 2; i++ {
		if c.blocked[i] && (c.done || c.acked[i] >= c.seen[i]) {
			c.blocked[i] = false
			c.feed(i, nil, c.p.eof[i])
		}
	}
}

func (c *cell) handle(m kmsg) {
	switch m.Type {
	case "ready":
		if c.startup {
			c.done = true
		}
	case "oversize":
		c.res.Truncated = true
	case "result":
		if c.startup || len(m.Data) == 0 {
			return
		}
		if m.Truncated {
			c.res.Truncated = true
		}
		size := 0
		for k, v := range m.Data {
			size += len(k) + len(v)
		}
		if size > c.resBudget {
			c.res.Truncated = true
			return
		}
		c.resBudget -= size
		if m.Main {
			c.res.MainResult = len(c.res.Results)
		}
		c.res.Results = append(c.res.Results, m.Data)
		if c.emit != nil {
			c.emit(Output{Type: "result", Text: m.Data["text/plain"], Data: m.Data, Main: m.Main})
		}
	case "error":
		if !c.startup {
			mm := m
			c.errMsg = &mm
		}
	case "end":
		if c.startup || m.N != c.n {
			return // a duplicate end after a bash nudge
		}
		c.done = true
		c.setError(c.endError(m))
	}
}

// endError is the error of a cell that ended normally.
func (c *cell) endError(end kmsg) *ExecError {
	var e *ExecError
	interrupted := false
	if m := c.errMsg; m != nil {
		e = &ExecError{Name: m.Name, Value: m.Value, Traceback: m.Traceback}
		interrupted = m.Interrupted
	}
	if end.Status != nil && *end.Status != 0 && e == nil {
		if c.stepT != nil {
			interrupted = true
			e = &ExecError{Name: "KeyboardInterrupt", Value: "the command was interrupted"}
		} else {
			e = &ExecError{Name: "ExitStatus", Value: fmt.Sprintf("exit status %d", *end.Status)}
		}
	}
	if c.reason == "timeout" || interrupted && e != nil && e.Name == "TimeoutError" {
		te := &ExecError{Name: "TimeoutError", Value: c.timeoutText()}
		if e != nil && interrupted {
			te.Traceback = e.Traceback
		}
		return te
	}
	if interrupted {
		e.Name = "KeyboardInterrupt"
	}
	return e
}

func (c *cell) timeoutText() string {
	return fmt.Sprintf("the cell did not finish within its timeout of %s and was interrupted", c.timeout)
}

func (c *cell) setError(e *ExecError) {
	if e == nil {
		return
	}
	c.res.Error = e
	if c.emit != nil {
		c.emit(Output{Type: "error", Text: e.Error(), Error: e})
	}
}

// finishDead ends a cell whose kernel died.
func (c *cell) finishDead() error {
	c.drainPending(true)
	if c.done { // it ended before dying
		return c.ctxErr
	}
	c.died = true
	for i := range c.p.hold {
		c.blocked[i] = false
		c.feed(i, nil, true)
	}
	lang := c.k.cfg.Language
	reason, detail := c.p.reason()
	if c.startup {
		msg := fmt.Sprintf("interp: the %s kernel exited during start-up (%s)", lang, c.p.exitDescription())
		if reason == killProtocol {
			msg = fmt.Sprintf("interp: the %s kernel failed during start-up: %s", lang, detail)
		}
		if d := strings.TrimSpace(string(c.diag)); d != "" {
			msg += ": " + d
		}
		return fmt.Errorf("%s", msg)
	}
	lost := "its state is lost and the next cell runs in a fresh kernel"
	var e *ExecError
	var err error
	switch reason {
	case killInterrupt:
		e = &ExecError{Name: "KeyboardInterrupt"}
		prefix := "the cell was interrupted"
		if c.reason == "timeout" {
			e.Name = "TimeoutError"
			prefix = fmt.Sprintf("the cell did not finish within its timeout of %s", c.timeout)
		}
		e.Value = fmt.Sprintf("%s but did not stop within %s, so the %s kernel was killed; %s", prefix, c.k.cfg.KillAfter, lang, lost)
	case killRestart:
		e = &ExecError{Name: "KernelRestarted", Value: "the kernel was restarted while the cell ran; its state is lost"}
	case killClose:
		e = &ExecError{Name: "KernelDied", Value: "the kernel was closed while the cell ran"}
		err = ErrClosed
	case killProtocol:
		e = &ExecError{Name: "KernelDied", Value: fmt.Sprintf("the %s kernel was killed because %s; %s", lang, detail, lost)}
	default:
		e = &ExecError{Name: "KernelDied", Value: fmt.Sprintf("the %s kernel died (%s); %s", lang, c.p.exitDescription(), lost)}
	}
	c.setError(e)
	if err == nil {
		err = c.ctxErr
	}
	return err
}
