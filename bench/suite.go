package bench

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Keys are the figure groups `airlock bench --only` selects, in the order
// they run: cold (cold start, cold python, cold start in-process), pooled,
// exec, cell, throughput and density.
var Keys = []string{"cold", "pooled", "exec", "cell", "throughput", "density"}

// ParseOnly splits a comma-separated --only value into keys, checking each
// against Keys. Empty means every key.
func ParseOnly(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return slices.Clone(Keys), nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(Keys, k) {
			return nil, fmt.Errorf("unknown figure %q (want one of %s)", k, strings.Join(Keys, ", "))
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

// Config configures a run of the suite.
type Config struct {
	// Only lists the figure groups to run (see Keys); empty means all.
	Only []string
	// Runs is the number of measured rounds of the timed figures; zero
	// means 20.
	Runs int
	// Airlock is the airlock binary the cold figures exec as
	// `airlock run -- CMD`.
	Airlock string
	// Peers says where to find the peers.
	Peers Options
	// Python is the interpreter of the cold python figure; empty means
	// /usr/bin/python3.
	Python string
	// Density configures the density figure.
	Density DensityOptions
	// Idle is the idle command of the density figure; empty means
	// /bin/sleep 3600.
	Idle []string
	// Progress, if set, receives a line as each figure starts.
	Progress io.Writer
}

// serverMissing is why the figures that need airlock's sandbox server are
// unavailable in this build.
const serverMissing = "needs the sandbox server (packages airlock/manager, airlock/server and airlock/client, issue 4), " +
	"which is not in this build yet"

// Run runs the selected figures, each alternating airlock with every peer
// found on this machine, and returns the report. Figures that cannot be
// measured in this build are included as unavailable, with the reason.
func Run(cfg Config) *Report {
	if cfg.Runs <= 0 {
		cfg.Runs = 20
	}
	if cfg.Python == "" {
		cfg.Python = "/usr/bin/python3"
	}
	if len(cfg.Idle) == 0 {
		cfg.Idle = []string{"/bin/sleep", "3600"}
	}
	if len(cfg.Only) == 0 {
		cfg.Only = slices.Clone(Keys)
	}
	progress := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "airlock bench: "+format+"\n", args...)
		}
	}
	if cfg.Density.Progress == nil {
		cfg.Density.Progress = progress
	}
	cfg.Density.defaults()
	rep := &Report{Machine: DescribeMachine(), Started: time.Now(), LoadBefore: LoadAverage()}
	others := DetectPeers(cfg.Peers)
	cli := append([]Peer{AirlockCLI(cfg.Airlock, cfg.Peers.Timeout)}, others...)
	inproc := append([]Peer{AirlockInProcess()}, others...)

	timed := func(name string, peers []Peer, argv []string) {
		progress("%s: %d rounds of %s", name, cfg.Runs, strings.Join(argv, " "))
		f := Alternate(peers, argv, cfg.Runs)
		f.Name = name
		rep.Figures = append(rep.Figures, f)
	}
	for _, key := range Keys {
		if !slices.Contains(cfg.Only, key) {
			continue
		}
		switch key {
		case "cold":
			timed("cold start", cli, []string{"/bin/true"})
			timed("cold python", cli, []string{cfg.Python, "-c", "pass"})
			timed("cold start (in-process)", inproc, []string{"/bin/true"})
		case "pooled":
			rep.Figures = append(rep.Figures, Unavailable("pooled start", serverMissing))
		case "exec":
			rep.Figures = append(rep.Figures, Unavailable("exec", serverMissing))
		case "cell":
			rep.Figures = append(rep.Figures, Unavailable("code cell", serverMissing))
		case "throughput":
			rep.Figures = append(rep.Figures, Unavailable("throughput", serverMissing))
		case "density":
			rep.Figures = append(rep.Figures, Unavailable("density (live, agent up)", serverMissing))
			progress("density (idle): up to %d sandboxes of %s per peer", cfg.Density.Max, strings.Join(cfg.Idle, " "))
			rep.Figures = append(rep.Figures, Density(inproc, cfg.Idle, cfg.Density))
		}
	}
	rep.LoadAfter = LoadAverage()
	rep.DurationS = time.Since(rep.Started).Seconds()
	return rep
}

// LoadAverage returns the 1, 5 and 15 minute load averages, or "unknown".
func LoadAverage() string {
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

// DescribeMachine returns what is known about this host.
func DescribeMachine() *Machine {
	m := &Machine{
		CPUs:        runtime.NumCPU(),
		Kernel:      kernelRelease(),
		MemTotalMiB: meminfo()["MemTotal"] >> 20,
		Go:          runtime.Version(),
		Root:        os.Geteuid() == 0,
		Cgroups:     cgroupLayout(),
	}
	return m
}
