package mcp

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// capture keeps the head and the tail of a stream that may be far larger
// than what a result can carry, and counts what it drops. Memory use is
// bounded by limit whatever the stream's size.
type capture struct {
	limit int
	head  []byte
	tail  []byte // the last bytes seen after head filled; at most 2*half
	total int64
}

func newCapture(limit int) *capture { return &capture{limit: max(limit, 16)} }

// Write records p. It never fails.
func (c *capture) Write(p []byte) (int, error) {
	n := len(p)
	c.total += int64(n)
	headMax := c.limit - c.limit/2
	if room := headMax - len(c.head); room > 0 {
		k := min(room, len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	if len(p) == 0 {
		return n, nil
	}
	half := c.limit / 2
	if len(p) >= half {
		c.tail = append(c.tail[:0], p[len(p)-half:]...)
		return n, nil
	}
	c.tail = append(c.tail, p...)
	if len(c.tail) > 2*half {
		// Amortized: drop the oldest bytes only once the buffer doubled.
		c.tail = append(c.tail[:0], c.tail[len(c.tail)-half:]...)
	}
	return n, nil
}

// cut is how many bytes were dropped.
func (c *capture) cut() int64 {
	kept := int64(len(c.head)) + int64(min(len(c.tail), c.limit/2))
	return c.total - kept
}

// Len is the number of bytes seen.
func (c *capture) Len() int64 { return c.total }

// Text returns the kept output as valid UTF-8, with a note in place of
// what was cut from the middle. name ("stdout") appears in the note.
func (c *capture) Text(name string) string {
	tail := c.tail
	if len(tail) > c.limit/2 {
		tail = tail[len(tail)-c.limit/2:]
	}
	if c.cut() <= 0 {
		return toUTF8(string(c.head) + string(tail))
	}
	head := trimPartialEnd(c.head)
	tail = trimPartialStart(tail)
	note := fmt.Sprintf("\n[... %s of %s cut here: it was %s in total, only the first and last %s are shown ...]\n",
		sizeText(c.cut()), name, sizeText(c.total), sizeText(int64(c.limit/2)))
	return toUTF8(string(head)) + note + toUTF8(string(tail))
}

// trimPartialEnd drops an incomplete UTF-8 sequence at the end of b.
func trimPartialEnd(b []byte) []byte {
	for i := 1; i <= utf8.UTFMax && i <= len(b); i++ {
		r := b[len(b)-i]
		if r < utf8.RuneSelf {
			return b
		}
		if utf8.RuneStart(r) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			return b
		}
	}
	return b
}

// trimPartialStart drops the UTF-8 continuation bytes (at most three) at
// the start of b.
func trimPartialStart(b []byte) []byte {
	i := 0
	for i < utf8.UTFMax-1 && i < len(b) && !utf8.RuneStart(b[i]) {
		i++
	}
	return b[i:]
}

// toUTF8 replaces invalid UTF-8 (binary output) with U+FFFD.
func toUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// sizeText formats a byte count for people and models.
func sizeText(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d bytes", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}
