// Command airlock runs untrusted code in sandboxes: one-shot (`airlock run`),
// as a server (`airlock serve`), or as MCP tools (`airlock mcp`).
package main

import (
	"fmt"
	"os"

	// Its init runs a plain native `airlock run` before the rest of the
	// binary is initialised (runcli/early.go).
	"github.com/airlock-dev/airlock/cmd/airlock/internal/runcli"
)

// Exit codes of airlock itself; a sandboxed command's own code passes through.
const (
	exitUsage      = runcli.ExitUsage   // bad flags, bad sizes, invalid policy
	exitSetup      = runcli.ExitSetup   // the sandbox could not be built
	exitTimeout    = runcli.ExitTimeout // the wall-clock deadline killed the sandbox
	exitOutput     = runcli.ExitOutput  // the output limit stopped the run
	exitNotExec    = runcli.ExitNotExec // command found but not executable inside
	exitNotFound   = runcli.ExitNotFound
	exitDoctorFail = 1
)

const usage = `airlock: run untrusted code in a sandbox

usage:
  airlock run [flags] -- CMD [ARGS...]   run one command in a fresh sandbox
  airlock run --code CODE [--language L]  run one Python, JavaScript or bash cell
  airlock run --image REF [-- CMD ...]   run in a root made from an image (default: its ENTRYPOINT and CMD)
  airlock serve [flags]                  serve the HTTP API (long-lived sandboxes)
  airlock shell --url URL --key KEY      interactive code session against a server
                                         (or $AIRLOCK_URL and $AIRLOCK_API_KEY)
  airlock ls|ps, create, exec [-it], logs, cp, kill, pause, resume
                                         drive sandboxes of a running server
  airlock images|volumes|templates ...   the server's images, volumes and builds
                                         (server: --url/--api-key or $AIRLOCK_URL, $AIRLOCK_API_KEY)
  airlock completion bash|zsh|fish       print a shell completion script
  airlock keys create|list|revoke        manage the server's API keys
  airlock image pull|import|ls|inspect|rm  manage OCI images (docs/images.md; ls -a: with build steps)
  airlock template build -f DF -t NAME    build an image from a Dockerfile (docs/images.md)
  airlock audit --state-dir DIR          print the server's audit log (filters: --sandbox, --key, --action, --since)
  airlock mcp [flags]                    serve sandboxes as MCP tools over stdio
  airlock doctor [--json]                report which isolation layers this host enforces
  airlock bench [--json] [--only NAME]   measure airlock against bwrap, crun, runc, runsc, srt
  airlock version [--json]               print the version, commit and its date

Run 'airlock COMMAND --help' for a command's flags. airlock run exits with the
program's code; 125 bad input, 123 sandbox not built, 124 timeout, 122 output
limit, 130/143 stopped by Ctrl-C/SIGTERM (the sandbox is removed).
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(exitUsage)
	}
	cmd, args := os.Args[1], os.Args[2:]
	var code int
	switch cmd {
	case "run":
		code = cmdRun(args)
	case "doctor":
		code = cmdDoctor(args)
	case "bench":
		code = cmdBench(args)
	case "version", "--version":
		code = cmdVersion(args)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		if h, ok := hidden[cmd]; ok {
			code = h(args)
			break
		}
		fmt.Fprintf(os.Stderr, "airlock: unknown command %q%s\n%s", cmd, suggestCommand(cmd), usage)
		code = exitUsage
	}
	os.Exit(code)
}

// hidden are subcommands registered by other files' init functions
// (serve, keys, mcp, and the internal __agent).
var hidden = map[string]func([]string) int{}
