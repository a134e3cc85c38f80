package egress

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"
)

// serveHTTP serves an HTTP proxy connection: absolute-URI requests, each
// judged on its own, until a CONNECT turns the connection into a tunnel.
func (s *session) serveHTTP() {
	br := bufio.NewReader(s.client)
	var fw *forward
	defer func() { fw.close(s) }()
	client := &bufConn{Conn: s.client, r: br}
	for {
		s.client.SetReadDeadline(time.Now().Add(s.p.cfg.HandshakeTimeout))
		req, err := http.ReadRequest(br)
		if err != nil {
			if !isClosedErr(err) && !isTimeout(err) {
				rec := &Record{SandboxID: s.id, Time: time.Now(), Protocol: "http"}
				rec.Reason = "denied: malformed proxy request: " + err.Error()
				writeHTTPError(s.client, http.StatusBadRequest, rec.Reason)
				s.finish(rec, nil)
			}
			return
		}
		s.client.SetReadDeadline(time.Time{})
		if req.Method == http.MethodConnect {
			fw.close(s)
			fw = nil
			s.handleConnect(req, br)
			return
		}
		if !s.handleForward(req, client, &fw) {
			return
		}
	}
}

// handleConnect serves a CONNECT request: a raw tunnel, or an intercepted
// one when the destination has a secret.
func (s *session) handleConnect(req *http.Request, br *bufio.Reader) {
	rec := &Record{SandboxID: s.id, Time: time.Now(), Host: req.Host, Protocol: "connect"}
	host, portStr, err := net.SplitHostPort(req.Host)
	var port uint16
	if err == nil {
		port, err = parsePort(portStr)
	}
	if err != nil {
		rec.Reason = fmt.Sprintf("denied: CONNECT needs host:port, got %q", req.Host)
		writeHTTPError(s.client, http.StatusBadRequest, rec.Reason)
		s.finish(rec, nil)
		return
	}
	rec.Port = int(port)
	t, err := parseTarget(host)
	if err != nil {
		rec.Reason = "denied: " + err.Error()
		writeHTTPError(s.client, http.StatusBadRequest, rec.Reason)
		s.finish(rec, nil)
		return
	}
	rec.Host = t.display()
	up, fail, reason := s.connect(t, int(port), rec)
	if up == nil {
		writeHTTPError(s.client, failStatus(fail), reason)
		s.finish(rec, nil)
		return
	}
	defer s.finish(rec, up)
	if _, err := io.WriteString(s.client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	client := &bufConn{Conn: s.client, r: br}
	if inj := s.sb.injectionFor(t, int(port)); inj != nil {
		rec.Protocol += "+inject"
		s.intercept(client, up, t, int(port), inj, rec)
		return
	}
	relay(client, up)
}

// forward is the upstream connection of absolute-URI requests, kept while
// consecutive requests go to the same destination under the same policy.
type forward struct {
	t    target
	port int
	m    *matcher
	up   *meteredConn
	ur   *bufio.Reader
	rec  *Record
}

func (fw *forward) close(s *session) {
	if fw != nil {
		s.finish(fw.rec, fw.up)
	}
}

// handleForward serves one absolute-URI request and reports whether the
// client connection may carry another.
func (s *session) handleForward(req *http.Request, client net.Conn, fwp **forward) bool {
	if req.URL.Scheme != "http" || req.URL.Host == "" {
		rec := &Record{SandboxID: s.id, Time: time.Now(), Host: req.URL.Hostname(), Protocol: "http"}
		switch {
		case req.URL.Scheme == "https":
			rec.Reason = "denied: send https:// requests through a CONNECT tunnel (HTTPS_PROXY), not as absolute URIs"
		case req.URL.Host == "":
			rec.Reason = "denied: this is a proxy; send absolute-URI requests (GET http://host/path) or CONNECT host:port"
		default:
			rec.Reason = fmt.Sprintf("denied: scheme %q is not supported; use http:// or CONNECT", req.URL.Scheme)
		}
		writeHTTPError(s.client, http.StatusBadRequest, rec.Reason)
		s.finish(rec, nil)
		return false
	}
	port := 80
	if ps := req.URL.Port(); ps != "" {
		p, err := parsePort(ps)
		if err != nil {
			rec := &Record{SandboxID: s.id, Time: time.Now(), Host: req.URL.Hostname(), Protocol: "http"}
			rec.Reason = "denied: " + err.Error()
			writeHTTPError(s.client, http.StatusBadRequest, rec.Reason)
			s.finish(rec, nil)
			return false
		}
		port = int(p)
	}
	t, err := parseTarget(req.URL.Hostname())
	if err != nil {
		rec := &Record{SandboxID: s.id, Time: time.Now(), Host: req.URL.Hostname(), Port: port, Protocol: "http"}
		rec.Reason = "denied: " + err.Error()
		writeHTTPError(s.client, http.StatusBadRequest, rec.Reason)
		s.finish(rec, nil)
		return false
	}
	var m *matcher
	if s.sb != nil {
		m = s.sb.policy.Load()
	}
	fw := *fwp
	if fw != nil && (fw.t != t || fw.port != port || fw.m != m) {
		fw.close(s)
		fw, *fwp = nil, nil
	}
	if fw == nil {
		rec := s.newRecord(t, port, "http")
		up, fail, reason := s.connect(t, port, rec)
		if up == nil {
			writeHTTPError(s.client, failStatus(fail), reason)
			s.finish(rec, nil)
			return false
		}
		fw = &forward{t: t, port: port, m: m, up: up, ur: bufio.NewReader(up), rec: rec}
		*fwp = fw
	}
	inj := s.sb.injectionFor(t, port)
	if inj != nil && !strings.HasSuffix(fw.rec.Protocol, "+inject") {
		fw.rec.Protocol += "+inject"
	}
	// The absolute URI names the destination; a different Host header
	// must not steer the request elsewhere (RFC 9112, section 3.2.2).
	req.Host = req.URL.Host
	keep, err := s.exchange(client, req, fw.up, fw.ur, inj)
	if err != nil {
		fw.rec.Reason += "; " + err.Error()
	}
	if !keep {
		fw.close(s)
		*fwp = nil
	}
	return keep
}

// exchange forwards one request to the upstream connection, relays the
// response and reports whether both connections may carry another. A 101
// Switching Protocols response turns them into a raw tunnel, so client
// must read through the buffer the request was read from.
func (s *session) exchange(client net.Conn, req *http.Request, up net.Conn, ur *bufio.Reader, inj *injection) (bool, error) {
	prepareRequest(req, inj)
	if expectsContinue(req) {
		req.Header.Del("Expect")
		if _, err := io.WriteString(client, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return false, nil
		}
	}
	if err := req.Write(up); err != nil {
		writeHTTPError(client, http.StatusBadGateway, "egress: sending the request upstream failed: "+err.Error())
		return false, fmt.Errorf("write request upstream: %w", err)
	}
	var resp *http.Response
	for {
		var err error
		resp, err = http.ReadResponse(ur, req)
		if err != nil {
			writeHTTPError(client, http.StatusBadGateway, "egress: reading the upstream response failed: "+err.Error())
			return false, fmt.Errorf("read response: %w", err)
		}
		// Interim responses (103 Early Hints) are dropped; 101 is final.
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		resp.Body.Close()
	}
	defer resp.Body.Close()
	upgrade := resp.StatusCode == http.StatusSwitchingProtocols
	removeHopHeaders(resp.Header, upgrade)
	inj.scrub(resp)
	if err := resp.Write(client); err != nil {
		return false, nil
	}
	if upgrade {
		relay(client, &bufConn{Conn: up, r: ur})
		return false, nil
	}
	return !req.Close && !resp.Close, nil
}

// hopHeaders are the hop-by-hop headers a proxy must not forward.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// removeHopHeaders drops hop-by-hop headers; for an upgrade it keeps
// "Connection: Upgrade" and the Upgrade header.
func removeHopHeaders(h http.Header, upgrade bool) {
	up := h.Get("Upgrade")
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
	if upgrade && up != "" {
		h.Set("Connection", "Upgrade")
		h.Set("Upgrade", up)
	}
}

// prepareRequest turns a request read from the sandbox into the one sent
// upstream.
func prepareRequest(req *http.Request, inj *injection) {
	upgrade := headerHasToken(req.Header, "Connection", "upgrade") && req.Header.Get("Upgrade") != ""
	removeHopHeaders(req.Header, upgrade)
	if _, ok := req.Header["User-Agent"]; !ok {
		// Keep Request.Write from adding Go's default User-Agent.
		req.Header["User-Agent"] = []string{""}
	}
	inj.apply(req)
}

func expectsContinue(req *http.Request) bool {
	return headerHasToken(req.Header, "Expect", "100-continue")
}

func headerHasToken(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(textproto.TrimString(f), token) {
				return true
			}
		}
	}
	return false
}

// failStatus maps a connect failure to an HTTP status.
func failStatus(f failure) int {
	if f == failDenied {
		return http.StatusForbidden
	}
	return http.StatusBadGateway
}

// writeHTTPError writes a plain-text error response that closes the
// connection. The program sees the reason in the status line (which many
// clients print, e.g. Python's "Tunnel connection failed: 403 airlock: ...")
// and in the body, as "airlock: ..." so it cannot read as success; the
// header X-Airlock-Deny-Reason (refusals) or X-Airlock-Error carries the
// reason in the network log's wording.
func writeHTTPError(w io.Writer, status int, reason string) {
	hdr := "X-Airlock-Error"
	if status == http.StatusForbidden || status == http.StatusBadRequest || status == http.StatusMisdirectedRequest {
		hdr = "X-Airlock-Deny-Reason"
	}
	msg := clientReason(reason)
	body := msg + "\n"
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n%s: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, headerSafe(msg), hdr, headerSafe(reason), len(body), body)
}

// clientReason is reason as the program in the sandbox sees it: prefixed
// "airlock: " instead of the log's "denied: " or "egress: ".
func clientReason(reason string) string {
	for _, p := range []string{"denied: ", "egress: ", "airlock: "} {
		if r, ok := strings.CutPrefix(reason, p); ok {
			return "airlock: " + r
		}
	}
	return "airlock: " + reason
}

// headerSafe makes s fit in one header line.
func headerSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r >= 0x80 {
			return '?'
		}
		return r
	}, s)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// hostMatches reports whether a request's Host header names the tunnel's
// destination t:port (the port may be left out).
func hostMatches(host string, t target, port int) bool {
	h, p, err := net.SplitHostPort(host)
	if err != nil {
		h, p = host, ""
	}
	rt, err := parseTarget(h)
	if err != nil || rt.name != t.name || rt.name == "" && rt.addr.Unmap() != t.addr.Unmap() {
		return false
	}
	return p == "" || p == strconv.Itoa(port)
}
