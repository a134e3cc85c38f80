package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// session is one client connection being served.
type session struct {
	p      *Proxy
	ctx    context.Context
	id     string
	sb     *sandbox // nil for an unknown sandbox
	client net.Conn
	// refuse, when set, is the reason every request on this connection is
	// refused (unknown sandbox, too many connections).
	refuse string

	mu      sync.Mutex
	aborted bool
	ups     []net.Conn // upstream connections, closed by abort
}

// abort ends the session: it closes the client and every upstream
// connection, which unblocks whatever the session is waiting for.
func (s *session) abort() {
	s.mu.Lock()
	s.aborted = true
	ups := s.ups
	s.mu.Unlock()
	s.client.Close()
	for _, c := range ups {
		c.Close()
	}
}

// addUpstream registers c for abort; it reports false (and closes c) if
// the session is already aborted.
func (s *session) addUpstream(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aborted {
		c.Close()
		return false
	}
	s.ups = append(s.ups, c)
	return true
}

// ServeConn serves one connection accepted from a sandbox, speaking kind,
// until it ends; it always closes c. Cancelling ctx, removing the sandbox
// or closing the proxy ends it early. Every attempt on c is reported to
// Config.OnConnection.
//
// c may be any stream, such as the agent's bridge from the sandbox's
// loopback listener. If it implements CloseWrite() error, half-closes are
// passed through tunnels.
func (p *Proxy) ServeConn(ctx context.Context, sandboxID string, c net.Conn, kind Kind) {
	defer c.Close()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	sb := p.sandboxes[sandboxID]
	p.conns[c] = sb
	p.wg.Add(1)
	p.mu.Unlock()
	defer func() {
		p.untrack(c)
		p.wg.Done()
	}()
	s := &session{p: p, ctx: ctx, id: sandboxID, sb: sb, client: c}
	stop := context.AfterFunc(ctx, s.abort)
	defer stop()

	switch {
	case sb == nil:
		s.refuse = fmt.Sprintf("denied: sandbox %q is not registered with the egress proxy", sandboxID)
	default:
		if s.refuse = sb.acquire(); s.refuse == "" {
			defer sb.release()
		}
	}
	switch kind {
	case HTTP:
		s.serveHTTP()
	case SOCKS5:
		s.serveSOCKS()
	default:
		p.log.Error("egress: unknown proxy kind", "sandbox", sandboxID, "kind", kind)
	}
}

// failure is why connect did not produce a connection.
type failure int

const (
	failDenied  failure = iota + 1 // policy, limits
	failResolve                    // the name does not resolve
	failDial                       // no checked address accepted the connection
)

// newRecord starts the record of an attempt.
func (s *session) newRecord(t target, port int, protocol string) *Record {
	return &Record{SandboxID: s.id, Time: time.Now(), Host: t.display(), Port: port, Protocol: protocol}
}

// connect judges the destination, resolves it, checks every address and
// dials the first that accepts. On failure it returns the reason for the
// program (a refusal's reason is also rec.Reason; for a failure to resolve
// or connect, rec.Reason starts with the allow decision, which the
// program's message only adds at its end, so it never reads as success).
func (s *session) connect(t target, port int, rec *Record) (*meteredConn, failure, string) {
	deny := func(reason string) (*meteredConn, failure, string) {
		rec.Allowed, rec.Reason = false, reason
		return nil, failDenied, reason
	}
	if s.refuse != "" {
		return deny(s.refuse)
	}
	if r := s.sb.budgetReason(); r != "" {
		return deny(r)
	}
	m := s.sb.policy.Load()
	d := m.decide(t, port)
	if !d.Allowed {
		return deny(d.Reason)
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.p.cfg.DialTimeout)
	defer cancel()
	var addrs []netip.Addr
	if t.name == "" {
		addrs = []netip.Addr{t.addr}
	} else {
		ips, err := s.p.cfg.Resolver.LookupIP(ctx, t.name)
		if err == nil && len(ips) == 0 {
			err = errors.New("no addresses")
		}
		if err != nil {
			rec.Allowed = true
			rec.Reason = fmt.Sprintf("%s; cannot resolve %s: %v", d.Reason, t.name, err)
			return nil, failResolve, fmt.Sprintf("cannot resolve %s: %v (%s)", t.name, err, d.Reason)
		}
		for _, ip := range ips {
			a, ok := netip.AddrFromSlice(ip)
			if !ok {
				return deny(fmt.Sprintf("denied: %s resolves to a malformed address %v", t.name, ip))
			}
			addrs = append(addrs, a.Unmap())
		}
	}
	// Every address must pass: a name that mixes public and special
	// addresses is refused rather than quietly trimmed.
	rec.Allowed, rec.Reason = true, d.Reason
	for _, a := range addrs {
		ad := m.checkIP(t, port, a)
		if !ad.Allowed {
			return deny(ad.Reason)
		}
		if _, special := classify(a.Unmap()); special {
			rec.Reason += "; " + strings.TrimPrefix(ad.Reason, "allowed: ") // which allow entry let it through
		}
	}
	var dialer net.Dialer
	var errs []error
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a.Unmap(), uint16(port))
		c, err := dialer.DialContext(ctx, "tcp", ap.String())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !s.p.track(c, s.sb) || !s.addUpstream(c) {
			c.Close()
			s.p.untrack(c)
			rec.Reason = d.Reason + "; the connection was closed while dialing"
			return nil, failDial, fmt.Sprintf("the connection to %s was closed while dialing (%s)", ap, d.Reason)
		}
		rec.Addr = ap.String()
		return &meteredConn{Conn: c, sb: s.sb}, 0, ""
	}
	rec.Reason = fmt.Sprintf("%s; cannot connect: %v", d.Reason, errors.Join(errs...))
	return nil, failDial, fmt.Sprintf("cannot connect to %s: %v (%s)", joinHostPort(t.display(), port), oneLine(errors.Join(errs...)), d.Reason)
}

// finish completes rec with the bytes counted on up (may be nil) and
// reports it.
func (s *session) finish(rec *Record, up *meteredConn) {
	if up != nil {
		up.Close()
		s.p.untrack(up.Conn)
		rec.BytesUp, rec.BytesDown = up.up.Load(), up.down.Load()
		if up.overBudget.Load() {
			rec.Reason += fmt.Sprintf("; closed: the sandbox's network budget of %d bytes is used up", s.sb.limits.MaxBytes)
		}
	}
	rec.Duration = time.Since(rec.Time)
	s.p.report(*rec)
}

func (p *Proxy) report(r Record) {
	if r.Allowed {
		p.log.Debug("egress connection", "sandbox", r.SandboxID, "host", r.Host, "port", r.Port, "addr", r.Addr,
			"protocol", r.Protocol, "up", r.BytesUp, "down", r.BytesDown, "duration", r.Duration, "reason", r.Reason)
	} else {
		p.log.Info("egress denied", "sandbox", r.SandboxID, "host", r.Host, "port", r.Port,
			"protocol", r.Protocol, "reason", r.Reason)
	}
	if p.cfg.OnConnection != nil {
		p.cfg.OnConnection(r)
	}
}

// errBudget ends a connection whose sandbox used up its byte budget.
var errBudget = errors.New("egress: sandbox network budget used up")

// meteredConn is an upstream connection that counts its bytes and charges
// them to the sandbox's budget.
type meteredConn struct {
	net.Conn
	sb         *sandbox
	up, down   atomic.Int64
	overBudget atomic.Bool
}

func (m *meteredConn) Write(b []byte) (int, error) {
	n := m.sb.charge(len(b))
	var err error
	if n > 0 {
		n, err = m.Conn.Write(b[:n])
		m.up.Add(int64(n))
	}
	if err == nil && n < len(b) {
		m.overBudget.Store(true)
		err = errBudget
	}
	return n, err
}

func (m *meteredConn) Read(b []byte) (int, error) {
	n, err := m.Conn.Read(b)
	if n > 0 {
		got := m.sb.charge(n)
		m.down.Add(int64(got))
		if got < n {
			m.overBudget.Store(true)
			return got, errBudget
		}
	}
	return n, err
}

func (m *meteredConn) CloseWrite() error { return closeWrite(m.Conn) }

// bufConn is a client connection whose first bytes were already read into r.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *bufConn) CloseWrite() error          { return closeWrite(b.Conn) }

// closeWrite half-closes c if it can.
func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// relay copies between a and b in both directions until both are done,
// passing half-closes through when both sides support them.
func relay(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		pipe(b, a)
		close(done)
	}()
	pipe(a, b)
	<-done
}

// pipe copies src to dst. At EOF it half-closes dst; on an error, or if dst
// cannot be half-closed, it closes both.
func pipe(dst, src net.Conn) {
	bp := bufPool.Get().(*[]byte)
	_, err := io.CopyBuffer(writerOnly{dst}, readerOnly{src}, *bp)
	bufPool.Put(bp)
	if err == nil && closeWrite(dst) == nil {
		return
	}
	dst.Close()
	src.Close()
}

type writerOnly struct{ io.Writer }
type readerOnly struct{ io.Reader }

// isClosedErr reports whether err only says the peer went away.
func isClosedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF)
}
