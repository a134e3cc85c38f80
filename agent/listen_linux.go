package agent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	rt "github.com/airlock-dev/airlock/runtime"
)

// reportedLayers is what the agent tells hosts in its hello about its own
// confinement; set by MainListen only.
var reportedLayers []rt.Layer

// MainListen runs the agent as the init process of a container that the
// host did not start (a Kubernetes pod): it serves every authenticated
// connection accepted on cfg.Listener concurrently, each an independent
// client of the same processes, files and code contexts, and keeps serving
// when one drops (foreground processes die with their connection, as
// always). It never exits on its own; outside a pid namespace SIGTERM,
// SIGINT and SIGHUP shut it down (exit status 0) after killing every
// process it started. It never returns.
func MainListen(cfg ListenConfig) {
	if cfg.Listener == nil || cfg.Authenticate == nil {
		fmt.Fprintln(os.Stderr, "airlock agent: listen mode needs a listener and an authenticator")
		os.Exit(2)
	}
	setup()
	reportedLayers = observeLayers()
	for _, l := range reportedLayers {
		fmt.Fprintf(os.Stderr, "airlock agent: %s: %s (%s)\n", l.Name, l.State, l.Detail)
	}
	os.Exit(runMulti(newAgent(), cfg))
}

// runMulti serves authenticated connections from cfg.Listener until the
// agent quits or the listener fails.
func runMulti(a *agent, cfg ListenConfig) int {
	maxPending := cfg.MaxPending
	if maxPending <= 0 {
		maxPending = 64
	}
	pending := make(chan struct{}, maxPending)
	// Refused clients are logged, but a client retrying in a loop must not
	// flood the container's log.
	logLimit := rate.NewLimiter(1, 10)
	logRefusal := func(format string, args ...any) {
		if logLimit.Allow() {
			fmt.Fprintf(os.Stderr, "airlock agent: "+format+"\n", args...)
		}
	}
	var mu sync.Mutex
	conns := make(map[*hostConn]struct{})
	stopping := false
	failed := make(chan error, 1)
	go func() {
		backoff := 5 * time.Millisecond
		for {
			raw, err := cfg.Listener.Accept()
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() || !errors.Is(err, net.ErrClosed) && isTemporary(err) {
					time.Sleep(backoff)
					backoff = min(2*backoff, time.Second)
					continue
				}
				failed <- err
				return
			}
			backoff = 5 * time.Millisecond
			select {
			case pending <- struct{}{}:
			default:
				raw.Close()
				logRefusal("refused %s: %d connections already authenticating", raw.RemoteAddr(), maxPending)
				continue
			}
			go func() {
				conn, err := cfg.Authenticate(raw)
				<-pending
				if err != nil {
					logRefusal("refused a client: %v", err)
					return
				}
				c := a.newConn(conn)
				mu.Lock()
				if stopping {
					mu.Unlock()
					c.close()
					return
				}
				conns[c] = struct{}{}
				mu.Unlock()
				err = c.serve()
				c.close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
					fmt.Fprintf(os.Stderr, "airlock agent: connection from %s: %v\n", conn.RemoteAddr(), err)
				}
			}()
		}
	}()
	code := 0
	select {
	case <-a.quit:
	case err := <-failed:
		fmt.Fprintf(os.Stderr, "airlock agent: accept: %v\n", err)
		code = 1
	}
	cfg.Listener.Close()
	mu.Lock()
	stopping = true
	for c := range conns {
		c.close()
	}
	mu.Unlock()
	a.shutdown()
	return code
}

// isTemporary reports accept errors worth retrying (out of fds, aborted
// connections).
func isTemporary(err error) bool {
	var te interface{ Temporary() bool }
	return errors.As(err, &te) && te.Temporary()
}

// observeLayers reads the agent's own confinement from /proc/self/status.
// An agent started by the pod, not by airlock, cannot drop the workload to
// a uid of its own (that needs CAP_SETUID, which a pod without capabilities
// lacks): the workload shares the agent's uid, and the pod's securityContext
// (non-root, no privilege escalation, capabilities dropped, seccomp) is the
// boundary. That is reported as degraded, not hidden.
func observeLayers() []rt.Layer {
	st := map[string]string{}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				st[k] = strings.TrimSpace(v)
			}
		}
	}
	uid := os.Getuid()
	ident := rt.Layer{Name: "identity", State: rt.StateDegraded,
		Detail: fmt.Sprintf("the agent and the workload share uid %d (a pod-started agent cannot switch uid without CAP_SETUID); the pod's securityContext is the boundary", uid)}
	if uid == 0 {
		ident = rt.Layer{Name: "identity", State: rt.StateMissing, Detail: "the agent runs as root in the pod, and so does the workload: set runAsNonRoot"}
	}
	layers := []rt.Layer{ident}
	capEff, err := strconv.ParseUint(st["CapEff"], 16, 64)
	switch {
	case err != nil:
		layers = append(layers, rt.Layer{Name: "capabilities", State: rt.StateMissing, Detail: "CapEff unreadable in /proc/self/status"})
	case capEff == 0:
		layers = append(layers, rt.Layer{Name: "capabilities", State: rt.StateOK, Detail: "no effective capabilities"})
	default:
		layers = append(layers, rt.Layer{Name: "capabilities", State: rt.StateDegraded, Detail: "effective capabilities 0x" + st["CapEff"] + ": drop ALL in the pod's securityContext"})
	}
	if st["NoNewPrivs"] == "1" {
		layers = append(layers, rt.Layer{Name: "no_new_privs", State: rt.StateOK, Detail: "set (allowPrivilegeEscalation: false)"})
	} else {
		layers = append(layers, rt.Layer{Name: "no_new_privs", State: rt.StateMissing, Detail: "not set: set allowPrivilegeEscalation: false"})
	}
	if st["Seccomp"] == "2" {
		layers = append(layers, rt.Layer{Name: "seccomp", State: rt.StateOK, Detail: "filter mode (the pod's seccomp profile)"})
	} else {
		layers = append(layers, rt.Layer{Name: "seccomp", State: rt.StateMissing, Detail: "no filter: set seccompProfile RuntimeDefault"})
	}
	return layers
}
