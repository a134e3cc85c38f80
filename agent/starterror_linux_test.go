package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/interp"
)

// TestKernelStartTimeoutIsTimeout starts a real Python kernel whose startup
// hangs (a sitecustomize that sleeps) under a short deadline: the agent must
// answer CodeTimeout (the API's 504), not a generic I/O error.
func TestKernelStartTimeoutIsTimeout(t *testing.T) {
	if _, err := os.Stat(interp.DefaultPython); err != nil {
		t.Skipf("no python: %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "sitecustomize.py"), []byte("import time\ntime.sleep(600)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "PYTHONPATH="+dir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	k, err := interp.Start(ctx, interp.Config{Language: interp.Python, Env: env})
	if err == nil {
		k.Close()
		t.Fatal("a kernel whose startup hangs started")
	}
	var ae *Error
	if !errors.As(startError("the python kernel", err), &ae) || ae.Code != CodeTimeout {
		t.Fatalf("start error %v maps to %#v, want code %q", err, ae, CodeTimeout)
	}
	if !strings.Contains(ae.Message, "did not start in time") {
		t.Fatalf("message %q does not say the kernel did not start in time", ae.Message)
	}
	if got := toError(ae).Code; got != CodeTimeout {
		t.Fatalf("toError kept code %q, want %q", got, CodeTimeout)
	}
}
