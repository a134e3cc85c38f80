package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
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
	only := fs.String("only", "", "comma-separated figures to run: cold, pooled, exec, cell, throughput, density, wasm, gvisor, image, concurrent, microvm, desktop (default: all), and kubernetes (only when named: needs a real cluster, see --kube-*)")
	runs := fs.Int("runs", 10, "measured rounds per timed figure")
	runsc := fs.String("runsc", "", "path of gVisor's runsc (default: runsc on PATH)")
	srt := fs.String("srt", "", "path of sandbox-runtime's srt (default: srt on PATH)")
	python := fs.String("python", "/usr/bin/python3", "interpreter of the cold python figure")
	densityMax := fs.Int("density-max", 100, "most idle sandboxes started per peer for the density figure")
	densityBudget := fs.String("density-budget", "2G", "most memory the idle sandboxes of one peer may cost, e.g. 512M, 4G")
	densityTime := fs.Duration("density-time", 10*time.Second, "most time spent starting one peer's idle sandboxes")
	scratch := fs.String("scratch", "", "directory for OCI bundles and runtime state (default: $TMPDIR)")
	var ko bench.KubeOptions
	fs.StringVar(&ko.URL, "kube-url", "", "with --only kubernetes: URL of an airlock serve --backend kubernetes --pool N")
	fs.StringVar(&ko.Key, "kube-key", os.Getenv("AIRLOCK_API_KEY"), "with --only kubernetes: its API key (default $AIRLOCK_API_KEY)")
	fs.StringVar(&ko.Kubectl, "kubectl", "", "with --only kubernetes: kubectl binary (default: kubectl on PATH)")
	fs.StringVar(&ko.Kubeconfig, "kubeconfig", "", "with --only kubernetes: kubeconfig for kubectl")
	fs.StringVar(&ko.Namespace, "kube-namespace", "", "with --only kubernetes: the sandboxes' namespace (where the warm pool is)")
	fs.StringVar(&ko.RunNamespace, "kube-run-namespace", "default", "with --only kubernetes: namespace of the kubectl run pods")
	fs.StringVar(&ko.Image, "kube-image", "", "with --only kubernetes: the server's default image, which kubectl run starts too")
	fs.IntVar(&ko.Claims, "kube-claims", 50, "with --only kubernetes: pooled claims measured")
	fs.BoolVar(&ko.PooledOnly, "kube-pooled-only", false, "with --only kubernetes: only the pooled claims (no unpooled creates or kubectl run)")
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
	var rest []string
	kube := false
	for _, k := range strings.Split(*only, ",") {
		if strings.TrimSpace(k) == bench.KubeKey {
			kube = true
		} else {
			rest = append(rest, k)
		}
	}
	var keys []string
	if !kube || strings.TrimSpace(strings.Join(rest, "")) != "" {
		var err error
		if keys, err = bench.ParseOnly(strings.Join(rest, ",")); err != nil {
			fmt.Fprintf(os.Stderr, "airlock bench: --only: %v\n", err)
			return exitUsage
		}
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
	if kube {
		ko.Runs = *runs
		ko.Progress = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "airlock bench: "+format+"\n", args...) }
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := bench.CheckKube(ctx, ko)
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock bench: %v\n", err)
			return exitSetup
		}
	}
	var rep *bench.Report
	if len(keys) == 0 {
		rep = &bench.Report{Machine: bench.DescribeMachine(), Started: time.Now(), LoadBefore: bench.LoadAverage()}
	} else {
		rep = bench.Run(bench.Config{
			Only:         keys,
			Runs:         *runs,
			Airlock:      exe,
			Peers:        bench.Options{Runsc: *runsc, Srt: *srt, ScratchDir: *scratch},
			Python:       *python,
			Density:      bench.DensityOptions{Max: *densityMax, Budget: budget, StartTime: *densityTime},
			DesktopCache: *desktopCache,
			Progress:     os.Stderr,
		})
	}
	// The kubernetes figures are run on purpose, on a cluster made for
	// them (scripts/kubernetes-e2e.sh): a failed round fails the command.
	var kubeFailed []string
	if kube {
		figs := bench.KubernetesFigures(ko)
		for _, f := range figs {
			for _, r := range f.Results {
				if r.Failures > 0 || len(r.Samples) == 0 {
					kubeFailed = append(kubeFailed, fmt.Sprintf("%s, %s: %d failed rounds (%s)", f.Name, r.Peer, r.Failures, r.Error))
				}
			}
		}
		rep.Figures = append(rep.Figures, figs...)
		rep.LoadAfter = bench.LoadAverage()
		rep.DurationS = time.Since(rep.Started).Seconds()
	}
	rep.Command = append([]string{"airlock"}, os.Args[1:]...)
	if *asJSON {
		if err := rep.WriteJSON(os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "airlock bench: %v\n", err)
			return 1
		}
	} else {
		rep.Print(os.Stdout)
	}
	for _, f := range kubeFailed {
		fmt.Fprintf(os.Stderr, "airlock bench: %s\n", f)
	}
	if len(kubeFailed) > 0 {
		return 1
	}
	return 0
}
