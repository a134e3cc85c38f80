package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/airlock-dev/airlock/bench"
	"github.com/airlock-dev/airlock/policy"
)

// cmdBench runs `airlock bench`: airlock against its peers, alternating, in
// one run (see package bench and docs/benchmarks.md).
func cmdBench(args []string) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "print the report as JSON instead of a table")
	only := fs.String("only", "", "comma-separated figures to run: cold, pooled, exec, cell, throughput, density, wasm, gvisor, image, concurrent, microvm, desktop (default: all)")
	runs := fs.Int("runs", 10, "measured rounds per timed figure")
	runsc := fs.String("runsc", "", "path of gVisor's runsc (default: runsc on PATH)")
	srt := fs.String("srt", "", "path of sandbox-runtime's srt (default: srt on PATH)")
	python := fs.String("python", "/usr/bin/python3", "interpreter of the cold python figure")
	densityMax := fs.Int("density-max", 100, "most idle sandboxes started per peer for the density figure")
	densityBudget := fs.String("density-budget", "2G", "most memory the idle sandboxes of one peer may cost, e.g. 512M, 4G")
	densityTime := fs.Duration("density-time", 10*time.Second, "most time spent starting one peer's idle sandboxes")
	scratch := fs.String("scratch", "", "directory for OCI bundles and runtime state (default: $TMPDIR)")
	desktopCache := fs.String("desktop-cache", "/var/cache/airlock/images", "cache of the desktop image's build for the desktop figures (go run ./debimage/mkimage -cache DIR desktop builds it; a missing one is built, taking minutes)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fmt.Println("usage: airlock bench [--json] [--only NAME[,NAME]] [--runs N] [--runsc PATH] [--srt PATH] [--density-max N] [--density-budget SIZE]")
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(os.Stderr, "airlock bench: %v\n", suggestFlag(fs, err))
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "airlock bench: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	keys, err := bench.ParseOnly(*only)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock bench: --only: %v\n", err)
		return exitUsage
	}
	if *runs < 1 {
		fmt.Fprintln(os.Stderr, "airlock bench: --runs must be at least 1")
		return exitUsage
	}
	if *densityMax < 1 {
		fmt.Fprintln(os.Stderr, "airlock bench: --density-max must be at least 1")
		return exitUsage
	}
	budget, err := policy.ParseSize(*densityBudget)
	if err != nil || budget <= 0 {
		fmt.Fprintf(os.Stderr, "airlock bench: --density-budget: bad size %q\n", *densityBudget)
		return exitUsage
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock bench: cannot find the airlock binary: %v\n", err)
		return exitSetup
	}
	rep := bench.Run(bench.Config{
		Only:         keys,
		Runs:         *runs,
		Airlock:      exe,
		Peers:        bench.Options{Runsc: *runsc, Srt: *srt, ScratchDir: *scratch},
		Python:       *python,
		Density:      bench.DensityOptions{Max: *densityMax, Budget: budget, StartTime: *densityTime},
		DesktopCache: *desktopCache,
		Progress:     os.Stderr,
	})
	rep.Command = append([]string{"airlock"}, os.Args[1:]...)
	if *asJSON {
		if err := rep.WriteJSON(os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "airlock bench: %v\n", err)
			return 1
		}
		return 0
	}
	rep.Print(os.Stdout)
	return 0
}
