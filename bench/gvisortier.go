package bench

import (
	"time"

	"airlock/runtime/gvisor"
)

// GVisorFigure measures the gvisor tier's cold start: `airlock run
// --runtime gvisor -- /bin/true`, exec'ed like the cold start figure,
// against runsc's own `run` of the same command (the runsc peer among
// peers) in the same run.
func GVisorFigure(exe string, peers []Peer, runs int, timeout time.Duration) Figure {
	if timeout <= 0 {
		timeout = time.Minute
	}
	cli := Peer{Name: Reference, Note: "airlock run --runtime gvisor -- CMD (the whole CLI, exec'ed: Go start, strict policy, OCI bundle from the root template, runsc run, teardown)"}
	if _, err := gvisor.Available(); err != nil {
		cli.Missing = err.Error()
	} else if exe == "" {
		cli.Missing = "airlock binary unknown"
	} else {
		cli.Run = func(argv []string) error {
			return runWith(timeout, runSpec{}, exe, append([]string{"run", "--runtime", "gvisor", "--"}, argv...)...)
		}
	}
	runsc := Peer{Name: "runsc", Missing: "runsc not found"}
	for _, p := range peers {
		if p.Name == "runsc" {
			runsc = p
		}
	}
	f := Alternate([]Peer{cli, runsc}, []string{"/bin/true"}, runs)
	f.Name = "gvisor cold start"
	return f
}

// GVisorExecFigure times argv run in a live gvisor sandbox of airlock serve
// (POST /v1/sandboxes with "runtime": "gvisor", then exec through the API)
// against a live native sandbox of the same server and runsc's own exec
// into a detached container (the runsc peer among others), in the same
// run. api is the server's native peer, gv its gvisor peer.
func GVisorExecFigure(api, gv Peer, others []Peer, argv []string, runs int) Figure {
	if _, err := gvisor.Available(); err != nil && gv.Missing == "" {
		gv = Peer{Name: GVisorPeer, Missing: err.Error()}
	}
	runsc := Peer{Name: "runsc", Missing: "runsc not found"}
	for _, p := range others {
		if p.Name == "runsc" {
			runsc = p
		}
	}
	f := ExecFigure([]Peer{api, gv, runsc}, argv, runs)
	f.Name = "gvisor exec"
	return f
}
