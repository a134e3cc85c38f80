package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"time"
)

// minMask is the shortest secret (or credential part of one) that the
// proxy masks in responses; shorter strings would hit innocent bytes.
const minMask = 8

// secret is a validated Secret.
type secret struct {
	host   rule
	header string // canonical header name
	value  string
}

// injection is the set of secrets that apply to one destination.
type injection struct {
	secrets []secret
	// masks are the strings scrubbed from responses: every value and, for
	// values like "Bearer TOKEN", the part after the last space.
	masks [][]byte
}

// forbiddenHeaders are headers a secret may not set: the proxy manages
// them, or they would change how the request is framed or routed.
var forbiddenHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Proxy-Connection": true, "Keep-Alive": true, "Te": true, "Trailer": true, "Upgrade": true,
	"Expect": true, "Proxy-Authorization": true,
}

func compileSecrets(in []Secret) ([]secret, error) {
	var errs []error
	out := make([]secret, 0, len(in))
	for i, s := range in {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("secrets[%d] (host %q): %s", i, s.Host, fmt.Sprintf(format, args...)))
		}
		r, err := parseRule(s.Host)
		if err != nil {
			bad("%v", err)
			continue
		}
		if r.kind == kindPrefix {
			bad("the host must be a name, *.wildcard or IP address, not a CIDR block")
			continue
		}
		if !isToken(s.Header) {
			bad("header %q is not a valid header name", s.Header)
			continue
		}
		h := textproto.CanonicalMIMEHeaderKey(s.Header)
		if forbiddenHeaders[h] {
			bad("header %s is managed by the proxy and cannot be injected", h)
			continue
		}
		if s.Value == "" {
			bad("empty value")
			continue
		}
		if strings.ContainsFunc(s.Value, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }) {
			bad("the value contains control characters (CR, LF, NUL...)")
			continue
		}
		out = append(out, secret{host: r, header: h, value: s.Value})
	}
	return out, errors.Join(errs...)
}

// isToken reports whether s is an HTTP token (RFC 9110, section 5.6.2).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// injectionFor returns the secrets for t:port, or nil if there are none.
func (sb *sandbox) injectionFor(t target, port int) *injection {
	if sb == nil {
		return nil
	}
	var inj *injection
	a := t.addr.Unmap()
	for _, s := range sb.secrets {
		ok := s.host.portOK(port) && (t.name != "" && s.host.matchName(t.name) || t.name == "" && s.host.matchAddr(a))
		if !ok {
			continue
		}
		if inj == nil {
			inj = &injection{}
		}
		inj.secrets = append(inj.secrets, s)
		inj.addMask(s.value)
		if i := strings.LastIndexByte(s.value, ' '); i >= 0 {
			inj.addMask(s.value[i+1:])
		}
	}
	return inj
}

func (inj *injection) addMask(m string) {
	if len(m) < minMask {
		return
	}
	for _, have := range inj.masks {
		if string(have) == m {
			return
		}
	}
	inj.masks = append(inj.masks, []byte(m))
}

// apply sets the injected headers on req, replacing whatever the sandbox
// sent under those names. It also drops Accept-Encoding so that the
// response arrives uncompressed and scrub can see an echoed secret.
func (inj *injection) apply(req *http.Request) {
	if inj == nil {
		return
	}
	for _, s := range inj.secrets {
		req.Header[s.header] = []string{s.value}
	}
	req.Header.Del("Accept-Encoding")
}

// scrub removes the secrets from a response: header values are redacted
// and an uncompressed body is masked byte for byte (same length, so the
// framing holds). Compressed bodies and other encodings of the secret are
// beyond it; it is a safety net for upstreams that echo requests.
func (inj *injection) scrub(resp *http.Response) {
	if inj == nil || len(inj.masks) == 0 {
		return
	}
	for k, vs := range resp.Header {
		for i, v := range vs {
			for _, m := range inj.masks {
				v = strings.ReplaceAll(v, string(m), "[redacted by airlock]")
			}
			vs[i] = v
		}
		resp.Header[k] = vs
	}
	resp.Trailer = nil // not scrubbed, so not forwarded
	if ce := resp.Header.Get("Content-Encoding"); ce == "" || strings.EqualFold(ce, "identity") {
		resp.Body = newMasker(resp.Body, inj.masks)
	}
}

// masker overwrites every occurrence of its patterns in a stream with '*'.
// It holds back the last (longest pattern - 1) bytes until more arrive, so
// a pattern split across reads is still caught.
type masker struct {
	src  io.ReadCloser
	pats [][]byte
	keep int
	buf  []byte // masked bytes not yet returned
	tmp  []byte
	err  error // sticky error of src, returned once buf is drained
}

func newMasker(src io.ReadCloser, pats [][]byte) *masker {
	// Longest first, so "Bearer TOKEN" is masked whole before TOKEN.
	pats = slices.Clone(pats)
	slices.SortStableFunc(pats, func(a, b []byte) int { return len(b) - len(a) })
	m := &masker{src: src, pats: pats, tmp: make([]byte, 32<<10)}
	for _, p := range pats {
		m.keep = max(m.keep, len(p)-1)
	}
	return m
}

func (m *masker) Read(p []byte) (int, error) {
	for {
		ready := len(m.buf) - m.keep
		if m.err != nil {
			ready = len(m.buf)
		}
		if ready > 0 {
			n := copy(p, m.buf[:ready])
			m.buf = m.buf[n:]
			return n, nil
		}
		if m.err != nil {
			return 0, m.err
		}
		n, err := m.src.Read(m.tmp)
		old := len(m.buf)
		m.buf = append(m.buf, m.tmp[:n]...)
		for _, pat := range m.pats {
			for from := max(0, old-len(pat)+1); ; {
				i := bytes.Index(m.buf[from:], pat)
				if i < 0 {
					break
				}
				for j := from + i; j < from+i+len(pat); j++ {
					m.buf[j] = '*'
				}
				from += i + len(pat)
			}
		}
		if err != nil {
			m.err = err
		}
	}
}

func (m *masker) Close() error { return m.src.Close() }

// intercept serves a tunnel to a destination with secrets. A TLS client is
// answered with a certificate from the sandbox's CA and its requests are
// forwarded over a verified TLS connection to the destination; a plain
// HTTP client is served the same way without TLS. Anything else is relayed
// untouched, without the secrets.
func (s *session) intercept(client *bufConn, up *meteredConn, t target, port int, inj *injection, rec *Record) {
	s.client.SetReadDeadline(time.Now().Add(s.p.cfg.HandshakeTimeout))
	first, err := client.r.Peek(1)
	if err != nil {
		return
	}
	switch {
	case first[0] == 0x16: // TLS handshake record
	case first[0] >= 'A' && first[0] <= 'Z': // an HTTP method
		s.client.SetReadDeadline(time.Time{})
		s.serveRequests(client, up, t, port, inj, rec)
		return
	default:
		s.client.SetReadDeadline(time.Time{})
		rec.Reason += "; neither TLS nor HTTP: relayed without injection"
		relay(client, up)
		return
	}
	name := t.name
	if name == "" {
		name = t.addr.Unmap().String()
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.p.cfg.DialTimeout)
	defer cancel()
	uc := tls.Client(up, &tls.Config{
		ServerName: name,
		RootCAs:    s.p.cfg.RootCAs,
		NextProtos: []string{"http/1.1"},
		MinVersion: tls.VersionTLS12,
	})
	upErr := uc.HandshakeContext(ctx)
	cert, err := s.sb.ca.leaf(name)
	if err != nil {
		rec.Reason += "; " + err.Error()
		return
	}
	cc := tls.Server(client, &tls.Config{
		Certificates: []tls.Certificate{*cert},
		NextProtos:   []string{"http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	hctx, hcancel := context.WithTimeout(s.ctx, s.p.cfg.HandshakeTimeout)
	err = cc.HandshakeContext(hctx)
	hcancel()
	if err != nil {
		rec.Reason += "; TLS handshake with the sandbox failed: " + err.Error()
		return
	}
	defer cc.Close()
	s.client.SetReadDeadline(time.Time{})
	if upErr != nil {
		msg := fmt.Sprintf("egress: TLS to %s failed: %v", joinHostPort(t.display(), port), upErr)
		rec.Reason += "; " + msg
		// Answer the first request, not before it: a response on an idle
		// connection would be taken for a protocol error.
		cc.SetReadDeadline(time.Now().Add(s.p.cfg.HandshakeTimeout))
		if req, err := http.ReadRequest(bufio.NewReader(cc)); err == nil {
			req.Body.Close()
			writeHTTPError(cc, http.StatusBadGateway, msg)
		}
		return
	}
	s.serveRequests(&bufConn{Conn: cc, r: bufio.NewReader(cc)}, uc, t, port, inj, rec)
}

// serveRequests forwards HTTP/1.1 requests from client to up, with the
// secrets added, until either side ends the keep-alive session.
func (s *session) serveRequests(client *bufConn, up net.Conn, t target, port int, inj *injection, rec *Record) {
	ur := bufio.NewReader(up)
	for {
		client.SetReadDeadline(time.Now().Add(s.p.cfg.HandshakeTimeout))
		req, err := http.ReadRequest(client.r)
		if err != nil {
			return
		}
		client.SetReadDeadline(time.Time{})
		if req.Host == "" {
			req.Host = joinHostPort(t.display(), port)
		}
		if !hostMatches(req.Host, t, port) {
			msg := fmt.Sprintf("denied: Host header %q does not name %s, the destination of this tunnel; the proxy sends injected requests only to the destination it checked",
				req.Host, joinHostPort(t.display(), port))
			rec.Reason += "; " + msg
			writeHTTPError(client, http.StatusMisdirectedRequest, msg)
			return
		}
		if req.Method == http.MethodConnect {
			writeHTTPError(client, http.StatusMethodNotAllowed, "egress: CONNECT inside a tunnel is not supported")
			return
		}
		keep, err := s.exchange(client, req, up, ur, inj)
		if err != nil {
			rec.Reason += "; " + err.Error()
		}
		if !keep {
			return
		}
	}
}
