package server_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
)

// BenchmarkProxyThroughput downloads 64 MiB per iteration from a local
// HTTP server with curl: on the host directly (the baseline), and inside a
// sandbox through the egress proxy over an HTTP CONNECT tunnel and over
// SOCKS5. MB/s is the figure to compare.
func BenchmarkProxyThroughput(b *testing.B) {
	const mb = 64
	e := startNetEnv(b, "--egress-max-bytes", "0") // no budget: the benchmark may run long
	sb, err := e.c.Create(ctxT(b), client.CreateRequest{Timeout: 600,
		Network: &client.Network{Mode: "allowlist", Allow: []string{"web.test", "127.0.0.1"}}})
	if err != nil {
		b.Fatal(err)
	}
	url := fmt.Sprintf("%s?mb=%d", e.url("http", "web.test", "/stream"), mb)
	check := func(b *testing.B, out string) {
		if strings.TrimSpace(out) != fmt.Sprint(mb<<20) {
			b.Fatalf("downloaded %q bytes, want %d", out, mb<<20)
		}
	}
	b.Run("direct-host", func(b *testing.B) {
		b.SetBytes(mb << 20)
		direct := fmt.Sprintf("http://127.0.0.1:%d/stream?mb=%d", e.httpPort, mb)
		for b.Loop() {
			out, err := exec.Command("curl", "-sS", "--noproxy", "*", "-o", "/dev/null", "-w", "%{size_download}", direct).Output()
			if err != nil {
				b.Fatal(err)
			}
			check(b, string(out))
		}
	})
	for _, via := range []struct{ name, flags string }{
		{"sandbox-connect", "-p"}, // proxytunnel: CONNECT through HTTP_PROXY
		{"sandbox-socks5", "--socks5-hostname 127.0.0.1:1080"},
	} {
		b.Run(via.name, func(b *testing.B) {
			b.SetBytes(mb << 20)
			cmd := fmt.Sprintf("curl -sS %s -o /dev/null -w '%%{size_download}' '%s'", via.flags, url)
			for b.Loop() {
				res, err := e.c.Exec(ctxT(b), sb.ID, client.ExecRequest{Shell: cmd, Timeout: 120})
				if err != nil || res.ExitCode != 0 {
					b.Fatalf("%+v %v", res, err)
				}
				check(b, res.Stdout)
			}
		})
	}
}
