package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Kind is the protocol a sandbox speaks on a proxied connection.
type Kind int

// Proxy protocols.
const (
	// HTTP is an HTTP/1.1 proxy: absolute-URI requests for http:// URLs
	// and CONNECT tunnels for anything else (notably HTTPS).
	HTTP Kind = iota + 1
	// SOCKS5 is a SOCKS version 5 proxy (RFC 1928): CONNECT only, no
	// authentication, host names and IPv4/IPv6 addresses.
	SOCKS5
)

// String returns "http" or "socks5".
func (k Kind) String() string {
	switch k {
	case HTTP:
		return "http"
	case SOCKS5:
		return "socks5"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Resolver looks up the addresses of a host name. The proxy resolves every
// name itself and dials only addresses it has checked.
type Resolver interface {
	LookupIP(ctx context.Context, host string) ([]net.IP, error)
}

// systemResolver adapts net.DefaultResolver to Resolver.
type systemResolver struct{}

func (systemResolver) LookupIP(ctx context.Context, host string) ([]net.IP, error) {
	return net.DefaultResolver.LookupIP(ctx, "ip", host)
}

// StaticResolver maps host names (lower case, no trailing dot) to fixed
// addresses and knows no other name. Tests and one-shot runs use it to map
// test names such as "allowed.test" to local servers.
type StaticResolver map[string][]net.IP

// LookupIP returns the addresses listed for host.
func (r StaticResolver) LookupIP(_ context.Context, host string) ([]net.IP, error) {
	ips, ok := r[strings.TrimSuffix(strings.ToLower(host), ".")]
	if !ok || len(ips) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return ips, nil
}

// Secret is a header the proxy adds to requests for one host, so that the
// sandbox can use a credential without ever holding it.
type Secret struct {
	// Host is a host name, a wildcard ("*.example.com") or an IP address,
	// optionally with ":port" ("api.example.com:443"), as in Policy.
	Host string `json:"host"`
	// Header is the header name, such as "Authorization".
	Header string `json:"header"`
	// Value is the header value. It never reaches the sandbox.
	Value string `json:"value"`
}

// String describes s without its value.
func (s Secret) String() string {
	return fmt.Sprintf("Secret{Host:%q Header:%q Value:[redacted]}", s.Host, s.Header)
}

// GoString describes s without its value.
func (s Secret) GoString() string { return s.String() }

// LogValue keeps the value out of structured logs.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// Limits caps what one sandbox may use through the proxy.
type Limits struct {
	// MaxConns caps concurrent proxied connections; 0 means no cap.
	MaxConns int `json:"max_conns,omitempty"`
	// MaxBytes caps the bytes exchanged with the outside (sent plus
	// received, over the sandbox's lifetime); 0 means no cap. A connection
	// that crosses it is closed and new ones are refused.
	MaxBytes int64 `json:"max_bytes,omitempty"`
}

// Sandbox is what the proxy knows about one sandbox.
type Sandbox struct {
	// Policy decides where the sandbox may connect; SetPolicy changes it.
	Policy Policy
	// Secrets are the headers to inject. They are fixed for the sandbox's
	// lifetime because the sandbox's CA is constrained to their hosts.
	Secrets []Secret
	// Limits caps the sandbox; zero fields take Config.Limits.
	Limits Limits
	// CA, if set, is the CA to intercept with (see SandboxCA) instead of
	// a new one; it matters only with Secrets.
	CA *SandboxCA
}

// Record describes one proxied connection or refused attempt.
type Record struct {
	SandboxID string
	// Time is when the attempt started.
	Time time.Time
	// Host is the requested host name or IP literal, Port its port.
	Host string
	Port int
	// Addr is the address the proxy dialed ("ip:port"); empty when it did
	// not dial.
	Addr string
	// Allowed is the policy's verdict; a connection can be allowed and
	// still fail (Reason then says why).
	Allowed bool
	Reason  string
	// BytesUp and BytesDown count bytes sent to and received from the
	// destination (including TLS overhead on intercepted connections).
	BytesUp, BytesDown int64
	Duration           time.Duration
	// Protocol is "http" (absolute-URI request), "connect" (HTTP CONNECT
	// tunnel) or "socks5", with "+inject" when the proxy added a secret.
	Protocol string
}

// Config configures a Proxy. The zero value is usable.
type Config struct {
	// Resolver resolves names; nil means net.DefaultResolver.
	Resolver Resolver
	// RootCAs verifies upstream servers on connections the proxy
	// intercepts to inject a secret; nil means the system roots.
	RootCAs *x509.CertPool
	// OnConnection, if set, is called once for every connection and
	// refused attempt when it ends, on the connection's goroutine.
	OnConnection func(Record)
	// Logger receives denials (Info) and connections (Debug); nil means
	// slog.Default().
	Logger *slog.Logger
	// Limits are the defaults for sandboxes that leave a field zero.
	Limits Limits
	// DialTimeout bounds name resolution plus the upstream dial and, when
	// intercepting, the upstream TLS handshake; default 10s.
	DialTimeout time.Duration
	// HandshakeTimeout bounds how long a client may take to send a request
	// (and, when intercepting, to finish its TLS handshake); it is also the
	// idle timeout between keep-alive requests. Default 30s.
	HandshakeTimeout time.Duration
	// CAValidity is how long each sandbox CA is valid; default 30 days.
	CAValidity time.Duration
}

// Proxy is the host-side egress proxy shared by all sandboxes.
type Proxy struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	closed    bool
	sandboxes map[string]*sandbox
	conns     map[net.Conn]*sandbox // every open client and upstream connection
	listeners map[net.Listener]struct{}
	wg        sync.WaitGroup // ServeConn and Serve calls in flight
}

// sandbox is the proxy's state for one sandbox.
type sandbox struct {
	id      string
	policy  atomic.Pointer[matcher]
	secrets []secret
	limits  Limits
	ca      *authority // nil without secrets

	used   atomic.Int64 // bytes exchanged with the outside
	mu     sync.Mutex
	active int // concurrent connections
}

// New returns a proxy with no sandboxes.
func New(cfg Config) *Proxy {
	if cfg.Resolver == nil {
		cfg.Resolver = systemResolver{}
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 30 * time.Second
	}
	if cfg.CAValidity <= 0 {
		cfg.CAValidity = 30 * 24 * time.Hour
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Proxy{
		cfg:       cfg,
		log:       log,
		sandboxes: make(map[string]*sandbox),
		conns:     make(map[net.Conn]*sandbox),
		listeners: make(map[net.Listener]struct{}),
	}
}

// ErrClosed is returned by calls on a closed Proxy.
var ErrClosed = errors.New("egress: proxy closed")

// AddSandbox registers a sandbox. It validates the policy and secrets and,
// when there are secrets, creates the sandbox's CA (see CACertPEM).
func (p *Proxy) AddSandbox(id string, s Sandbox) error {
	if id == "" {
		return errors.New("egress: add sandbox: empty ID")
	}
	m, err := s.Policy.compile()
	if err != nil {
		return fmt.Errorf("egress: add sandbox %q: %w", id, err)
	}
	secs, err := compileSecrets(s.Secrets)
	if err != nil {
		return fmt.Errorf("egress: add sandbox %q: %w", id, err)
	}
	if s.Limits.MaxConns < 0 || s.Limits.MaxBytes < 0 {
		return fmt.Errorf("egress: add sandbox %q: limits must not be negative", id)
	}
	sb := &sandbox{id: id, secrets: secs, limits: s.Limits}
	if sb.limits.MaxConns == 0 {
		sb.limits.MaxConns = p.cfg.Limits.MaxConns
	}
	if sb.limits.MaxBytes == 0 {
		sb.limits.MaxBytes = p.cfg.Limits.MaxBytes
	}
	sb.policy.Store(m)
	if len(secs) > 0 {
		rules := make([]rule, len(secs))
		for i, sec := range secs {
			rules[i] = sec.host
		}
		if s.CA != nil {
			sb.ca, err = parseAuthority(s.CA)
		} else {
			sb.ca, err = newAuthority(id, rules, p.cfg.CAValidity)
		}
		if err != nil {
			return fmt.Errorf("egress: add sandbox %q: %w", id, err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if _, ok := p.sandboxes[id]; ok {
		return fmt.Errorf("egress: add sandbox %q: already registered", id)
	}
	p.sandboxes[id] = sb
	return nil
}

// SetPolicy replaces a sandbox's policy. Connections already established
// keep going; the next connection (and the next request on an HTTP
// keep-alive connection) is judged by the new policy.
func (p *Proxy) SetPolicy(id string, pol Policy) error {
	m, err := pol.compile()
	if err != nil {
		return fmt.Errorf("egress: set policy of %q: %w", id, err)
	}
	sb := p.sandbox(id)
	if sb == nil {
		return fmt.Errorf("egress: set policy of %q: no such sandbox", id)
	}
	sb.policy.Store(m)
	return nil
}

// RemoveSandbox forgets a sandbox and closes its connections.
func (p *Proxy) RemoveSandbox(id string) {
	p.mu.Lock()
	sb := p.sandboxes[id]
	delete(p.sandboxes, id)
	var doomed []net.Conn
	for c, owner := range p.conns {
		if sb != nil && owner == sb {
			doomed = append(doomed, c)
		}
	}
	p.mu.Unlock()
	for _, c := range doomed {
		c.Close()
	}
}

// CACertPEM returns the PEM certificate of the sandbox's CA, to be placed
// in the sandbox's trust store. It is nil for a sandbox without secrets (the
// proxy then never intercepts its connections) or an unknown one. The CA
// may only sign for the secrets' hosts (X.509 name constraints).
func (p *Proxy) CACertPEM(id string) []byte {
	sb := p.sandbox(id)
	if sb == nil || sb.ca == nil {
		return nil
	}
	return append([]byte(nil), sb.ca.CertPEM...)
}

// BytesUsed returns the bytes a sandbox has exchanged through the proxy.
func (p *Proxy) BytesUsed(id string) int64 {
	if sb := p.sandbox(id); sb != nil {
		return sb.used.Load()
	}
	return 0
}

func (p *Proxy) sandbox(id string) *sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sandboxes[id]
}

// Serve accepts connections on l and serves each one as ServeConn does
// until l or the proxy is closed. It returns nil when either was closed.
func (p *Proxy) Serve(l net.Listener, sandboxID string, kind Kind) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.Close()
		return ErrClosed
	}
	p.listeners[l] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.listeners, l)
		p.mu.Unlock()
		p.wg.Done()
	}()
	backoff := 5 * time.Millisecond
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			p.log.Warn("egress: accept", "sandbox", sandboxID, "err", err)
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		go p.ServeConn(context.Background(), sandboxID, c, kind)
	}
}

// Listen listens on the TCP address addr and serves it for one sandbox in
// the background (see Serve). Close the returned listener, or the proxy,
// to stop.
func (p *Proxy) Listen(addr, sandboxID string, kind Kind) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("egress: listen %s: %w", addr, err)
	}
	go p.Serve(l, sandboxID, kind)
	return l, nil
}

// Close stops every listener, closes every connection and waits for the
// connections' goroutines to finish.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	var cs []interface{ Close() error }
	for l := range p.listeners {
		cs = append(cs, l)
	}
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	p.wg.Wait()
	return nil
}

// track registers c as belonging to sb so that RemoveSandbox and Close can
// end it. It reports false if the proxy is closed.
func (p *Proxy) track(c net.Conn, sb *sandbox) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = sb
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// acquire takes a connection slot; it returns a refusal reason when the
// sandbox is at its cap.
func (sb *sandbox) acquire() string {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.limits.MaxConns > 0 && sb.active >= sb.limits.MaxConns {
		return fmt.Sprintf("denied: this sandbox already has %d open connections through the proxy, its limit; close one and retry", sb.active)
	}
	sb.active++
	return ""
}

func (sb *sandbox) release() {
	sb.mu.Lock()
	sb.active--
	sb.mu.Unlock()
}

// charge takes up to n bytes from the sandbox's budget and returns how
// many it got.
func (sb *sandbox) charge(n int) int {
	if n <= 0 {
		return 0
	}
	max := sb.limits.MaxBytes
	if max <= 0 {
		sb.used.Add(int64(n))
		return n
	}
	for {
		cur := sb.used.Load()
		if cur >= max {
			return 0
		}
		got := min(int64(n), max-cur)
		if sb.used.CompareAndSwap(cur, cur+got) {
			return int(got)
		}
	}
}

// budgetReason is the refusal for a sandbox whose byte budget is used up,
// or "" while bytes remain.
func (sb *sandbox) budgetReason() string {
	if max := sb.limits.MaxBytes; max > 0 && sb.used.Load() >= max {
		return fmt.Sprintf("denied: this sandbox has used its network budget of %d bytes", max)
	}
	return ""
}

// ProxyEnv returns the environment that points programs in a sandbox at
// the proxy's listeners on the sandbox's loopback: HTTP_PROXY and
// HTTPS_PROXY (http://127.0.0.1:httpPort), ALL_PROXY
// (socks5h://127.0.0.1:socksPort, so that names are resolved by the
// proxy), NO_PROXY (loopback) and the lower-case forms. A zero port leaves
// its variables out.
func ProxyEnv(httpPort, socksPort int) []string {
	var env []string
	add := func(k, v string) {
		env = append(env, k+"="+v, strings.ToLower(k)+"="+v)
	}
	if httpPort > 0 {
		u := "http://127.0.0.1:" + strconv.Itoa(httpPort)
		add("HTTP_PROXY", u)
		add("HTTPS_PROXY", u)
	}
	if socksPort > 0 {
		add("ALL_PROXY", "socks5h://127.0.0.1:"+strconv.Itoa(socksPort))
	}
	add("NO_PROXY", "localhost,127.0.0.1,::1")
	return env
}
