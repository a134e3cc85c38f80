package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/interp"
	"github.com/airlock-dev/airlock/runtime/native"
)

func init() {
	hidden["shell"] = cmdShell
	// __cell runs one code cell inside a sandbox (airlock run --code): the
	// code on stdin, the outcome as one JSON cellOutcome on stdout.
	hidden["__cell"] = cmdCellInside
}

// cellOutcome is what __cell reports to airlock run --code.
type cellOutcome struct {
	Language       string              `json:"language"`
	ExecutionCount int                 `json:"execution_count"`
	Stdout         string              `json:"stdout"`
	Stderr         string              `json:"stderr"`
	Results        []map[string]string `json:"results"`
	Text           string              `json:"text,omitempty"`
	Error          *interp.ExecError   `json:"error,omitempty"`
	Truncated      bool                `json:"truncated"`
	// Sandbox is the status of the sandbox run (ok, timeout, oom...).
	Sandbox string `json:"sandbox_status,omitempty"`
}

// cmdCellInside is __cell: it runs inside the sandbox.
func cmdCellInside(args []string) int {
	fs := flag.NewFlagSet("__cell", flag.ContinueOnError)
	lang := fs.String("language", "python", "")
	maxOut := fs.Int("max-output", 1<<20, "")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	code, err := io.ReadAll(io.LimitReader(os.Stdin, maxCodeBytes))
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock __cell: reading the code: %v\n", err)
		return 1
	}
	ctx := context.Background()
	cwd, _ := os.Getwd()
	k, err := interp.Start(ctx, interp.Config{Language: interp.Language(*lang), Cwd: cwd})
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock __cell: %v\n", err)
		return 1
	}
	defer k.Close()
	res, err := k.Execute(ctx, string(code), 0, *maxOut, nil)
	if err != nil && res == nil {
		fmt.Fprintf(os.Stderr, "airlock __cell: %v\n", err)
		return 1
	}
	out := cellOutcome{Language: *lang, ExecutionCount: res.ExecutionCount, Stdout: res.Stdout, Stderr: res.Stderr,
		Results: res.Results, Error: res.Error, Truncated: res.Truncated}
	if out.Results == nil {
		out.Results = []map[string]string{}
	}
	out.Text = mainText(out.Results)
	json.NewEncoder(os.Stdout).Encode(out)
	return 0
}

// mainText is the text/plain of the last result that is not a figure.
func mainText(results []map[string]string) string {
	for i := len(results) - 1; i >= 0; i-- {
		r := results[i]
		if _, png := r["image/png"]; png && strings.HasPrefix(r["text/plain"], "<Figure") {
			continue
		}
		return r["text/plain"]
	}
	return ""
}

// runCodeCell is airlock run --code: one cell in a fresh sandbox.
func runCodeCell(ctx context.Context, cfg native.Config, opts native.RunOptions, code, lang string, asJSON bool) int {
	switch lang {
	case "python", "javascript", "bash":
	default:
		fmt.Fprintf(os.Stderr, "airlock run: --language must be python, javascript or bash, not %q\n", lang)
		return exitUsage
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock run: locate own binary: %v\n", err)
		return exitSetup
	}
	cfg.AgentBinary = self
	cfg.Args = []string{native.AgentPath, "__cell", "--language", lang}
	opts.Stdin = strings.NewReader(code)
	opts.Stdout, opts.Stderr = nil, nil
	opts.Capture = true
	res, err := runSandbox(ctx, cfg, opts)
	var out cellOutcome
	if res != nil && res.Stdout != "" {
		if jerr := json.Unmarshal([]byte(res.Stdout), &out); jerr != nil && err == nil {
			err = fmt.Errorf("reading the cell's outcome: %w", jerr)
		}
	}
	if res != nil {
		out.Sandbox = string(res.Status)
	}
	if err == nil && out.Language == "" {
		msg := "the cell did not report an outcome"
		if res != nil {
			msg += " (sandbox status " + string(res.Status) + ")"
			if res.Stderr != "" {
				msg += ": " + strings.TrimSpace(res.Stderr)
			}
		}
		err = errors.New(msg)
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(out)
	} else {
		os.Stdout.WriteString(out.Stdout)
		os.Stderr.WriteString(out.Stderr)
		images := 0
		for _, r := range out.Results {
			saveImage(r, 1, &images)
		}
		if out.Text != "" {
			fmt.Println(out.Text)
		}
		if out.Error != nil {
			printTraceback(out.Error.Name, out.Error.Value, out.Error.Traceback)
		}
	}
	switch {
	case err != nil:
		fmt.Fprintf(os.Stderr, "airlock run: %s\n", oneLine(err))
		if res != nil {
			return exitCodeFor(res)
		}
		return exitSetup
	case out.Error != nil:
		return 1
	}
	return 0
}

func printTraceback(name, value string, tb []string) {
	for _, l := range tb {
		fmt.Fprintln(os.Stderr, strings.TrimRight(l, "\n"))
	}
	if len(tb) == 0 || !strings.Contains(tb[len(tb)-1], name) {
		fmt.Fprintf(os.Stderr, "%s: %s\n", name, value)
	}
}

const shellUsage = `usage: airlock shell --url URL [--key KEY] [--language python|javascript|bash] [--sandbox ID]
       airlock shell --tty --url URL [--key KEY] [--sandbox ID] [CMD [ARGS...]]

Opens an interactive code session against an airlock server: cells are read
from stdin (on a terminal, one line per cell, or a block ended by a blank
line when a line ends with ':' or '\'; from a pipe, blocks separated by blank
lines), run in a persistent context, and their output printed. Images are
saved to files (cell-N-M.png) in the current directory. Without --sandbox a
new sandbox is created and killed at the end. The URL and the key may also
come from $AIRLOCK_URL and $AIRLOCK_API_KEY (a flag wins over them).

With --tty it is a terminal instead: CMD (default the sandbox's login shell)
runs on a pseudo-terminal of the sandbox (GET /v1/sandboxes/{id}/pty); this
terminal is put in raw mode and restored at the end, window size changes
follow, Ctrl-C goes to the sandbox's foreground job, and the exit status is
the command's. The sandbox gets a fresh terminal of its own, never this one.
`

// cmdShell is airlock shell.
func cmdShell(args []string) int {
	fs := flag.NewFlagSet("shell", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	url := fs.String("url", os.Getenv("AIRLOCK_URL"), "server URL, e.g. http://127.0.0.1:7070 (default $AIRLOCK_URL)")
	key := fs.String("key", os.Getenv("AIRLOCK_API_KEY"), "API key (al_...) (default $AIRLOCK_API_KEY)")
	fs.StringVar(key, "api-key", os.Getenv("AIRLOCK_API_KEY"), "same as --key (the spelling of the other verbs against a server)")
	lang := fs.String("language", "python", "python, javascript or bash")
	sbID := fs.String("sandbox", "", "use this running sandbox instead of creating one")
	timeout := fs.Duration("timeout", 5*time.Minute, "per-cell timeout")
	ttyMode := fs.Bool("tty", false, "a terminal instead of a code session: CMD (default the login shell) on a pseudo-terminal of the sandbox; this terminal goes raw, its size follows")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fmt.Print(shellUsage)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(os.Stderr, "airlock shell: %v\n%s", suggestFlag(fs, err), shellUsage)
		return exitUsage
	}
	if *url == "" {
		fmt.Fprintf(os.Stderr, "airlock shell: the server's URL is required: --url URL or $AIRLOCK_URL\n%s", shellUsage)
		return exitUsage
	}
	if fs.NArg() > 0 && !*ttyMode {
		fmt.Fprintf(os.Stderr, "airlock shell: %v\n%s", errNoTTYArgs, shellUsage)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	c := client.New(strings.TrimRight(*url, "/"), *key)
	id := *sbID
	if id == "" {
		sb, err := c.Create(ctx, client.CreateRequest{Metadata: map[string]string{"client": "airlock-shell"}})
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock shell: create sandbox: %v\n", err)
			return 1
		}
		id = sb.ID
		defer c.Kill(context.Background(), id)
	}
	if *ttyMode {
		return shellTTY(ctx, c, id, fs.Args(), "", "airlock shell")
	}
	cx, err := c.CreateContext(ctx, id, client.ContextRequest{Language: *lang})
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock shell: create %s context: %v\n", *lang, err)
		return 1
	}
	tty := isTerminal(os.Stdin)
	if tty {
		fmt.Fprintf(os.Stderr, "airlock shell: sandbox %s, %s context %s; end with Ctrl-D\n", id, cx.Language, cx.ID)
	}
	// Ctrl-C interrupts the running cell, not the shell.
	intr := make(chan os.Signal, 1)
	signal.Notify(intr, os.Interrupt)
	defer signal.Stop(intr)
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	n := 0
	status := 0
	for {
		cell, ok := readCell(sc, tty)
		if !ok {
			break
		}
		if strings.TrimSpace(cell) == "" {
			continue
		}
		n++
		if !runShellCell(ctx, c, id, cx.ID, cell, n, *timeout, intr) {
			status = 1
		}
	}
	return status
}

// readCell reads one cell: see shellUsage.
func readCell(sc *bufio.Scanner, tty bool) (string, bool) {
	if tty {
		fmt.Fprint(os.Stderr, ">>> ")
	}
	var lines []string
	for sc.Scan() {
		line := sc.Text()
		if tty && len(lines) == 0 && !strings.HasSuffix(line, ":") && !strings.HasSuffix(line, "\\") {
			return line, true
		}
		if line == "" {
			if len(lines) == 0 {
				if tty {
					fmt.Fprint(os.Stderr, ">>> ")
				}
				continue
			}
			return strings.Join(lines, "\n"), true
		}
		lines = append(lines, strings.TrimSuffix(line, "\\"))
		if tty {
			fmt.Fprint(os.Stderr, "... ")
		}
	}
	if len(lines) > 0 {
		return strings.Join(lines, "\n"), true
	}
	return "", false
}

// runShellCell streams one cell's outputs; it reports whether it succeeded.
func runShellCell(ctx context.Context, c *client.Client, id, cid, code string, n int, timeout time.Duration, intr chan os.Signal) bool {
	st, err := c.RunCodeStream(ctx, id, client.CodeRequest{ContextID: cid, Code: code, Timeout: timeout})
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock shell: %v\n", err)
		return false
	}
	defer st.Close()
	done := make(chan struct{})
	defer close(done)
	var eid string
	eidc := make(chan string, 1)
	go func() {
		var e string
		for {
			select {
			case e = <-eidc:
			case <-intr:
				if e != "" {
					c.InterruptCode(context.Background(), id, e)
				}
			case <-done:
				return
			}
		}
	}()
	ok, images := true, 0
	for {
		ev, err := st.Next()
		if errors.Is(err, io.EOF) {
			return ok
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock shell: %v\n", err)
			return false
		}
		switch ev.Type {
		case "start":
			eid = ev.ExecutionID
			eidc <- eid
		case "stdout":
			os.Stdout.WriteString(ev.Text)
		case "stderr":
			os.Stderr.WriteString(ev.Text)
		case "result":
			if !saveImage(ev.Data, n, &images) {
				if t, has := ev.Data["text/plain"]; has {
					fmt.Println(t)
				} else {
					for mt := range ev.Data {
						fmt.Printf("[%s result, %d bytes]\n", mt, len(ev.Data[mt]))
					}
				}
			}
		case "error":
			ok = false
			if ev.Error != nil {
				printTraceback(ev.Error.Name, ev.Error.Value, ev.Error.Traceback)
			}
		case "end":
			if ev.End != nil && ev.End.Restarted {
				fmt.Fprintln(os.Stderr, "[the interpreter had died: this cell ran in a fresh one; earlier state is lost]")
			}
			if ev.End != nil && ev.End.Truncated {
				fmt.Fprintln(os.Stderr, "[output truncated]")
			}
		}
	}
}

// saveImage saves a result's PNG or JPEG, if it has one, to
// cell-CELL-N.EXT in the current directory (N counts the cell's images),
// says so on stdout, and reports whether the result was an image.
func saveImage(data map[string]string, cell int, images *int) bool {
	for _, mt := range []string{"image/png", "image/jpeg"} {
		b64, has := data[mt]
		if !has {
			continue
		}
		*images++
		name := fmt.Sprintf("cell-%d-%d.%s", cell, *images, strings.TrimPrefix(mt, "image/"))
		b, err := base64.StdEncoding.DecodeString(b64)
		if err == nil {
			err = os.WriteFile(name, b, 0o644)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "[%s: not saved: %v]\n", mt, err)
		} else {
			fmt.Printf("[%s saved to %s, %d bytes]\n", mt, name, len(b))
		}
		return true
	}
	return false
}
