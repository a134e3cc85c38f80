package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCompletion: `airlock completion bash` is a script bash parses
// (bash -n) and that, sourced, completes verbs, subcommands and flags read
// from each verb's own --help (serve's --listen, exec's --api-key and
// -it); zsh's and fish's scripts parse where those shells are installed.
func TestCompletion(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "airlock.bash")
	out, errOut, code := runCLI(t, nil, "completion", "bash")
	if code != 0 || !strings.Contains(out, "complete -o default -F _airlock airlock") {
		t.Fatalf("completion bash: exit %d, stderr %q", code, errOut)
	}
	if err := os.WriteFile(script, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("bash", "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v %s", err, b)
	}
	complete := func(words ...string) []string {
		t.Helper()
		prog := `source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _airlock; printf '%s\n' "${COMPREPLY[@]}"`
		b, err := exec.Command("bash", append([]string{"-c", prog, "bash", script}, words...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("complete %v: %v %s", words, err, b)
		}
		return strings.Fields(string(b))
	}
	for _, tc := range []struct {
		words []string
		want  []string
	}{
		{[]string{"airlock", "ex"}, []string{"exec"}},
		{[]string{"airlock", "p"}, []string{"pause", "ps"}},
		{[]string{"airlock", "exec", "--ap"}, []string{"--api-key"}},
		{[]string{"airlock", "exec", "-i"}, []string{"-i", "-it"}},
		{[]string{"airlock", "serve", "--lis"}, []string{"--listen"}},
		{[]string{"airlock", "image", "l"}, []string{"ls"}},
		{[]string{"airlock", "volumes", "create", "--si"}, []string{"--size"}},
		{[]string{"airlock", "keys", "create", "--max-p"}, []string{"--max-pids"}},
		{[]string{"airlock", "completion", ""}, []string{"bash", "fish", "zsh"}},
	} {
		got := complete(tc.words...)
		slices.Sort(got)
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("complete %q: %q, want %q", tc.words, got, tc.want)
		}
	}
	for _, shell := range []string{"zsh", "fish"} {
		out, errOut, code := runCLI(t, nil, "completion", shell)
		if code != 0 || !strings.Contains(out, "airlock") {
			t.Fatalf("completion %s: exit %d, stderr %q", shell, code, errOut)
		}
		path, err := exec.LookPath(shell)
		if err != nil {
			t.Logf("%s is not installed: its script is not parsed here", shell)
			continue
		}
		f := filepath.Join(dir, "airlock."+shell)
		os.WriteFile(f, []byte(out), 0o644)
		if b, err := exec.Command(path, "-n", f).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v %s", shell, err, b)
		}
	}
}
