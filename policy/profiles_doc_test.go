package policy

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// profilesTable renders the limits of the presets as the Markdown table in
// docs/SECURITY.md.
func profilesTable(t *testing.T) string {
	t.Helper()
	size := func(n int64) string {
		for _, u := range []struct {
			s string
			n int64
		}{{"GiB", gib}, {"MiB", mib}} {
			if n >= u.n && n%u.n == 0 {
				return fmt.Sprintf("%d %s", n/u.n, u.s)
			}
		}
		return fmt.Sprint(n)
	}
	dur := func(d time.Duration) string {
		switch {
		case d >= time.Hour && d%time.Hour == 0:
			return fmt.Sprintf("%d h", d/time.Hour)
		case d >= time.Minute && d%time.Minute == 0:
			return fmt.Sprintf("%d min", d/time.Minute)
		}
		return fmt.Sprintf("%g s", d.Seconds())
	}
	rows := []struct {
		name string
		f    func(Limits) string
	}{
		{"memory (`memory_bytes`, `--memory`; swap off)", func(l Limits) string { return size(l.MemoryBytes) }},
		{"CPUs (`cpus`, `--cpus`; a quota)", func(l Limits) string { return fmt.Sprint(l.CPUs) }},
		{"processes (`pids`, `--pids`)", func(l Limits) string { return fmt.Sprint(l.Pids) }},
		{"`/workspace` and `/tmp`, each (`disk_bytes`, `--disk`)", func(l Limits) string { return size(l.DiskBytes) }},
		{"inodes of each", func(l Limits) string { return fmt.Sprint(l.Inodes) }},
		{"open files per process", func(l Limits) string { return fmt.Sprint(l.OpenFiles) }},
		{"largest file", func(l Limits) string { return size(l.FileSizeBytes) }},
		{"CPU time per process", func(l Limits) string { return dur(l.CPUTime) }},
		{"wall-clock limit of `airlock run` (`--timeout`)", func(l Limits) string { return dur(l.WallTime) }},
		{"output of `airlock run` (`--output-limit`)", func(l Limits) string { return size(l.OutputBytes) }},
	}
	var b strings.Builder
	b.WriteString("| limit | strict (default) | standard | light |\n|---|---|---|---|\n")
	for _, r := range rows {
		b.WriteString("| " + r.name)
		for _, name := range []Profile{Strict, Standard, Light} {
			p, err := Preset(name)
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString(" | " + r.f(p.Limits))
		}
		b.WriteString(" |\n")
	}
	return b.String()
}

// TestProfilesDocumented: the profile table in docs/SECURITY.md is the
// presets' limits (regenerate it from the expected text below when a
// preset changes).
func TestProfilesDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/SECURITY.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- profiles table: checked by policy/profiles_doc_test.go -->\n", "<!-- end of profiles table -->"
	s := string(doc)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	want := profilesTable(t)
	if i < 0 || j < i {
		t.Fatalf("docs/SECURITY.md has no profiles table between %q and %q; it should be:\n%s", begin, end, want)
	}
	if got := s[i+len(begin) : j]; got != want {
		t.Fatalf("docs/SECURITY.md's profiles table is stale:\n%s\nwant:\n%s", got, want)
	}
}
