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
// they run: cold (cold start, cold python, cold start in-process), pooled
// (pooled start, live start without a pool), exec, cell (code cell),
// throughput, density, wasm (the wasm tier's cold start, against node)
// gvisor (the gvisor tier's cold start, against runsc's own run, and
// exec in a live gvisor sandbox, against a native one and runsc exec),
// image (create from an image against the default root), concurrent (1, 10
// and 50 clients creating a sandbox and running a command at once: native,
// native from an image and gVisor against crun, runc and runsc), microvm
// (the microvm tier's cold start, against QEMU booting the same kernel) and
// desktop (the desktop image: create from the warm pool to the first
// screenshot, and a screenshot's latency; DesktopFigures).
var Keys = []string{"cold", "pooled", "exec", "cell", "throughput", "density", "wasm", "gvisor", "image", "concurrent", "microvm", "desktop"}

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
	// means 10.
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
	// Clients is the number of concurrent clients of the throughput
	// figure; zero means 4.
	Clients int
	// Window is how long each throughput sample runs; zero means one
	// second.
	Window time.Duration
	// DesktopCache is the build cache of the desktop image (package
	// debimage) for the desktop figures; empty means
	// /var/cache/airlock/images.
	DesktopCache string
	// Progress, if set, receives a line as each figure starts.
	Progress io.Writer
}

// Run runs the selected figures, each alternating airlock with every peer
// found on this machine, and returns the report. Figures that cannot be
// measured in this build are included as unavailable, with the reason. The
// figures that go through airlock's API start `airlock serve` (the Airlock
// binary) once and stop it at the end.
func Run(cfg Config) *Report {
	if cfg.Runs <= 0 {
		cfg.Runs = 10
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
	if cfg.Clients <= 0 {
		cfg.Clients = 4
	}
	if cfg.Window <= 0 {
		cfg.Window = time.Second
	}
	begin := time.Now()
	progress := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "airlock bench: %4.0fs: "+format+"\n",
				append([]any{time.Since(begin).Seconds()}, args...)...)
		}
	}
	if cfg.Density.Progress == nil {
		cfg.Density.Progress = progress
	}
	cfg.Density.defaults()
	rep := &Report{Machine: DescribeMachine(), Started: time.Now(), LoadBefore: LoadAverage()}
	others := DetectPeers(cfg.Peers)
	cli := append([]Peer{AirlockCLI(cfg.Airlock, cfg.Peers.Timeout)}, others...)
	inproc := append([]Peer{AirlockInProcess()}, fastOnly(others)...)

	// The API server, started on first use.
	var (
		srv     *apiServer
		srvErr  error
		started bool
	)
	api := func() Peer {
		if !started {
			started = true
			scratch := cfg.Peers.ScratchDir
			if scratch == "" {
				scratch = os.TempDir()
			}
			progress("starting airlock serve")
			srv, srvErr = startServer(cfg.Airlock, scratch, cfg.Density.Max+8, cfg.Peers.Timeout)
		}
		if srvErr != nil {
			return Peer{Name: Reference, Missing: "airlock serve did not start: " + srvErr.Error()}
		}
		return srv.peer()
	}
	defer func() { srv.stop() }()
	withAPI := func(extra ...Peer) []Peer {
		return append(append([]Peer{api()}, extra...), others...)
	}

	timed := func(name string, peers []Peer, argv []string) {
		progress("%s: %d rounds of %s", name, cfg.Runs, strings.Join(argv, " "))
		f := Alternate(peers, argv, cfg.Runs)
		f.Name = name
		rep.Figures = append(rep.Figures, f)
	}
	true_ := []string{"/bin/true"}
	for _, key := range Keys {
		if !slices.Contains(cfg.Only, key) {
			continue
		}
		switch key {
		case "cold":
			timed("cold start", cli, true_)
			timed("cold python", cli, []string{cfg.Python, "-c", "pass"})
			timed("cold start (in-process)", inproc, true_)
		case "pooled":
			progress("pooled start: %d rounds", cfg.Runs)
			scratch := cfg.Peers.ScratchDir
			if scratch == "" {
				scratch = os.TempDir()
			}
			rep.Figures = append(rep.Figures, PooledStartFigure(cfg.Airlock, scratch, others, cfg.Runs, cfg.Peers.Timeout))
			progress("live start (no pool): %d rounds", cfg.Runs)
			rep.Figures = append(rep.Figures, LiveStartFigure(withAPI(), true_, cfg.Runs))
		case "exec":
			progress("exec: %d rounds", cfg.Runs)
			rep.Figures = append(rep.Figures, ExecFigure(withAPI(), true_, cfg.Runs))
		case "cell":
			if api(); srvErr != nil {
				rep.Figures = append(rep.Figures, Unavailable("code cell", "airlock serve did not start: "+srvErr.Error()))
			} else {
				progress("code cell: %d rounds", cfg.Runs)
				rep.Figures = append(rep.Figures, srv.CodeCellFigure(others, cfg.Runs))
			}
		case "throughput":
			rounds := max(3, cfg.Runs/4)
			progress("throughput: %d rounds of %d clients for %s", rounds, cfg.Clients, cfg.Window)
			rep.Figures = append(rep.Figures, ThroughputFigure(withAPI(), true_, rounds, cfg.Clients, cfg.Window))
		case "density":
			progress("density: up to %d sandboxes per peer", cfg.Density.Max)
			rep.Figures = append(rep.Figures, Density(withAPI(AirlockNativeIdle()), cfg.Idle, cfg.Density))
		case "desktop":
			scratch := cfg.Peers.ScratchDir
			if scratch == "" {
				scratch = os.TempDir()
			}
			cache := cfg.DesktopCache
			if cache == "" {
				cache = "/var/cache/airlock/images"
			}
			rep.Figures = append(rep.Figures, DesktopFigures(cfg.Airlock, scratch, cache, cfg.Runs, cfg.Peers.Timeout, progress)...)
		case "microvm":
			progress("microvm cold start: %d rounds of /bin/true", cfg.Runs)
			scratch := cfg.Peers.ScratchDir
			if scratch == "" {
				scratch = os.TempDir()
			}
			rep.Figures = append(rep.Figures, MicroVMFigure(cfg.Airlock, scratch, cfg.Runs, 0))
			progress("microvm through airlock serve: create, exec, pause and resume, idle memory")
			rep.Figures = append(rep.Figures, MicroVMServeFigures(cfg.Airlock, scratch, cfg.Runs, cfg.Density, 0)...)
		case "wasm":
			progress("wasm: %d rounds of a hello-world module", cfg.Runs)
			rep.Figures = append(rep.Figures, WasmFigures(cfg.Airlock, cfg.Peers.ScratchDir, cfg.Runs, cfg.Peers.Timeout)...)
		case "image":
			progress("create from an image: %d rounds", cfg.Runs)
			scratch := cfg.Peers.ScratchDir
			if scratch == "" {
				scratch = os.TempDir()
			}
			rep.Figures = append(rep.Figures, ImageCreateFigure(scratch, cfg.Runs))
			progress("gvisor create from an image: %d rounds", cfg.Runs)
			rep.Figures = append(rep.Figures, GVisorImageCreateFigure(scratch, cfg.Runs))
		case "concurrent":
			rounds := max(2, cfg.Runs/5)
			progress("concurrent creates: %d rounds at %v clients", rounds, ConcurrencyLevels)
			peers := []Peer{api()}
			restore := func() {}
			if srvErr == nil {
				peers = append(peers, srv.nativeImagePeer(cfg.Airlock), srv.gvisorPeer())
				// A create of a burst waits in the server's start gate
				// behind the others for as long as its client waits: the
				// bench waits as long as a burst could take, so that a
				// loaded host shows as slow, not as failed.
				saved := srv.timeout
				srv.timeout = BurstTimeout(saved, slices.Max(ConcurrencyLevels))
				restore = func() { srv.timeout = saved }
			}
			rep.Figures = append(rep.Figures, ConcurrentCreateFigures(append(peers, others...), true_, ConcurrencyLevels, rounds)...)
			restore()
		case "gvisor":
			progress("gvisor cold start: %d rounds of /bin/true", cfg.Runs)
			rep.Figures = append(rep.Figures, GVisorFigure(cfg.Airlock, others, cfg.Runs, cfg.Peers.Timeout))
			progress("gvisor exec: %d rounds of /bin/true", cfg.Runs)
			native, gv := api(), Peer{Name: GVisorPeer, Missing: "airlock serve did not start"}
			gvImage := Peer{Name: GVisorImagePeer, Missing: "airlock serve did not start"}
			if srvErr == nil {
				gv, gvImage = srv.gvisorPeer(), srv.gvisorImagePeer(cfg.Airlock)
			}
			rep.Figures = append(rep.Figures, GVisorExecFigure(native, gv, others, true_, cfg.Runs, gvImage))
			if srvErr != nil {
				rep.Figures = append(rep.Figures, Unavailable("gvisor pause (100 MB Python)", "airlock serve did not start: "+srvErr.Error()),
					Unavailable("gvisor density", "airlock serve did not start: "+srvErr.Error()))
				break
			}
			for _, size := range PauseSessionSizes {
				rounds := cfg.Runs
				if size >= 1<<30 {
					rounds = max(2, cfg.Runs/5) // each round writes and reads a GiB
				}
				progress("gvisor pause and resume: %d rounds with %s in a Python session", rounds, sizeName(size))
				rep.Figures = append(rep.Figures, srv.GVisorPauseFigures(others, rounds, size)...)
			}
			rounds := max(2, cfg.Runs/5)
			progress("gvisor fork: %d rounds of %d forks from one snapshot", rounds, ForkN)
			rep.Figures = append(rep.Figures, srv.GVisorForkFigure(others, rounds, ForkN))
			progress("gvisor density: up to %d sandboxes per peer", min(cfg.Density.Max, GVisorDensityMax))
			opts := cfg.Density
			opts.Max = min(opts.Max, GVisorDensityMax)
			rep.Figures = append(rep.Figures, srv.GVisorDensityFigure(others, cfg.Idle, opts))
		}
	}
	rep.LoadAfter = LoadAverage()
	rep.DurationS = time.Since(rep.Started).Seconds()
	return rep
}

// fastOnly returns peers with those slower than crun marked missing: the
// in-process figure compares the runtime's own cost with the light tools,
// and the slow peers are already in the cold start figure of the same run.
func fastOnly(peers []Peer) []Peer {
	out := make([]Peer, len(peers))
	for i, p := range peers {
		if p.Missing == "" && !slices.Contains([]string{"bare", "unshare", "bwrap", "crun"}, p.Name) {
			p = Peer{Name: p.Name, Missing: "not run in this figure to save time: see cold start"}
		}
		out[i] = p
	}
	return out
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
