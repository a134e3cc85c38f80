package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/wasm"
)

// nodeWASI runs the module named by argv[0] with Node's node:wasi (WASI
// preview 1), the way airlock's wasm tier does: compile, instantiate,
// _start.
const nodeWASI = `const {WASI}=require("node:wasi");const fs=require("node:fs");
const w=new WASI({version:"preview1",args:[process.argv[1]],env:{},returnOnExit:true});
WebAssembly.instantiate(fs.readFileSync(process.argv[1]),w.getImportObject()).then(({instance})=>{process.exitCode=w.start(instance)});`

// WasmFigures measures the wasm tier's cold start on wasm.HelloModule:
// `airlock run --runtime wasm -- hello.wasm` (exec'ed, disk cache warm)
// against `node` running the same module with node:wasi, and in-process
// runs: a warm engine (module compiled in memory, what a server does) and
// a fresh engine loading the module from the disk cache.
func WasmFigures(exe, scratch string, runs int, timeout time.Duration) []Figure {
	if timeout <= 0 {
		timeout = time.Minute
	}
	dir, err := os.MkdirTemp(scratch, "airlock-bench-wasm-")
	if err != nil {
		return []Figure{Unavailable("wasm cold start", err.Error())}
	}
	defer os.RemoveAll(dir)
	mod := filepath.Join(dir, "hello.wasm")
	if err := os.WriteFile(mod, wasm.HelloModule(), 0o644); err != nil {
		return []Figure{Unavailable("wasm cold start", err.Error())}
	}
	argv := []string{mod}

	cli := Peer{Name: Reference, Note: "airlock run --runtime wasm -- hello.wasm (the whole CLI, exec'ed; compilation cache in ~/.cache/airlock/wasm)"}
	if exe == "" {
		cli.Missing = "airlock binary unknown"
	}
	cli.Run = func(argv []string) error {
		return runWith(timeout, runSpec{}, exe, append([]string{"run", "--runtime", "wasm", "--"}, argv...)...)
	}
	node := Peer{Name: "node-wasi", Note: "node -e (node:wasi, preview1) on the same module, exec'ed"}
	if path, err := exec.LookPath("node"); err != nil {
		node.Missing = "node not installed"
	} else {
		node.Run = func(argv []string) error {
			return runWith(timeout, runSpec{}, path, append([]string{"--no-warnings", "-e", nodeWASI}, argv...)...)
		}
	}
	coldCLI := Alternate([]Peer{cli, node}, argv, runs)
	coldCLI.Name = "wasm cold start"

	pol, err := policy.Preset(policy.Strict)
	if err != nil {
		return []Figure{coldCLI, Unavailable("wasm start (in-process)", err.Error())}
	}
	pol.Runtime = policy.RuntimeWasm
	cache := filepath.Join(dir, "cache")
	warm, err := wasm.NewEngine(context.Background(), cache)
	if err != nil {
		return []Figure{coldCLI, Unavailable("wasm start (in-process)", err.Error())}
	}
	defer warm.Close()
	runIn := func(e *wasm.Engine, argv []string) error {
		m, err := wasm.ReadModule(argv[0])
		if err != nil {
			return err
		}
		res, err := e.Run(context.Background(), m, native.Config{Policy: pol, Args: argv}, native.RunOptions{Capture: true})
		if err != nil {
			return err
		}
		if res.Status != native.StatusOK || res.Stdout != wasm.HelloOutput {
			return fmt.Errorf("status %s, stdout %q: %s", res.Status, res.Stdout, res.Error)
		}
		return nil
	}
	inproc := Alternate([]Peer{
		{Name: Reference, Note: "Engine.Run in the bench process, engine warm (module compiled in memory): what a server pays per run", Run: func(argv []string) error { return runIn(warm, argv) }},
		{Name: "airlock-disk-cache", Note: "a fresh wasm.NewEngine per run, module loaded from the disk compilation cache: what the CLI pays after its Go start", Run: func(argv []string) error {
			e, err := wasm.NewEngine(context.Background(), cache)
			if err != nil {
				return err
			}
			defer e.Close()
			return runIn(e, argv)
		}},
	}, argv, runs)
	inproc.Name = "wasm start (in-process)"
	return []Figure{coldCLI, inproc}
}
