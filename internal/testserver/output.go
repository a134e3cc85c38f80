package testserver

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Output collects a terminal's (or any stream's) output for tests that
// wait for text in it. It is safe for one writer and many readers.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write implements io.Writer.
func (o *Output) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(b)
}

// String returns everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// WaitFor waits (up to 30 s) until want appears at or after offset from
// and returns the offset just past it; t fails with the output if it
// does not.
func (o *Output) WaitFor(t testing.TB, from int, want string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := o.String()
		if i := strings.Index(s[min(from, len(s)):], want); i >= 0 {
			return min(from, len(s)) + i + len(want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("never saw %q; output:\n%q", want, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// HostRuns reports whether a process of the host (in any namespace, so
// sandboxes' too) has exactly this NUL-separated command line, e.g.
// "sleep\x00100\x00": a check from the host side, not the sandbox's word.
func HostRuns(cmdline string) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && string(b) == cmdline {
			return true
		}
	}
	return false
}
