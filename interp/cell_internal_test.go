package interp

import (
	"math/rand"
	"strings"
	"testing"
	"time"
)

// TestCellOrdering feeds a cell the output and messages of a kernel in
// random chunks and interleavings, and checks that markers are removed,
// nothing is lost and each result comes after the output printed before it
// and before the output printed after it.
func TestCellOrdering(t *testing.T) {
	token := newToken()
	m := "\x00airlock-sync:" + token + "\x00"
	stale := "\x00airlock-sync:" + newToken() + "\x00"
	// The kernel: prints "a\n" (and "é" split across writes) on stdout,
	// sends a result, prints "b\n" on stdout and "e\n" on stderr, ends.
	streams := [2]string{
		"a\né" + m + "b\n" + stale + "\x00x" + m,
		m + "e\n" + m,
	}
	msgs := []kmsg{
		{Type: "result", N: 1, Sync: [2]int{1, 1}, Data: map[string]string{"text/plain": "R"}},
		{Type: "result", N: 0, Data: map[string]string{"text/plain": "stale"}}, // from a thread, before this cell
		{Type: "end", N: 1, Sync: [2]int{2, 2}},
	}
	rng := rand.New(rand.NewSource(1))
	for iter := 0; iter < 5000; iter++ {
		queues := [][]func(c *cell){nil, nil, msgEvents(msgs)}
		for i, s := range streams {
			for len(s) > 0 {
				n := 1 + rng.Intn(len(s))
				if rng.Intn(3) == 0 {
					n = min(len(s), 1+rng.Intn(3))
				}
				piece := []byte(s[:n])
				s = s[n:]
				queues[i] = append(queues[i], func(c *cell) { c.feed(i, append([]byte(nil), piece...), false) })
			}
		}
		// Interleave, keeping each stream's chunks and the messages in
		// order.
		merged := interleave(rng, queues)
		var seq []string
		c := &cell{
			k: &Kernel{cfg: Config{Language: Python, KillAfter: time.Second}}, p: &proc{},
			token: token, n: 1, maxOutput: 1 << 20, resBudget: 1 << 20, res: &ExecResult{},
			emit: func(o Output) {
				if n := len(seq); n > 0 && o.Type != "result" && strings.HasPrefix(seq[n-1], o.Type+":") {
					seq[n-1] += o.Text
					return
				}
				seq = append(seq, o.Type+":"+o.Text)
			},
		}
		for _, e := range merged {
			e(c)
			c.drainPending(false)
		}
		if !c.done {
			t.Fatalf("iteration %d: the cell did not end", iter)
		}
		// "\x00x" is output verbatim: a NUL that starts no marker.
		if c.res.Stdout != "a\néb\n\x00x" || c.res.Stderr != "e\n" {
			t.Fatalf("iteration %d: stdout %q, stderr %q", iter, c.res.Stdout, c.res.Stderr)
		}
		got := strings.Join(seq, "|")
		ri := strings.Index(got, "result:R")
		if ri < 0 || !strings.Contains(got[:ri], "a\né") || strings.Contains(got[:ri], "b\n") || strings.Contains(got[:ri], "e\n") {
			t.Fatalf("iteration %d: outputs out of order: %q", iter, got)
		}
		if len(c.res.Results) != 2 {
			t.Fatalf("iteration %d: results %v", iter, c.res.Results)
		}
	}
}

func msgEvents(msgs []kmsg) []func(c *cell) {
	var out []func(c *cell)
	for _, m := range msgs {
		out = append(out, func(c *cell) { c.pending = append(c.pending, m) })
	}
	return out
}

// interleave merges queues of events at random, keeping each queue's order.
func interleave(rng *rand.Rand, queues [][]func(c *cell)) []func(c *cell) {
	var out []func(c *cell)
	for {
		var live []int
		for i, q := range queues {
			if len(q) > 0 {
				live = append(live, i)
			}
		}
		if len(live) == 0 {
			return out
		}
		i := live[rng.Intn(len(live))]
		out = append(out, queues[i][0])
		queues[i] = queues[i][1:]
	}
}

func TestBashQuote(t *testing.T) {
	for in, want := range map[string]string{
		"echo hi":  `$'echo hi'`,
		"it's":     `$'it\'s'`,
		"a\\b\nc":  `$'a\\b\nc'`,
		"\t\x1b!é": `$'\x09\x1b!é'`,
	} {
		if got := bashQuote(in); got != want {
			t.Errorf("bashQuote(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestIncompleteRune(t *testing.T) {
	for in, want := range map[string]int{
		"abc": 0, "ab\xc3": 1, "ab\xc3\xa9": 0, "\xe2\x9c": 2, "\xe2\x9c\x93": 0, "\xf0\x9f\x98": 3, "\xff": 0,
	} {
		if got := incompleteRune([]byte(in)); got != want {
			t.Errorf("incompleteRune(%q) = %d, want %d", in, got, want)
		}
	}
}
