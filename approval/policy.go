// Package approval puts a human in the loop for high-risk actions: a policy
// says which actions need an approval and which are refused outright; a
// Gate holds a blocked action as a pending approval until a human answers
// (HTTP, a signed webhook callback or MCP elicitation) or it times out to
// deny. With no policy a Gate lets everything through unchanged.
package approval

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/airlock-dev/airlock/interp/lang"
	"github.com/airlock-dev/airlock/policy"
)

// Kinds of actions a rule can name.
const (
	// KindExec is a command started in a sandbox (exec, run_command).
	KindExec = "exec"
	// KindNetwork is a change that widens a sandbox's network policy
	// (PUT network, or a sandbox created with network).
	KindNetwork = "network"
	// KindReadFile is a file read out of a sandbox.
	KindReadFile = "read_file"
	// KindCreate is a sandbox creation.
	KindCreate = "create"
	// KindTool is a call of an MCP tool.
	KindTool = "mcp_tool"
	// KindCode is a code cell run in a sandbox's interpreter (API /code,
	// MCP run_code, E2B /execute), or a code context started (API and E2B
	// /contexts): its kernel runs with the environment and working
	// directory the caller gives, which is code of that language too.
	KindCode = "code"
	// KindComputer is a computer-use action on a sandbox's desktop (API
	// /computer, the MCP computer tool).
	KindComputer = "computer"
)

// Audit actions the exec gate (manager.ExecGate) puts to the rules besides
// exec: a code cell, and a code context about to start.
const (
	auditCode        = KindCode
	auditCodeContext = "code.context"
)

var kinds = []string{KindExec, KindNetwork, KindReadFile, KindCreate, KindTool, KindCode, KindComputer}

// Limits are a sandbox's resources, as asked for at creation. In a rule,
// a non-zero field is a threshold: asking for more needs approval.
type Limits struct {
	MemoryBytes    int64   `json:"memory_bytes,omitempty"`
	CPUs           float64 `json:"cpus,omitempty"`
	Pids           int64   `json:"pids,omitempty"`
	DiskBytes      int64   `json:"disk_bytes,omitempty"`
	TimeoutSeconds float64 `json:"timeout_s,omitempty"`
}

// Rule matches actions of one kind; every condition it sets must hold.
type Rule struct {
	// Action is the kind of action: exec, network, read_file, create or
	// mcp_tool.
	Action string `json:"action"`
	// Argv (exec) is a regular expression (RE2) searched for in the
	// command's argv joined with single spaces.
	Argv string `json:"argv,omitempty"`
	// ArgvGlob (exec) is a glob the whole joined argv must match: * is
	// any run of characters (spaces included), ? any one character.
	ArgvGlob string `json:"argv_glob,omitempty"`
	// MinBytes (read_file) matches files larger than this many bytes.
	MinBytes int64 `json:"min_bytes,omitempty"`
	// Above (create) matches a sandbox asking for more than any non-zero
	// field.
	Above *Limits `json:"above,omitempty"`
	// Tool (mcp_tool) is the tool's name; "*" is any tool.
	Tool string `json:"tool,omitempty"`
	// Language (code) limits the rule to cells and contexts of this
	// language: python, javascript, typescript or bash, or an alias the
	// API accepts (sh, js, ts...), which the rule then means.
	Language string `json:"language,omitempty"`
	// ComputerAction (computer) limits the rule to one computer-use
	// action (type, key, left_click...; agent.ComputerActions).
	ComputerAction string `json:"computer_action,omitempty"`
	// WindowTitle (computer) is a regular expression (RE2) searched for
	// in the title of the window that has the focus when a keyboard
	// action (type, key, hold_key) is asked; the rule then matches
	// keyboard actions only.
	WindowTitle string `json:"window_title,omitempty"`
	// WindowTitleGlob (computer) is a glob the whole title must match,
	// as WindowTitle.
	WindowTitleGlob string `json:"window_title_glob,omitempty"`
	// Reason is shown to the human and the caller.
	Reason string `json:"reason,omitempty"`

	re *regexp.Regexp
}

// Policy says which actions need a human (Require) and which are refused
// (Deny). Deny rules win over Require rules, and over approvals.
type Policy struct {
	Require []Rule `json:"require,omitempty"`
	Deny    []Rule `json:"deny,omitempty"`
}

// Parse reads a policy from JSON or YAML (anything that does not start
// with "{"), refusing unknown fields, unknown action kinds, bad patterns
// and rules without a condition their kind needs.
func Parse(data []byte) (*Policy, error) {
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] != '{' {
		var v any
		if err := yaml.Unmarshal(data, &v); err != nil {
			return nil, fmt.Errorf("approval policy: YAML: %w", err)
		}
		j, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("approval policy: YAML: %w", err)
		}
		data = j
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p Policy
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("approval policy: %w", err)
	}
	if dec.More() {
		return nil, errors.New("approval policy: trailing data after the JSON object")
	}
	if err := p.Compile(); err != nil {
		return nil, err
	}
	return &p, nil
}

// Load reads a policy file (JSON or YAML).
func Load(path string) (*Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("approval policy: %w", err)
	}
	p, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// Empty reports whether p has no rules (or is nil).
func (p *Policy) Empty() bool { return p == nil || len(p.Require)+len(p.Deny) == 0 }

// Compile checks p's rules and compiles their patterns; Parse does it, a
// Policy decoded some other way must be compiled before use.
func (p *Policy) Compile() error {
	for _, list := range []struct {
		name  string
		rules []Rule
	}{{"require", p.Require}, {"deny", p.Deny}} {
		for i := range list.rules {
			if err := list.rules[i].compile(); err != nil {
				return fmt.Errorf("approval policy: %s[%d]: %w", list.name, i, err)
			}
		}
	}
	return nil
}

func (r *Rule) compile() error {
	if !slices.Contains(kinds, r.Action) {
		return fmt.Errorf("unknown action %q: give one of %s", r.Action, strings.Join(kinds, ", "))
	}
	if r.Argv != "" && r.ArgvGlob != "" {
		return errors.New("give at most one of argv and argv_glob")
	}
	if (r.Argv != "" || r.ArgvGlob != "") && r.Action != KindExec {
		return fmt.Errorf("argv patterns apply to action %s only", KindExec)
	}
	if r.MinBytes != 0 && r.Action != KindReadFile {
		return fmt.Errorf("min_bytes applies to action %s only", KindReadFile)
	}
	if r.MinBytes < 0 {
		return errors.New("negative min_bytes")
	}
	if r.Above != nil && r.Action != KindCreate {
		return fmt.Errorf("above applies to action %s only", KindCreate)
	}
	if r.Tool != "" && r.Action != KindTool {
		return fmt.Errorf("tool applies to action %s only", KindTool)
	}
	if r.Language != "" && r.Action != KindCode {
		return fmt.Errorf("language applies to action %s only", KindCode)
	}
	if r.Language != "" {
		// Fail closed: a misspelt language would never match.
		l, ok := lang.Canonical(r.Language)
		if !ok {
			return fmt.Errorf("unknown language %q: give python, javascript, typescript or bash", r.Language)
		}
		r.Language = l
	}
	if err := r.compileComputer(); err != nil {
		return err
	}
	if r.Action == KindTool && r.Tool == "" {
		return errors.New(`action mcp_tool needs tool (a tool name, or "*")`)
	}
	var err error
	switch {
	case r.Argv != "":
		r.re, err = regexp.Compile(r.Argv)
	case r.ArgvGlob != "":
		r.re, err = regexp.Compile(globRegexp(r.ArgvGlob))
	}
	if err != nil {
		return fmt.Errorf("bad argv pattern: %w", err)
	}
	switch {
	case r.WindowTitle != "":
		r.re, err = regexp.Compile(r.WindowTitle)
	case r.WindowTitleGlob != "":
		r.re, err = regexp.Compile(globRegexp(r.WindowTitleGlob))
	}
	if err != nil {
		return fmt.Errorf("bad window title pattern: %w", err)
	}
	return nil
}

// globRegexp turns a glob over a whole string into an anchored regexp.
func globRegexp(g string) string {
	var b strings.Builder
	b.WriteString(`^(?s:`)
	for _, c := range g {
		switch c {
		case '*':
			b.WriteString(`.*`)
		case '?':
			b.WriteString(`.`)
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString(`)$`)
	return b.String()
}

// Action is something a caller asked for, described for rules and humans.
type Action struct {
	// Kind is one of the Kind* constants.
	Kind string `json:"kind"`
	// Via is the surface the request came in on: api or mcp.
	Via string `json:"via,omitempty"`
	// Owner is the API key ID acting ("" without auth).
	Owner string `json:"key_id,omitempty"`
	// Sandbox is the sandbox acted on, if any.
	Sandbox string `json:"sandbox_id,omitempty"`
	// Argv is the command (exec).
	Argv []string `json:"argv,omitempty"`
	// Path and Size describe the file (read_file).
	Path string `json:"path,omitempty"`
	Size int64  `json:"size,omitempty"`
	// From and To are the network policies before and after (network).
	From *policy.Network `json:"from,omitempty"`
	To   *policy.Network `json:"to,omitempty"`
	// Limits are what the sandbox asks for (create).
	Limits *Limits `json:"limits,omitempty"`
	// Tool is the MCP tool called (mcp_tool).
	Tool string `json:"tool,omitempty"`
	// Language is the language the code cell or context will run
	// (code): a cell in a context runs the context's language, whatever
	// the request says.
	Language string `json:"language,omitempty"`
	// NewContext marks a code context about to start (code).
	NewContext bool `json:"new_context,omitempty"`
	// ComputerAction is the computer-use action (computer): type, key,
	// left_click...
	ComputerAction string `json:"computer_action,omitempty"`
	// TextBytes is the length of the text a type action types (never the
	// text: it may be a secret).
	TextBytes int `json:"text_bytes,omitempty"`
	// Keys are the key combinations of a key or hold_key action.
	Keys string `json:"keys,omitempty"`
	// WindowTitle is the focused window's title (computer, keyboard
	// actions), read through WindowOf only when a rule looks at it;
	// WindowKnown says it was.
	WindowTitle string `json:"window_title,omitempty"`
	WindowKnown bool   `json:"window_known,omitempty"`
	// WindowOf reads the focused window's title (computer): called by
	// Gate.Check only when a rule looks at it.
	WindowOf func(ctx context.Context) (string, error) `json:"-"`
}

// Summary is a one-line description of a for a human.
func (a *Action) Summary() string {
	on := ""
	if a.Sandbox != "" {
		on = " in sandbox " + a.Sandbox
	}
	switch a.Kind {
	case KindExec:
		return fmt.Sprintf("run %q%s", strings.Join(a.Argv, " "), on)
	case KindNetwork:
		return fmt.Sprintf("widen the network%s from %s to %s", on, netText(a.From), netText(a.To))
	case KindReadFile:
		return fmt.Sprintf("read %s (%d bytes)%s", a.Path, a.Size, on)
	case KindCreate:
		b, _ := json.Marshal(a.Limits)
		return fmt.Sprintf("create a sandbox with limits %s", b)
	case KindTool:
		return fmt.Sprintf("call the MCP tool %s%s", a.Tool, on)
	case KindCode:
		if a.NewContext {
			return fmt.Sprintf("start a %s code context%s", codeLanguage(a.Language), on)
		}
		return fmt.Sprintf("run a %s code cell%s", codeLanguage(a.Language), on)
	case KindComputer:
		return computerSummary(a, on)
	}
	return a.Kind + on
}

func netText(n *policy.Network) string {
	if n == nil || n.Mode == "" {
		return "none"
	}
	s := string(n.Mode)
	if len(n.Allow) > 0 {
		s += " allow " + strings.Join(n.Allow, ",")
	}
	if len(n.Deny) > 0 {
		s += " deny " + strings.Join(n.Deny, ",")
	}
	return s
}

// Matches reports whether r applies to a.
func (r *Rule) Matches(a *Action) bool {
	if r.Action != a.Kind {
		return false
	}
	switch a.Kind {
	case KindExec:
		return r.re == nil || r.re.MatchString(strings.Join(a.Argv, " "))
	case KindNetwork:
		return Widens(a.From, a.To)
	case KindReadFile:
		return a.Size > r.MinBytes
	case KindCreate:
		return r.Above == nil || above(a.Limits, r.Above)
	case KindTool:
		return r.Tool == "*" || r.Tool == a.Tool
	case KindCode:
		return r.Language == "" || r.Language == codeLanguage(a.Language)
	case KindComputer:
		return r.matchComputer(a)
	}
	return false
}

// codeLanguage is the canonical name of the language l names ("" is
// python); a language no kernel runs keeps its lower-case name, which only
// a rule without language matches (the sandbox refuses it anyway).
func codeLanguage(l string) string {
	if c, ok := lang.Canonical(l); ok {
		return c
	}
	return strings.ToLower(l)
}

// above reports whether asked exceeds any non-zero threshold of t.
func above(asked, t *Limits) bool {
	if asked == nil {
		return false
	}
	return (t.MemoryBytes > 0 && asked.MemoryBytes > t.MemoryBytes) || (t.CPUs > 0 && asked.CPUs > t.CPUs) ||
		(t.Pids > 0 && asked.Pids > t.Pids) || (t.DiskBytes > 0 && asked.DiskBytes > t.DiskBytes) ||
		(t.TimeoutSeconds > 0 && asked.TimeoutSeconds > t.TimeoutSeconds)
}

func rank(m policy.NetworkMode) int {
	switch m {
	case policy.NetAllowlist:
		return 1
	case policy.NetOpen:
		return 2
	}
	return 0
}

// Widens reports whether going from one network policy to another lets
// the sandbox reach anything it could not: a more open mode, a new allowed
// destination, or a deny entry dropped.
func Widens(from, to *policy.Network) bool {
	var f, t policy.Network
	if from != nil {
		f = *from
	}
	if to != nil {
		t = *to
	}
	if rank(t.Mode) != rank(f.Mode) {
		return rank(t.Mode) > rank(f.Mode)
	}
	if rank(t.Mode) == 0 {
		return false
	}
	if t.Mode == policy.NetAllowlist {
		for _, a := range t.Allow {
			if !slices.Contains(f.Allow, a) {
				return true
			}
		}
	}
	for _, d := range f.Deny {
		if !slices.Contains(t.Deny, d) {
			return true
		}
	}
	return false
}

// verdict is what the policies say about an action.
type verdict struct {
	deny, require *Rule
}

// judge applies the policies: the first matching deny rule of any policy,
// else the first matching require rule.
func judge(a *Action, policies ...*Policy) verdict {
	var v verdict
	for _, p := range policies {
		if p == nil {
			continue
		}
		for i := range p.Deny {
			if p.Deny[i].Matches(a) {
				return verdict{deny: &p.Deny[i]}
			}
		}
		for i := range p.Require {
			if v.require == nil && p.Require[i].Matches(a) {
				v.require = &p.Require[i]
			}
		}
	}
	return v
}

// ruleText names a rule for humans: its reason, or its conditions.
func ruleText(r *Rule) string {
	if r.Reason != "" {
		return r.Reason
	}
	b, _ := json.Marshal(r)
	return "rule " + string(b)
}

// KeyPolicyDir is the directory, in the state directory, holding API keys'
// approval policies as KEY_ID.json.
const KeyPolicyDir = "approval-keys"

// SandboxPolicyDir is the directory, in the state directory, holding
// sandboxes' own approval policies as SANDBOX_ID.json.
const SandboxPolicyDir = "approval-sandboxes"

// SaveKeyPolicy checks data and stores it as keyID's policy in stateDir.
func SaveKeyPolicy(stateDir, keyID string, data []byte) error {
	p, err := Parse(data)
	if err != nil {
		return err
	}
	j, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("approval policy of %s: %w", keyID, err)
	}
	return writeFileAtomic(filepath.Join(stateDir, KeyPolicyDir), keyID, j)
}

// writeFileAtomic writes dir/name.json through a temporary file.
func writeFileAtomic(dir, name string, data []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("approval policy of %s: %w", name, err)
	}
	tmp := filepath.Join(dir, name+".json.tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("approval policy of %s: %w", name, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name+".json")); err != nil {
		return fmt.Errorf("approval policy of %s: %w", name, err)
	}
	return nil
}

// readPolicyFile reads dir/name.json: nil without one, an error if it
// cannot be read or parsed.
func readPolicyFile(dir, name string) (*Policy, error) {
	if name == "" || strings.ContainsAny(name, `/\.`) {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, name+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// KeyPolicies returns a Config.KeyPolicy reading the policies
// SaveKeyPolicy stored in stateDir; a key without one has none, and an
// unreadable or invalid one is an error (the action is refused).
func KeyPolicies(stateDir string) func(context.Context, string) (*Policy, error) {
	return func(_ context.Context, keyID string) (*Policy, error) {
		return readPolicyFile(filepath.Join(stateDir, KeyPolicyDir), keyID)
	}
}

// FromAudit describes an action about to be audited by the manager (a
// command, a code cell or a code context about to start; manager.ExecGate)
// for the rules. A cell's detail must name the language it will really run
// (its context's, if it names one), not the one its request gave.
func FromAudit(keyID, sandboxID, action string, detail map[string]any) Action {
	via, _ := detail["via"].(string)
	if via == "" {
		via = "api"
	}
	a := Action{Kind: KindExec, Via: via, Owner: keyID, Sandbox: sandboxID}
	if action == auditCode || action == auditCodeContext {
		a.Kind, a.NewContext = KindCode, action == auditCodeContext
		l, _ := detail["language"].(string)
		a.Language = codeLanguage(l)
		return a
	}
	a.Argv, _ = detail["argv"].([]string)
	return a
}
