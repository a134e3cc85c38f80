package egress

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// These tests drive the proxy with the clients programs in a sandbox use:
// curl and Python requests. They are skipped where the tool is missing.

// tool runs name with args in a clean environment (no proxy variables, no
// rc files) and returns stdout, stderr and the exit code.
func tool(t *testing.T, name string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	if p := os.Getenv("PYENV_ROOT"); p != "" {
		cmd.Env = append(cmd.Env, "PYENV_ROOT="+p)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errOut.String(), 0
	case errors.As(err, &ee):
		return out.String(), errOut.String(), ee.ExitCode()
	}
	t.Fatalf("%s: %v", name, err)
	return "", "", 0
}

func writePEM(t *testing.T, name string, pemBytes []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, pemBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl not installed")
	}
	u := startUpstreams(t)
	tp := startProxy(t, u, injectSandbox("secure.test"))
	upstreamCA := writePEM(t, "upstream.pem", u.ca.pem)
	sandboxCA := writePEM(t, "sandbox.pem", tp.p.CACertPEM(tp.id))
	proxy := "http://" + tp.httpAddr
	httpURL := fmt.Sprintf("http://allowed.test:%d/hello", u.httpPort)
	curlRun := func(args ...string) (string, string, int) {
		return tool(t, curl, append([]string{"-q", "-sS", "--max-time", "30"}, args...)...)
	}
	wantOut := func(what, out, errOut string, code int, want string) {
		t.Helper()
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want %q", what, code, out, errOut, want)
		}
	}

	out, errOut, code := curlRun("-x", proxy, httpURL)
	wantOut("curl -x (absolute URI)", out, errOut, code, "hello from allowed.test")
	tp.rec.next(t)

	out, errOut, code = curlRun("-x", proxy, "--cacert", upstreamCA, fmt.Sprintf("https://plain.test:%d/hello", u.httpsPort))
	wantOut("curl -x https (CONNECT)", out, errOut, code, "hello from plain.test")
	tp.rec.next(t)

	out, errOut, code = curlRun("--socks5-hostname", tp.socksAddr, httpURL)
	wantOut("curl --socks5-hostname", out, errOut, code, "hello from allowed.test")
	if rec := tp.rec.next(t); rec.Protocol != "socks5" || rec.Host != "allowed.test" {
		t.Errorf("record %+v: the name was not resolved by the proxy", rec)
	}

	out, errOut, code = curlRun("-x", "socks5h://"+tp.socksAddr, "--cacert", upstreamCA, fmt.Sprintf("https://plain.test:%d/hello", u.httpsPort))
	wantOut("curl -x socks5h:// https", out, errOut, code, "hello from plain.test")
	tp.rec.next(t)

	// Injection: curl trusts only the sandbox CA and never holds the key.
	out, errOut, code = curlRun("-x", proxy, "--cacert", sandboxCA, fmt.Sprintf("https://secure.test:%d/auth", u.httpsPort))
	wantOut("curl with injection", out, errOut, code, "authorized")
	tp.rec.next(t)
	out, errOut, code = curlRun("-i", "-x", proxy, "--cacert", sandboxCA, fmt.Sprintf("https://secure.test:%d/echo", u.httpsPort))
	wantOut("curl with injection, echo", out, errOut, code, "Authorization: ***")
	wantNoSecret(t, "curl output", out+errOut)
	tp.rec.next(t)

	// Refusals carry the reason: as the body for http://, in the proxy's
	// response headers (curl -v) for CONNECT.
	const reason = "denied: denied.test is not in network.allow; add denied.test to network.allow to permit it"
	out, errOut, code = curlRun("-x", proxy, "-w", "\n%{http_code}", fmt.Sprintf("http://denied.test:%d/", u.httpPort))
	if code != 0 || out != "airlock: "+strings.TrimPrefix(reason, "denied: ")+"\n\n403" {
		t.Errorf("curl denied http: exit %d, %q %q", code, out, errOut)
	}
	tp.rec.next(t)
	_, errOut, code = curlRun("-v", "-x", proxy, fmt.Sprintf("https://denied.test:%d/", u.httpsPort))
	if code == 0 || !strings.Contains(errOut, "X-Airlock-Deny-Reason: "+reason) {
		t.Errorf("curl denied CONNECT: exit %d, stderr %q", code, errOut)
	}
	tp.rec.next(t)
	_, errOut, code = curlRun("--socks5-hostname", tp.socksAddr, fmt.Sprintf("http://denied.test:%d/", u.httpPort))
	if code == 0 || !strings.Contains(errOut, "(2)") {
		t.Errorf("curl denied SOCKS5: exit %d, stderr %q", code, errOut)
	}
	tp.rec.next(t)
}

const pyScript = `
import json, sys, requests
proxy, http_url, https_url, inject_url, echo_url, denied_url, upstream_ca, sandbox_ca = sys.argv[1:]
s = requests.Session()
s.trust_env = False
proxies = {"http": proxy, "https": proxy}
out = {}
r = s.get(http_url, proxies=proxies, timeout=30); out["http"] = [r.status_code, r.text]
r = s.get(https_url, proxies=proxies, verify=upstream_ca, timeout=30); out["https"] = [r.status_code, r.text]
r = s.get(inject_url, proxies=proxies, verify=sandbox_ca, timeout=30); out["inject"] = [r.status_code, r.text]
r = s.get(echo_url, proxies=proxies, verify=sandbox_ca, timeout=30); out["echo"] = [r.status_code, r.text + json.dumps(dict(r.headers))]
r = s.get(denied_url, proxies=proxies, timeout=30); out["denied"] = [r.status_code, r.text]
print(json.dumps(out))
`

func TestPythonRequests(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	if _, _, code := tool(t, py, "-c", "import requests"); code != 0 {
		t.Skip("python3 has no requests module")
	}
	u := startUpstreams(t)
	tp := startProxy(t, u, injectSandbox("secure.test"))
	out, errOut, code := tool(t, py, "-c", pyScript,
		"http://"+tp.httpAddr,
		fmt.Sprintf("http://allowed.test:%d/hello", u.httpPort),
		fmt.Sprintf("https://plain.test:%d/hello", u.httpsPort),
		fmt.Sprintf("https://secure.test:%d/auth", u.httpsPort),
		fmt.Sprintf("https://secure.test:%d/echo", u.httpsPort),
		fmt.Sprintf("http://denied.test:%d/", u.httpPort),
		writePEM(t, "upstream.pem", u.ca.pem),
		writePEM(t, "sandbox.pem", tp.p.CACertPEM(tp.id)),
	)
	if code != 0 {
		t.Fatalf("python: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{
		`"http": [200, "hello from allowed.test`,
		`"https": [200, "hello from plain.test`,
		`"inject": [200, "authorized\n"]`,
		`"denied": [403, "airlock: denied.test is not in network.allow`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("python output lacks %q:\n%s", want, out)
		}
	}
	wantNoSecret(t, "python output", out)
}
