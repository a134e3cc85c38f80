package lang

import "testing"

func TestCanonical(t *testing.T) {
	for in, want := range map[string]string{"": Python, "py": Python, "Python3": Python, "JS": JavaScript, "node": JavaScript,
		"ts": TypeScript, "sh": Bash, "SHELL": Bash, "bash": Bash} {
		if got, ok := Canonical(in); !ok || got != want {
			t.Errorf("Canonical(%q) = %q %v, want %q", in, got, ok, want)
		}
	}
	for _, in := range []string{"r", "java", "bash ", "zsh"} {
		if got, ok := Canonical(in); ok {
			t.Errorf("Canonical(%q) = %q, want unknown", in, got)
		}
	}
}
