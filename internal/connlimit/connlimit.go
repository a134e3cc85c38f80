// Package connlimit bounds what clients of `airlock serve` can hold open:
// connections in total (golang.org/x/net/netutil.LimitListener) and per
// client address (Listener), and request bodies that stop arriving
// (BodyIdle). docs/api.md (Server operations) describes the flags that set them.
package connlimit

import (
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/net/netutil"
	"golang.org/x/time/rate"
)

// Config configures Listen.
type Config struct {
	// Max is the most connections open at once (required, > 0); beyond
	// it, new connections wait in the kernel's accept queue until one
	// closes.
	Max int
	// PerAddr is the most connections one client address (an IPv4
	// address, an IPv6 /64) may hold open at once; beyond it a new
	// connection from that address is closed as soon as it is accepted.
	// Zero: no per-address cap.
	PerAddr int
	// Logf, if set, is told (at most every 10 seconds per kind) when a
	// cap turns connections away or makes them wait.
	Logf func(format string, args ...any)
}

// Listen returns ln with cfg's caps.
func Listen(ln net.Listener, cfg Config) net.Listener {
	l := &listener{Listener: ln, cfg: cfg, open: map[string]int{},
		fullLog: rate.Sometimes{Interval: logEvery}, addrLog: rate.Sometimes{Interval: logEvery}}
	if l.cfg.Logf == nil {
		l.cfg.Logf = func(string, ...any) {}
	}
	return netutil.LimitListener(l, cfg.Max)
}

// listener enforces Config.PerAddr and reports Config.Max being reached;
// netutil.LimitListener around it enforces Max.
type listener struct {
	net.Listener
	cfg Config

	mu    sync.Mutex
	open  map[string]int // per client address
	total int

	fullLog, addrLog rate.Sometimes
}

// Accept returns the next connection whose address is under its cap,
// closing the ones that are not.
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := addrKey(c.RemoteAddr())
		l.mu.Lock()
		if l.cfg.PerAddr > 0 && l.open[key] >= l.cfg.PerAddr {
			l.mu.Unlock()
			c.Close()
			l.addrLog.Do(func() {
				l.cfg.Logf("connection from %s refused: it already holds %d connections (--max-conns-per-ip)", key, l.cfg.PerAddr)
			})
			continue
		}
		l.open[key]++
		l.total++
		full := l.total >= l.cfg.Max
		l.mu.Unlock()
		if full {
			l.fullLog.Do(func() {
				l.cfg.Logf("connection cap reached: %d connections open (--max-conns); new connections wait until one closes", l.cfg.Max)
			})
		}
		return &conn{Conn: c, l: l, key: key}, nil
	}
}

func (l *listener) release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
}

// addrKey is the client address a connection counts against (ClientKey).
func addrKey(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	return ClientKey(ta.IP)
}

// ClientKey is the client address that caps count against: an IPv4
// address, or an IPv6 address's /64 (what one subscriber is usually given).
func ClientKey(ip net.IP) string {
	if ip4 := ip.To4(); ip4 != nil {
		return ip4.String()
	}
	return (&net.IPNet{IP: ip.Mask(net.CIDRMask(64, 128)), Mask: net.CIDRMask(64, 128)}).String()
}

type conn struct {
	net.Conn
	l    *listener
	key  string
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.key) })
	return err
}

// logEvery is how often each kind of cap is logged at most.
const logEvery = 10 * time.Second

// BodyIdle returns h with a progress deadline on request bodies: a read of
// the body that gets no byte for idle fails (and the connection is
// closed), however long the whole upload takes. Requests without a body
// (including WebSocket handshakes) are untouched, and once the body has
// been read to its end the connection has no read deadline again.
func BodyIdle(h http.Handler, idle time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if idle <= 0 || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		// Also bounds the server's own discard of a body the handler left
		// unread.
		if rc.SetReadDeadline(time.Now().Add(idle)) != nil {
			h.ServeHTTP(w, r)
			return
		}
		r.Body = &idleBody{ReadCloser: r.Body, rc: rc, idle: idle}
		h.ServeHTTP(w, r)
	})
}

// idleBody moves the connection's read deadline idle ahead after every
// read that got data, and clears it when the body ends.
type idleBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		// The end of the body: the server's background read of the
		// connection may start now, and must not inherit the deadline.
		b.rc.SetReadDeadline(time.Time{})
	case err != nil:
		// A failed read (the deadline passed): the deadline stays, so
		// that the server's discard of the rest fails too and the
		// connection is closed.
	case n > 0:
		b.rc.SetReadDeadline(time.Now().Add(b.idle))
	}
	return n, err
}
