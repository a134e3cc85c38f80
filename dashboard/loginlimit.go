package dashboard

import (
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlock-dev/airlock/internal/connlimit"
)

// Logins each client address may try: LoginBurst at once, then one every
// LoginEvery. Beyond that POST /ui/session answers 429 with Retry-After,
// before looking at the key. Every attempt counts, as it starts (so that
// parallel guesses count too, and a valid key of one's own cannot reset
// the count); a person logs in far less often.
const (
	LoginBurst = 10
	LoginEvery = 6 * time.Second
)

// maxLoginAddrs bounds the addresses whose failures are remembered.
const maxLoginAddrs = 10000

// loginLimits counts login attempts per client address.
type loginLimits struct {
	mu   sync.Mutex
	byIP map[string]*rate.Limiter
}

// clientAddr is the address r came from, as connlimit counts it. Only the
// peer of the TCP connection counts: a forwarding header is the client's
// to choose.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	return connlimit.ClientKey(ip)
}

// take spends one login attempt of addr, before the key is checked. It
// returns the wait until the next attempt when none is left.
func (l *loginLimits) take(addr string) (wait time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byIP == nil {
		l.byIP = map[string]*rate.Limiter{}
	}
	lim := l.byIP[addr]
	if lim == nil {
		if len(l.byIP) >= maxLoginAddrs {
			l.prune()
		}
		lim = rate.NewLimiter(rate.Every(LoginEvery), LoginBurst)
		l.byIP[addr] = lim
	}
	res := lim.Reserve()
	if d := res.Delay(); d > 0 {
		res.Cancel() // a refused attempt costs nothing more
		return d
	}
	return 0
}

// prune forgets addresses whose allowance has refilled, and if that is not
// enough, arbitrary others (an attacker with that many addresses gains
// LoginBurst attempts on each anyway).
func (l *loginLimits) prune() {
	now := time.Now()
	for k, lim := range l.byIP {
		if lim.TokensAt(now) >= LoginBurst {
			delete(l.byIP, k)
		}
	}
	for k := range l.byIP {
		if len(l.byIP) < maxLoginAddrs {
			break
		}
		delete(l.byIP, k)
	}
}
