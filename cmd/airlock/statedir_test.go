package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeRefusesDeepStateDir: agent sockets live under the state dir and
// a unix socket path has at most 107 bytes, so a state dir too deep for
// them is refused at start, naming the problem, instead of every create
// failing later with a 500.
func TestServeRefusesDeepStateDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("airlock serve needs root here")
	}
	deep := filepath.Join(t.TempDir(), strings.Repeat("d", 50), strings.Repeat("e", 50))
	if err := os.MkdirAll(deep, 0o700); err != nil {
		t.Fatal(err)
	}
	// Bounded: a server that wrongly starts would serve forever.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, airlockBin(t), "serve", "--listen", "127.0.0.1:0", "--state-dir", deep, "--no-auth").CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("serve with a state dir of %d bytes: want a refusal, got %v\n%s", len(deep), err, out)
	}
	if !strings.Contains(string(out), "too deep") || !strings.Contains(string(out), "107") {
		t.Fatalf("the refusal does not say why: %s", out)
	}
}
