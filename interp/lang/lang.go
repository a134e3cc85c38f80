// Package lang names the code interpreter's languages: the canonical names
// of the kernels package interp runs, and the aliases a request may use for
// them. The agent resolves a request's language with it, and the approval
// policy matches rules with it, so that a rule on "bash" also holds a cell
// asking for "sh" or "BASH".
package lang

import "strings"

// The canonical language names.
const (
	Python     = "python"
	JavaScript = "javascript"
	TypeScript = "typescript"
	Bash       = "bash"
)

// aliases maps the other names requests may give to canonical ones.
var aliases = map[string]string{
	"":        Python,
	"py":      Python,
	"python3": Python,
	"js":      JavaScript,
	"node":    JavaScript,
	"ts":      TypeScript,
	"sh":      Bash,
	"shell":   Bash,
}

// Canonical returns the language s names, case-insensitively, aliases
// included ("" is Python); ok is false for a language airlock does not
// run.
func Canonical(s string) (name string, ok bool) {
	l := strings.ToLower(s)
	switch l {
	case Python, JavaScript, TypeScript, Bash:
		return l, true
	}
	name, ok = aliases[l]
	return name, ok
}
