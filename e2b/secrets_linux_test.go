package e2b

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/manager"
)

// TestSecretsResolvedAtEgress stores a secret through E2B's /secrets,
// names it in a sandbox's network.rules as ${e2b.secrets.NAME}, and checks
// that the egress proxy sends its value to the allowed host while nothing
// inside the sandbox (environment, files, process list) has it; that no
// answer ever carries the value; and that another key can neither see,
// use, update nor delete it.
func TestSecretsResolvedAtEgress(t *testing.T) {
	const value = "s3cret-value-7f3a"
	var mu sync.Mutex
	var seen []string
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("X-Api-Key"))
		mu.Unlock()
		fmt.Fprintln(w, "ok")
	}))
	defer web.Close()
	port := web.URL[strings.LastIndexByte(web.URL, ':')+1:]
	e := newEnvSetup(t, true, envSetup{egress: manager.EgressConfig{Resolver: egress.StaticResolver{"allowed.test": {net.IPv4(127, 0, 0, 1)}}}})

	var sec secretInfo
	r := e.api(t, "POST", "/secrets", e.key, `{"name":"API-Token","value":"`+value+`","metadata":{"team":"a"}}`)
	r.json(t, &sec)
	if r.status != 201 || sec.Name != "api-token" || sec.CurrentVersion != 1 || !strings.HasPrefix(sec.SecretID, "sec_") {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	e.api(t, "POST", "/secrets", e.key, `{"name":"api-token","value":"x"}`).apiErr(t, 409)
	for _, path := range []string{"/secrets", "/secrets/" + sec.SecretID, "/secrets/api-token"} {
		if r := e.api(t, "GET", path, e.key, ""); r.status != 200 || strings.Contains(string(r.body), value) || !strings.Contains(string(r.body), sec.SecretID) {
			t.Fatalf("GET %s: %d %s", path, r.status, r.body)
		}
	}
	// The other key: nothing to see, use, update or delete.
	if r := e.api(t, "GET", "/secrets", e.other, ""); strings.TrimSpace(string(r.body)) != "[]" {
		t.Fatalf("the other key lists %s", r.body)
	}
	for _, ref := range []string{sec.SecretID, "api-token"} {
		e.api(t, "GET", "/secrets/"+ref, e.other, "").apiErr(t, 404)
		e.api(t, "POST", "/secrets/"+ref, e.other, `{"value":"stolen"}`).apiErr(t, 404)
		e.api(t, "DELETE", "/secrets/"+ref, e.other, "").apiErr(t, 404)
	}
	network := `"network":{"denyOut":["0.0.0.0/0"],"allowOut":["allowed.test","127.0.0.1"],"rules":{"allowed.test":[{"transform":{"headers":{"X-Api-Key":"Bearer ${e2b.secrets.api-token}"}}}]}}`
	if msg := e.api(t, "POST", "/v2/sandboxes", e.other, `{"templateID":"base",`+network+`}`).apiErr(t, 400); !strings.Contains(msg, `"api-token"`) {
		t.Fatalf("the other key's create: %q", msg)
	}
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base",`+strings.Replace(network, "api-token", "nope", 1)+`}`).apiErr(t, 400)

	var created sandboxCreated
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base",`+network+`}`).json(t, &created)
	id := created.SandboxID
	sb, err := e.m.Lookup(e.h.mustOwner(t, id), id)
	if err != nil {
		t.Fatal(err)
	}
	run := func(cmd string) string {
		p, err := sb.Agent().Exec(context.Background(), agent.ExecRequest{Shell: cmd})
		if err != nil {
			t.Fatal(err)
		}
		out, stderr, _, st, err := p.Collect(context.Background(), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%d %s%s", st.Code, out, stderr)
	}
	if out := run("curl -fsS -m 20 --noproxy '' http://allowed.test:" + port + "/"); !strings.HasPrefix(out, "0 ok") {
		t.Fatalf("curl through the proxy: %s", out)
	}
	mu.Lock()
	if len(seen) != 1 || seen[0] != "Bearer "+value {
		t.Fatalf("the server saw X-Api-Key %q, want the stored secret", seen)
	}
	mu.Unlock()
	// (The command spells the value in two pieces, so that its own
	// command line does not hold it.)
	if out := run("env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'; grep -rs 's3cret-value''-7f3a' /workspace /tmp /etc; true"); strings.Contains(out, value) {
		t.Fatalf("the secret's value is inside the sandbox: %s", out)
	}
	// Stored on disk for the key only, mode 0600.
	fi, err := os.Stat(e.h.secrets.file(e.h.mustOwner(t, id)))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secrets file: %v %v", fi, err)
	}
	// A new version; the owner deletes it; then it is gone for creates.
	if r := e.api(t, "POST", "/secrets/api-token", e.key, `{"value":"v2"}`); r.status != 200 || !strings.Contains(string(r.body), `"currentVersion":2`) || strings.Contains(string(r.body), "v2\"") {
		t.Fatalf("update: %d %s", r.status, r.body)
	}
	if r := e.api(t, "DELETE", "/secrets/"+sec.SecretID, e.key, ""); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base",`+network+`}`).apiErr(t, 400)
}
