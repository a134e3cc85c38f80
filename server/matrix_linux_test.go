package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
)

// The conformance matrix: every tier x every root x every operation, on
// one real server. A cell either works or is refused with 422 naming the
// capability the tier lacks (runtime/tier.Refuse), and then /v1/info must
// declare the capability false: a tier never differs silently. The
// results are docs/support-matrix.md, which the test compares with what
// it found (AIRLOCK_UPDATE_MATRIX=1 rewrites it), so the doc cannot drift.

// matrixTiers are the tiers of the matrix (wasm runs WASI modules, not a
// shell: its own tests cover it).
var matrixTiers = []string{"native", "gvisor", "microvm"}

// matrixOps are the operations, in the order they run on a sandbox.
var matrixOps = []string{"exec", "files", "python cell", "background process", "pty", "network allowlist + injected header",
	"pause/resume", "snapshot + fork", "server kill -9 + restart"}

// opCaps names the capabilities an operation depends on: the first one
// always, the others on some roots.
var opCaps = map[string][]string{"pause/resume": {"pause"},
	"network allowlist + injected header": {"network"},
	"snapshot + fork":                     {"memory_snapshot", "memory_snapshot_environments", "memory_snapshot_volumes", "fork_with_network"},
	"server kill -9 + restart":            {"adopt_running"}}

// capRe finds the capability a refusal names (runtime/tier.Refuse).
var capRe = regexp.MustCompile(`\(capability ([a-z_]+);`)

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// matrixRoot is a kind of root: what to add to a create.
type matrixRoot struct {
	name string
	cap  string // the capability a create with it needs
	req  func(r *client.CreateRequest)
}

type matrixCell struct{ tier, root, op, result string }

func TestConformanceMatrix(t *testing.T) {
	e := startLocalServers(t)
	reg := it.Registry(t)
	ref := it.Push(t, reg, "matrix/debian:12", it.DebianPython(t))
	e.key = newKey(t, e.state, "matrix")
	e.srv = startServer(t, e.state, append(e.serveArgs(), "--image-registry", reg)...)
	e.c = client.New(e.srv.URL, e.key)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	caps := runtimeCaps(t, e.c)

	if code, v := post(t, e.srv.URL+"/v1/images", e.key, `{"ref":"`+ref+`"}`); code != 200 {
		t.Fatalf("pull: %d %v", code, v)
	}
	tmpl, _ := json.Marshal(map[string]any{"name": "matrix-tmpl:1",
		"dockerfile": "FROM " + ref + "\nRUN mkdir -p /opt/app && echo from-template > /opt/app/marker\n"})
	if code, v := post(t, e.srv.URL+"/v1/templates", e.key, string(tmpl)); code != 201 {
		t.Fatalf("template build: %d %v", code, v)
	}
	if code, v := post(t, e.srv.URL+"/v1/volumes", e.key, `{"name":"matrix","size_bytes":16777216}`); code != 201 {
		t.Fatalf("create volume: %d %v", code, v)
	}
	roots := []matrixRoot{
		{"host default", "", func(*client.CreateRequest) {}},
		{"Debian image (pip)", "image_roots", func(r *client.CreateRequest) { r.Image = ref }},
		{"Dockerfile template", "image_roots", func(r *client.CreateRequest) { r.Image = "matrix-tmpl:1" }},
		{"volume", "volumes", func(r *client.CreateRequest) {
			r.Volumes = []client.VolumeRef{{Name: "matrix", Path: "/data"}}
		}},
	}

	var cells []matrixCell
	record := func(tier, root, op, result string) {
		cells = append(cells, matrixCell{tier, root, op, result})
	}
	// refusal checks that err is the declared refusal of capability c by
	// tier and returns the cell's text; anything else fails the test.
	refusal := func(tier, root, op string, allowed []string, err error) string {
		t.Helper()
		var ae *client.Error
		m := capRe.FindStringSubmatch(errString(err))
		if !errors.As(err, &ae) || ae.Status != 422 || !strings.Contains(ae.Message, "runtime "+tier+" does not support") || m == nil {
			t.Errorf("%s / %s / %s: want a 422 refusal naming a capability, got %v", tier, root, op, err)
			return "FAILED"
		}
		c := m[1]
		ok := false
		for _, a := range allowed {
			ok = ok || a == c
		}
		if !ok {
			t.Errorf("%s / %s / %s: refused for capability %s, not one of %v", tier, root, op, c, allowed)
		}
		if caps[tier].Has(c) {
			t.Errorf("%s / %s / %s: refused for capability %s, which /v1/info declares", tier, root, op, c)
		}
		return "refused (" + c + ")"
	}
	type live struct {
		tier, root, id string
	}
	var alive []live
	for _, tier := range matrixTiers {
		if _, ok := caps[tier]; !ok {
			t.Logf("runtime %s is not available here: its rows are skipped", tier)
			continue
		}
		for _, root := range roots {
			req := client.CreateRequest{Runtime: tier, Timeout: 1200}
			root.req(&req)
			sb, err := e.c.Create(ctx, req)
			if err != nil {
				res := refusal(tier, root.name, "create", []string{root.cap}, err)
				for _, op := range matrixOps {
					record(tier, root.name, op, res)
				}
				continue
			}
			t.Cleanup(func() { e.c.Kill(context.Background(), sb.ID) })
			for _, op := range matrixOps {
				if op == "server kill -9 + restart" {
					continue // all rows at once, below
				}
				res, err := matrixOp(ctx, e, tier, root, sb.ID, op)
				switch {
				case err == nil:
					if cs := opCaps[op]; len(cs) > 0 && !caps[tier].Has(cs[0]) {
						t.Errorf("%s / %s / %s works, but /v1/info does not declare %s", tier, root.name, op, cs[0])
					}
				case len(opCaps[op]) > 0 && isRefusal(err):
					res = refusal(tier, root.name, op, opCaps[op], err)
				default:
					st, _ := e.c.Get(ctx, sb.ID)
					t.Errorf("%s / %s / %s: %v (sandbox %+v)", tier, root.name, op, err, st)
					res = "FAILED"
				}
				record(tier, root.name, op, res)
			}
			alive = append(alive, live{tier, root.name, sb.ID})
		}
	}

	// Writable host directories, through the CLI (matrix_hostdir_linux_test.go).
	hostDirs := map[string]string{}
	for _, tier := range matrixTiers {
		if _, ok := caps[tier]; ok {
			hostDirs[tier] = matrixHostDir(t, tier, caps[tier], cells)
		}
	}

	// Server kill -9 and restart: a tier that declares adopt_running keeps
	// every sandbox with its files and processes; one that does not
	// records each as lost, saying why.
	e.srv.crash()
	e.srv = startServer(t, e.state, append(e.serveArgs(), "--image-registry", reg)...)
	e.c = client.New(e.srv.URL, e.key)
	for _, l := range alive {
		op := "server kill -9 + restart"
		sb, err := e.c.Get(ctx, l.id)
		switch {
		case err != nil:
			t.Errorf("%s / %s / %s: %v", l.tier, l.root, op, err)
			record(l.tier, l.root, op, "FAILED")
		case caps[l.tier].AdoptRunning:
			res, err := e.c.Exec(ctx, l.id, client.ExecRequest{Shell: "cat /workspace/matrix.txt", Timeout: 60})
			if err == nil {
				err = backgroundAlive(ctx, e.c, l.id)
			}
			if sb.State != "running" || err != nil || res.Stdout != "matrix\n" {
				t.Errorf("%s / %s / %s: %+v, exec %+v %v", l.tier, l.root, op, sb, res, err)
				record(l.tier, l.root, op, "FAILED")
				continue
			}
			record(l.tier, l.root, op, "ok")
		default:
			if sb.State == "running" || sb.EndReason == "" {
				t.Errorf("%s / %s / %s: not declared adopt_running, yet %+v", l.tier, l.root, op, sb)
				record(l.tier, l.root, op, "FAILED")
				continue
			}
			record(l.tier, l.root, op, "lost, with its reason (adopt_running)")
		}
	}
	checkMatrixDoc(t, cells, hostDirs)
}

// backgroundAlive checks that the row's background process runs.
func backgroundAlive(ctx context.Context, c *client.Client, id string) error {
	ps, err := c.Processes(ctx, id)
	if err != nil {
		return err
	}
	for _, p := range ps {
		if p.Tag == "matrix-bg" && p.Running {
			return nil
		}
	}
	return fmt.Errorf("background process not running: %+v", ps)
}

// isRefusal reports whether err is a 422 capability refusal.
func isRefusal(err error) bool {
	var ae *client.Error
	return errors.As(err, &ae) && ae.Status == 422 && strings.Contains(ae.Message, "does not support")
}

// runtimeCaps reads /v1/info's runtime_capabilities.
func runtimeCaps(t *testing.T, c *client.Client) map[string]client.RuntimeCaps {
	t.Helper()
	info, err := c.Info(ctxT(t))
	if err != nil || len(info.RuntimeCapabilities) == 0 {
		t.Fatalf("/v1/info: %+v %v", info, err)
	}
	return info.RuntimeCapabilities
}

// matrixOp runs one operation on sandbox id and checks its effect. It
// returns the cell's text ("ok") or the API's error.
func matrixOp(ctx context.Context, e *netEnv, tier string, mr matrixRoot, id, op string) (string, error) {
	c, root := e.c, mr.name
	check := func(what, got, want string) error {
		if got != want {
			return fmt.Errorf("%s: got %q, want %q", what, got, want)
		}
		return nil
	}
	switch op {
	case "exec":
		res, err := c.Exec(ctx, id, client.ExecRequest{Shell: "echo hi; id -u >/dev/null", Timeout: 60})
		if err != nil {
			return "", err
		}
		if res.ExitCode != 0 {
			return "", fmt.Errorf("exec: %+v", res)
		}
		if err := check("exec", res.Stdout, "hi\n"); err != nil {
			return "", err
		}
		if root == "Dockerfile template" {
			res, err := c.Exec(ctx, id, client.ExecRequest{Shell: "cat /opt/app/marker", Timeout: 60})
			if err != nil {
				return "", err
			}
			if err := check("the template's file", res.Stdout, "from-template\n"); err != nil {
				return "", err
			}
		}
	case "files":
		if _, err := c.WriteFile(ctx, id, "/workspace/matrix.txt", strings.NewReader("matrix\n"), 0o644); err != nil {
			return "", err
		}
		b, err := c.ReadFile(ctx, id, "/workspace/matrix.txt")
		if err != nil {
			return "", err
		}
		if err := check("read back", string(b), "matrix\n"); err != nil {
			return "", err
		}
		if root == "volume" {
			res, err := c.Exec(ctx, id, client.ExecRequest{Shell: "echo " + tier + " > /data/" + tier + " && cat /data/" + tier, Timeout: 60})
			if err != nil {
				return "", err
			}
			if err := check("volume write", res.Stdout, tier+"\n"); err != nil {
				return "", err
			}
		}
	case "python cell":
		if _, err := c.RunCode(ctx, id, client.CodeRequest{Code: "x = 6 * 7"}); err != nil {
			return "", err
		}
		r, err := c.RunCode(ctx, id, client.CodeRequest{Code: "import sys; print(x, sys.version_info[0])"})
		if err != nil {
			return "", err
		}
		if err := check("cell", r.Stdout, "42 3\n"); err != nil {
			return "", err
		}
	case "background process":
		if _, err := c.Start(ctx, id, client.ExecRequest{Shell: "sleep 1200", Tag: "matrix-bg"}); err != nil {
			return "", err
		}
		if err := backgroundAlive(ctx, c, id); err != nil {
			return "", err
		}
	case "pty":
		if err := matrixPty(ctx, c, id); err != nil {
			return "", err
		}
	case "network allowlist + injected header":
		return matrixNetwork(ctx, e, tier, mr)
	case "pause/resume":
		if _, err := c.Pause(ctx, id); err != nil {
			return "", err
		}
		if _, err := c.Resume(ctx, id); err != nil {
			return "", fmt.Errorf("resume: %w", err)
		}
		res, err := c.Exec(ctx, id, client.ExecRequest{Shell: "cat /workspace/matrix.txt", Timeout: 60})
		if err != nil {
			return "", err
		}
		if err := check("after resume", res.Stdout, "matrix\n"); err != nil {
			return "", err
		}
		if err := backgroundAlive(ctx, c, id); err != nil {
			return "", err
		}
		r, err := c.RunCode(ctx, id, client.CodeRequest{Code: "print(x)"})
		if err != nil {
			return "", err
		}
		if err := check("cell after resume", r.Stdout, "42\n"); err != nil {
			return "", err
		}
	case "snapshot + fork":
		snap, err := c.MemorySnapshot(ctx, id)
		if err != nil {
			return "", err
		}
		fork, err := c.Create(ctx, client.CreateRequest{Snapshot: snap.ID, Timeout: 600})
		if err != nil {
			return "", fmt.Errorf("fork: %w", err)
		}
		defer c.Kill(context.Background(), fork.ID)
		res, err := c.Exec(ctx, fork.ID, client.ExecRequest{Shell: "cat /workspace/matrix.txt", Timeout: 60})
		if err != nil {
			return "", err
		}
		if err := check("fork's file", res.Stdout, "matrix\n"); err != nil {
			return "", err
		}
		r, err := c.RunCode(ctx, fork.ID, client.CodeRequest{Code: "print(x)"})
		if err != nil {
			return "", err
		}
		if err := check("fork's cell", r.Stdout, "42\n"); err != nil {
			return "", err
		}
		// The fork writes a layer of its own (an image root's upper
		// directory is not shared): the original does not see its file.
		if res, err = c.Exec(ctx, fork.ID, client.ExecRequest{Shell: "echo fork > /workspace/fork.txt && echo fork > /opt/fork.txt 2>/dev/null; cat /workspace/fork.txt", Timeout: 60}); err != nil {
			return "", err
		}
		if err := check("fork's write", res.Stdout, "fork\n"); err != nil {
			return "", err
		}
		if res, err = c.Exec(ctx, id, client.ExecRequest{Shell: "cat /workspace/fork.txt /opt/fork.txt 2>&1 >/dev/null | wc -l", Timeout: 60}); err != nil {
			return "", err
		}
		if err := check("the fork's files seen from the original (missing-file errors)", strings.TrimSpace(res.Stdout), "2"); err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("unknown operation %q", op)
	}
	return "ok", nil
}

// matrixNetwork creates a sandbox of the row with an allowlist and an
// injected header: the allowed host answers with the header added by the
// proxy, another host is refused, and both are in the network log.
func matrixNetwork(ctx context.Context, e *netEnv, tier string, root matrixRoot) (string, error) {
	req := client.CreateRequest{Runtime: tier, Timeout: 600,
		Network: &client.Network{Mode: "allowlist", Allow: []string{"secret.test", "127.0.0.1"}},
		Secrets: []client.Secret{{Host: "secret.test", Header: "Authorization", Value: testSecret}}}
	root.req(&req)
	sb, err := e.c.Create(ctx, req)
	if err != nil {
		return "", err
	}
	defer e.c.Kill(context.Background(), sb.ID)
	if err := netProbe(ctx, e, sb.ID); err != nil {
		return "", err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		log, err := e.c.NetworkLog(ctx, sb.ID, 0)
		if err != nil {
			return "", err
		}
		if hasConn(log, "secret.test", 0, true, "") && hasConn(log, "tls.test", 0, false, "") {
			return "ok", nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("network log lacks the allowed and the refused connection: %+v", log)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// netProbe runs, in sandbox id (network allowlist of secret.test with an
// injected header), a request to secret.test, which must get the header,
// and one to tls.test, which must be refused.
func netProbe(ctx context.Context, e *netEnv, id string) error {
	py := fmt.Sprintf(`
import urllib.request
print(urllib.request.urlopen(urllib.request.Request(%q, headers={"Authorization": "placeholder"}), timeout=30).read().decode().strip())
try:
    urllib.request.urlopen(%q, timeout=30)
    print("other reached")
except Exception as e:
    print("other refused")
`, e.url("https", "secret.test", "/secret"), e.url("http", "tls.test", "/"))
	if _, err := e.c.WriteFile(ctx, id, "/workspace/net.py", strings.NewReader(py), 0o644); err != nil {
		return err
	}
	res, err := e.c.Exec(ctx, id, client.ExecRequest{Shell: "REQUESTS_CA_BUNDLE= python3 /workspace/net.py", Timeout: 90})
	if err != nil {
		return err
	}
	if res.Stdout != "auth-ok sni=secret.test\nother refused\n" {
		return fmt.Errorf("network: %+v", res)
	}
	return nil
}

// checkMatrixDoc renders the cells as docs/support-matrix.md and compares
// it with the committed one (AIRLOCK_UPDATE_MATRIX=1 writes it instead).
func checkMatrixDoc(t *testing.T, cells []matrixCell, hostDirs map[string]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("# Support matrix\n\n" +
		"Generated by `TestConformanceMatrix` (server/matrix_linux_test.go) against a real `airlock serve`: each\n" +
		"cell is what the operation did on that tier and root. A refusal is a 422 that names the capability the\n" +
		"tier lacks (`GET /v1/info` lists each runtime's `runtime_capabilities`); the test fails if a tier\n" +
		"refuses what it declares, does what it does not declare, or differs in any other way. Rewrite this file\n" +
		"with `AIRLOCK_UPDATE_MATRIX=1 go test -run TestConformanceMatrix ./server/`.\n")
	for _, tier := range matrixTiers {
		fmt.Fprintf(&b, "\n## %s\n\n| operation |", tier)
		var roots []string
		for _, c := range cells {
			if c.tier == tier && c.op == matrixOps[0] {
				roots = append(roots, c.root)
			}
		}
		if len(roots) == 0 {
			return // a tier this host cannot run: nothing to compare
		}
		for _, r := range roots {
			fmt.Fprintf(&b, " %s |", r)
		}
		b.WriteString("\n|---|" + strings.Repeat("---|", len(roots)) + "\n")
		for _, op := range matrixOps {
			fmt.Fprintf(&b, "| %s |", op)
			for _, r := range roots {
				res := "FAILED"
				for _, c := range cells {
					if c.tier == tier && c.root == r && c.op == op {
						res = c.result
					}
				}
				fmt.Fprintf(&b, " %s |", res)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n## Writable host directories\n\n" +
		"The API has no host directories (volumes are the server's); a one-shot `airlock run` mounts them. A\n" +
		"directory owned by another unprivileged host user must be writable inside without a chown, with the\n" +
		"files the directory owner's on the host and set-uid modes refused; a tier without `volumes` is refused\n" +
		"as in the volume column.\n\n| runtime | " + matrixHostDirOp + " |\n|---|---|\n")
	for _, tier := range matrixTiers {
		if res, ok := hostDirs[tier]; ok {
			fmt.Fprintf(&b, "| %s | %s |\n", tier, res)
		}
	}
	path := filepath.Join("..", "docs", "support-matrix.md")
	if os.Getenv("AIRLOCK_UPDATE_MATRIX") == "1" {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	old, _ := os.ReadFile(path)
	if string(old) != b.String() {
		t.Errorf("docs/support-matrix.md differs from what the tiers did (AIRLOCK_UPDATE_MATRIX=1 rewrites it):\n%s", b.String())
	}
}
