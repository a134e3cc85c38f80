package interp

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

//go:embed kernels/python.py
var pythonKernel string

//go:embed kernels/javascript.js
var javascriptKernel string

//go:embed kernels/quickjs.js
var quickjsKernel string

//go:embed kernels/bash.sh
var bashPrelude string

// pythonBootstrap reads the kernel source from fd 3 ("<length>\n<source>")
// and runs it, so that the command line stays short.
const pythonBootstrap = `import os
def _r(n):
    b = b''
    while len(b) < n:
        c = os.read(3, n - len(b))
        if not c:
            raise SystemExit('airlock: kernel source truncated')
        b += c
    return b
_h = b''
while not _h.endswith(b'\n'):
    _h += _r(1)
exec(compile(_r(int(_h)), '<airlock-kernel>', 'exec'), {'__name__': '__airlock_kernel__', '__builtins__': __builtins__})
`

// javascriptBootstrap does the same for node; the source evaluates to a
// function that takes node's require.
const javascriptBootstrap = `const fs = require('fs');
const r = (n) => { const b = Buffer.alloc(n); let o = 0; while (o < n) { const k = fs.readSync(3, b, o, n - o, null); if (k === 0) process.exit(1); o += k; } return b; };
let h = ''; for (;;) { const c = r(1).toString('latin1'); if (c === '\n') break; h += c; }
require('vm').runInThisContext(r(+h).toString('utf8'), { filename: 'airlock-kernel.js' })(require);
`

// launch describes how to start a kernel: its argv, and what to write to its
// request pipe before the first request.
type launch struct {
	argv     []string
	preamble []byte
	// stdinIsRequests makes the request pipe the kernel's stdin (bash reads
	// its commands there) instead of /dev/null.
	stdinIsRequests bool
}

func (cfg *Config) launch(token string) launch {
	switch cfg.Language {
	case Python:
		return launch{
			argv:     []string{cfg.Python, "-u", "-c", pythonBootstrap},
			preamble: withInit(sourceFrame(pythonKernel), token),
		}
	case JavaScript, TypeScript:
		if len(cfg.QuickJS) > 0 {
			return launch{
				argv:     cfg.QuickJS,
				preamble: withInit(sourceFrame(quickjsKernel), token),
			}
		}
		return launch{
			argv:     []string{cfg.Node, "--expose-internals", "-e", javascriptBootstrap},
			preamble: withInit(sourceFrame(javascriptKernel), token),
		}
	default:
		return launch{
			argv:            []string{cfg.Bash, "--norc", "--noprofile", "--noediting", "+m", "-i"},
			preamble:        []byte(bashPrelude + "__airlock_ready " + token + "\n"),
			stdinIsRequests: true,
		}
	}
}

func sourceFrame(src string) []byte {
	return []byte(strconv.Itoa(len(src)) + "\n" + src)
}

// request is a cell request to the Python and JavaScript kernels.
type request struct {
	Init      bool              `json:"init,omitempty"`
	N         int               `json:"n,omitempty"`
	Code      string            `json:"code,omitempty"`
	Token     string            `json:"token"`
	MaxResult int               `json:"max_result,omitempty"`
	TimeoutMS float64           `json:"timeout_ms,omitempty"` // JavaScript enforces it itself
	Env       map[string]string `json:"env,omitempty"`
}

func withInit(b []byte, token string) []byte {
	line, _ := json.Marshal(request{Init: true, Token: token})
	return append(append(b, line...), '\n')
}

// errNUL rejects bash cells with NUL bytes, which bash strings cannot hold.
var errNUL = errors.New("interp: bash cells cannot contain NUL bytes")

// encodeRequest renders one cell request for the kernel's request pipe.
func encodeRequest(lang Language, n int, code, token string, maxResult int, timeout time.Duration, env map[string]string) ([]byte, error) {
	if lang != Bash {
		r := request{N: n, Code: code, Token: token, MaxResult: maxResult, Env: env}
		if (lang == JavaScript || lang == TypeScript) && timeout > 0 {
			r.TimeoutMS = float64(timeout) / float64(time.Millisecond)
		}
		b, err := json.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("interp: encoding request: %w", err)
		}
		return append(b, '\n'), nil
	}
	if strings.IndexByte(code, 0) >= 0 {
		return nil, errNUL
	}
	var b strings.Builder
	b.Grow(len(code) + 200)
	b.WriteString("__airlock_code=")
	b.WriteString(bashQuote(code))
	b.WriteString("; __airlock_go=1\n")
	b.WriteString(`[[ -n $__airlock_go ]] && `)
	// Assignments before eval are temporary and exported: the cell's
	// environment variables.
	names := make([]string, 0, len(env))
	for name := range env {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		b.WriteString(name + "=" + bashQuote(env[name]) + " ")
	}
	b.WriteString(`eval "$__airlock_code" </dev/null 4>&- 5>&- 6>&-` + "\n")
	fmt.Fprintf(&b, "__airlock_end %s %d $?\n", token, n)
	return []byte(b.String()), nil
}

// checkEnv validates a cell's environment variables.
func checkEnv(lang Language, env map[string]string) error {
	for name, value := range env {
		switch {
		case name == "" || strings.ContainsAny(name, "=\x00"):
			return fmt.Errorf("interp: invalid environment variable name %q", name)
		case strings.IndexByte(value, 0) >= 0:
			return fmt.Errorf("interp: environment variable %s contains a NUL byte", name)
		case lang == Bash && !isShellName(name):
			return fmt.Errorf("interp: %q is not a shell variable name", name)
		}
	}
	return nil
}

func isShellName(s string) bool {
	for i, c := range s {
		if !(c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return s != ""
}

// jsInterrupt asks the JavaScript kernel to end cell n if it is awaiting.
func jsInterrupt(n int) []byte {
	return []byte(fmt.Sprintf("{\"interrupt\":%d}\n", n))
}

// bashNudge is written to a bash kernel that has not reported the end of an
// interrupted cell: if the interrupt landed between the cell and its end
// report, the shell is idle and runs this; otherwise it runs after the cell
// and the Go side ignores the duplicate.
func bashNudge(n int, token string) []byte {
	return []byte(fmt.Sprintf("__airlock_end %s %d 130\n", token, n))
}

// bashQuote quotes s as a bash $'...' string on one line.
func bashQuote(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString("$'")
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b.WriteString(`\\`)
		case c == '\'':
			b.WriteString(`\'`)
		case c == '\n':
			b.WriteString(`\n`)
		case c < 0x20 || c == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// kernelEnv is the environment a kernel starts with.
func (cfg *Config) kernelEnv() []string {
	env := cfg.Env
	if env == nil {
		env = os.Environ()
	}
	env = append([]string(nil), env...)
	switch cfg.Language {
	case Python:
		env = setEnv(env, "PYTHONUNBUFFERED", "1")
		env = setEnv(env, "PYTHONIOENCODING", "utf-8")
		env = setEnv(env, "MPLBACKEND", "Agg")
		env = unsetEnv(env, "PYTHONINSPECT")
		env = unsetEnv(env, "PYTHONSTARTUP")
	case Bash:
		env = unsetEnv(env, "BASH_ENV")
		env = unsetEnv(env, "ENV")
		if !hasEnv(env, "TERM") {
			env = append(env, "TERM=dumb")
		}
	}
	return env
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

func setEnv(env []string, key, value string) []string {
	return append(unsetEnv(env, key), key+"="+value)
}

func unsetEnv(env []string, key string) []string {
	out := env[:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return out
}
