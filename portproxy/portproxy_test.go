package portproxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// TestRelayHeaders: through the relay, airlock's credentials never reach
// the sandbox's server; on the API's origin (Isolate) no cookie crosses
// either way and the answer is a sandboxed document whatever CSP the
// server sets; elsewhere only host-only cookies come back.
func TestRelayHeaders(t *testing.T) {
	var got http.Header
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		w.Header().Add("Set-Cookie", "own=1; Path=/")
		w.Header().Add("Set-Cookie", "wide=1; Domain=example.test; Path=/")
		w.Header().Add("Set-Cookie", "airlock_session=evil; Domain=.example.test")
		w.Header().Set("Clear-Site-Data", `"cookies"`)
		w.Header().Set("Service-Worker-Allowed", "/")
		w.Header().Set("Content-Security-Policy", "default-src *")
		io.WriteString(w, "<script>evil()</script>")
	}))
	defer backend.Close()
	addr := backend.Listener.Addr().String()
	for _, isolate := range []bool{true, false} {
		front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			Serve(w, r, Request{Port: 8000, Isolate: isolate, Drop: []string{"E2b-Sandbox-Id"},
				Dial: func(ctx context.Context) (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, "tcp", addr) },
				Fail: func(w http.ResponseWriter, err error) { t.Errorf("relay: %v", err); w.WriteHeader(502) }})
		}))
		req, _ := http.NewRequest("GET", front.URL+"/page", nil)
		for k, v := range map[string]string{"Authorization": "Bearer al_secret", "X-Airlock-CSRF": "tok", "X-API-Key": "al_k",
			"Proxy-Authorization": "Basic x", "Cookie": "airlock_session=sid; app=1", "E2b-Sandbox-Id": "sb-1", "X-Kept": "yes"} {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		front.Close()
		for _, k := range []string{"Authorization", "X-Airlock-CSRF", "X-API-Key", "Proxy-Authorization", "E2b-Sandbox-Id"} {
			if v := got.Get(k); v != "" {
				t.Errorf("isolate=%v: the sandbox saw %s: %q", isolate, k, v)
			}
		}
		if got.Get("X-Kept") != "yes" {
			t.Errorf("isolate=%v: an ordinary header was dropped: %v", isolate, got)
		}
		cookies := resp.Header.Values("Set-Cookie")
		csp := resp.Header.Values("Content-Security-Policy")
		if isolate {
			if c := got.Get("Cookie"); c != "" {
				t.Errorf("isolated relay passed cookies to the sandbox: %q", c)
			}
			if len(cookies) != 0 || resp.Header.Get("Clear-Site-Data") != "" || resp.Header.Get("Service-Worker-Allowed") != "" {
				t.Errorf("isolated relay passed the sandbox's cookie or storage headers: %v", resp.Header)
			}
			if !slices.Contains(csp, SandboxCSP) || strings.Contains(SandboxCSP, "allow-same-origin") {
				t.Errorf("isolated relay answer is not a sandboxed document: %q", csp)
			}
			continue
		}
		if !slices.Equal(cookies, []string{"own=1; Path=/"}) {
			t.Errorf("host relay: Set-Cookie %q, want only the host-only cookie", cookies)
		}
	}
}
