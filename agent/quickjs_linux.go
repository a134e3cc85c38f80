package agent

import (
	"fmt"
	"strconv"
	"strings"
)

// quickJSArg reads --quickjs-memory=N, which the wasm tier gives the agent:
// its JavaScript (and TypeScript) code contexts then run QuickJS for WASI
// in wazero (`airlock wasm-kernel`, with N bytes of linear memory) instead
// of node, so that a wasm sandbox's cells are WebAssembly too. It returns
// the kernel command (args[0], the agent's own binary: a wasm sandbox's
// agent is the whole airlock), or nil without the flag.
func quickJSArg(args []string) ([]string, error) {
	for i, arg := range args {
		v, ok := strings.CutPrefix(arg, "--quickjs-memory=")
		if !ok && arg == "--quickjs-memory" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("bad --quickjs-memory %q", v)
			}
			return []string{args[0], "wasm-kernel", "--memory", strconv.FormatInt(n, 10)}, nil
		}
	}
	return nil, nil
}

// quickJSKernel is the command of JavaScript kernels (nil: node), from
// --quickjs-memory.
var quickJSKernel []string
