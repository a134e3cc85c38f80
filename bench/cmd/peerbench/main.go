// Command peerbench measures the cold-start figures of airlock's peers
// (bare, unshare, bwrap, crun, runc, runsc, srt) on this machine, alternating
// the peers in every round, and prints the table (and optionally JSON).
//
// Usage:
//
//	peerbench [-runs 10] [-runsc PATH] [-srt PATH] [-json FILE]
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/airlock-dev/airlock/bench"
)

func main() {
	runs := flag.Int("runs", 10, "measured rounds per figure")
	runsc := flag.String("runsc", "", "path of runsc (default: runsc on PATH)")
	srt := flag.String("srt", "", "path of sandbox-runtime's srt (default: srt on PATH)")
	python := flag.String("python", "/usr/bin/python3", "python interpreter for the cold python figure")
	jsonOut := flag.String("json", "", "also write the figures as JSON to this file")
	scratch := flag.String("scratch", "", "scratch directory for bundles (default: $TMPDIR)")
	flag.Parse()

	peers := bench.DetectPeers(bench.Options{Runsc: *runsc, Srt: *srt, ScratchDir: *scratch})
	type job struct {
		name string
		argv []string
	}
	jobs := []job{
		{"cold start", []string{"/bin/true"}},
		{"cold python", []string{*python, "-c", "pass"}},
	}
	fmt.Printf("load average before: %s\n", loadavg())
	var figs []bench.Figure
	for _, j := range jobs {
		fmt.Fprintf(os.Stderr, "peerbench: %s (%d rounds)\n", j.name, *runs)
		f := bench.Alternate(peers, j.argv, *runs)
		f.Name = j.name
		figs = append(figs, f)
	}
	fmt.Printf("load average after:  %s\n\n", loadavg())
	bench.PrintTable(os.Stdout, figs)
	if *jsonOut != "" {
		f, err := os.Create(*jsonOut)
		if err == nil {
			err = bench.WriteJSON(f, figs)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "peerbench:", err)
			os.Exit(1)
		}
	}
}

// loadavg returns the 1, 5 and 15 minute load averages, to judge how noisy
// the machine was during the run.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
