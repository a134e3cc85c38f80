package mcp

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCaptureKeepsHeadAndTail(t *testing.T) {
	c := newCapture(100)
	var all strings.Builder
	for i := 0; i < 1000; i++ {
		s := strings.Repeat(string(rune('a'+i%26)), i%7+1)
		all.WriteString(s)
		c.Write([]byte(s))
	}
	full := all.String()
	got := c.Text("stdout")
	if !strings.HasPrefix(got, full[:50]) || !strings.HasSuffix(got, full[len(full)-50:]) {
		t.Fatalf("head/tail lost: %q", got)
	}
	if c.cut() != int64(len(full)-100) || !strings.Contains(got, "of stdout cut here") {
		t.Fatalf("cut %d of %d: %q", c.cut(), len(full), got)
	}
}

func TestCaptureSmallAndExact(t *testing.T) {
	for _, n := range []int{0, 1, 99, 100} {
		c := newCapture(100)
		s := strings.Repeat("x", n)
		c.Write([]byte(s))
		if got := c.Text("out"); got != s {
			t.Fatalf("%d bytes: %q", n, got)
		}
	}
	// One big write, then small ones.
	c := newCapture(100)
	c.Write([]byte(strings.Repeat("h", 60) + strings.Repeat("m", 1000) + strings.Repeat("t", 40)))
	c.Write([]byte("END"))
	got := c.Text("out")
	if !strings.HasPrefix(got, strings.Repeat("h", 50)) || !strings.HasSuffix(got, strings.Repeat("t", 40)+"END") {
		t.Fatalf("got %q", got)
	}
}

func TestCaptureUTF8(t *testing.T) {
	c := newCapture(101)
	c.Write([]byte(strings.Repeat("é", 500) + "\xff"))
	got := c.Text("out")
	if !utf8.ValidString(got) {
		t.Fatalf("invalid UTF-8: %q", got)
	}
	if strings.Count(got, "é") < 45 {
		t.Fatalf("lost too much: %q", got)
	}
}

func TestTrimPartial(t *testing.T) {
	b := []byte("aé")
	if got := string(trimPartialEnd(b[:2])); got != "a" {
		t.Fatalf("end: %q", got)
	}
	if got := string(trimPartialStart(b[2:])); got != "" {
		t.Fatalf("start: %q", got)
	}
}
