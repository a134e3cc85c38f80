package interp

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/evanw/esbuild/pkg/api"
)

// tsOptions transpile a TypeScript cell for the JavaScript kernel: types
// are stripped (not checked), the syntax is left as modern as node runs
// it, and imports are kept verbatim (a cell's import may serve a later
// cell, so an import unused in its own cell must not be dropped; the
// kernel turns imports into dynamic ones).
var tsOptions = api.TransformOptions{
	Loader:      api.LoaderTS,
	Format:      api.FormatDefault,
	Target:      api.ESNext,
	Sourcefile:  "cell.ts",
	TsconfigRaw: `{"compilerOptions": {"verbatimModuleSyntax": true}}`,
	LogLevel:    api.LogLevelSilent,
}

// transpileTS returns the JavaScript for a TypeScript cell. A cell that
// does not transpile becomes one that throws the transpiler's SyntaxError,
// so that it fails like any cell with a syntax error.
func transpileTS(code string) string {
	r := api.Transform(code, tsOptions)
	if len(r.Errors) == 0 {
		return string(r.Code)
	}
	var msgs []string
	for _, m := range r.Errors {
		if m.Location != nil {
			msgs = append(msgs, m.Text+" ("+m.Location.LineText+", line "+strconv.Itoa(m.Location.Line)+")")
		} else {
			msgs = append(msgs, m.Text)
		}
	}
	msg, _ := json.Marshal(strings.Join(msgs, "; "))
	return "throw new SyntaxError(" + string(msg) + ");\n"
}
