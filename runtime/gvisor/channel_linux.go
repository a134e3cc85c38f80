package gvisor

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/agent"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native"
)

// AgentAddr is where a live sandbox's agent listens for a host that comes
// back (a restarted server): TCP, in the sandbox's own network namespace,
// which only the server's process enters from the host. Programs inside
// cannot bind it (the agent holds it before any of them starts), and a
// connection to it is served only after the sandbox's token (agent
// "--reconnect").
const AgentAddr = "127.0.0.1:7070"

// tokenFile is the name of the file holding a sandbox's agent token, in its
// state directory and next to a snapshot image (its forks' agents have the
// same token in memory).
const tokenFile = "agent.token"

// netnsDir holds one bind mount per live sandbox of its network namespace
// (netns/ID), so that the namespace outlives the process that made it and a
// restarted server finds it by name.
var netnsDir = filepath.Join(StateBase, "netns")

// netnsPath is where sandbox id's network namespace is pinned.
func netnsPath(id string) string { return filepath.Join(netnsDir, id) }

// newToken makes a random agent token.
func newToken() ([]byte, error) {
	b := make([]byte, agent.ReconnectTokenBytes)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("gvisor: agent token: %w", err)
	}
	return b, nil
}

// writeToken stores token in dir (mode 0600).
func writeToken(dir string, token []byte) error {
	if err := os.WriteFile(filepath.Join(dir, tokenFile), token, 0o600); err != nil {
		return fmt.Errorf("gvisor: store agent token: %w", err)
	}
	return nil
}

// readToken reads the token stored in dir.
func readToken(dir string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, tokenFile))
	if err != nil {
		return nil, fmt.Errorf("gvisor: agent token: %w", err)
	}
	if len(b) != agent.ReconnectTokenBytes {
		return nil, fmt.Errorf("gvisor: agent token in %s: %d bytes, want %d", dir, len(b), agent.ReconnectTokenBytes)
	}
	return b, nil
}

// pinNetns bind-mounts the namespace ns onto netnsPath(id).
func pinNetns(id string, ns *os.File) (string, error) {
	if err := os.MkdirAll(netnsDir, 0o700); err != nil {
		return "", fmt.Errorf("pin network namespace: %w", err)
	}
	p := netnsPath(id)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600)
	if err != nil {
		return "", fmt.Errorf("pin network namespace: %w", err)
	}
	f.Close()
	src := fmt.Sprintf("/proc/self/fd/%d", ns.Fd())
	if err := unix.Mount(src, p, "", unix.MS_BIND, ""); err != nil {
		os.Remove(p)
		return "", fmt.Errorf("pin network namespace: bind %s: %w", p, err)
	}
	return p, nil
}

// unpinNetns undoes pinNetns; the namespace goes when nothing else holds it.
func unpinNetns(id string) {
	p := netnsPath(id)
	_ = unix.Unmount(p, unix.MNT_DETACH)
	_ = os.Remove(p)
}

// inNetns runs fn on an OS thread that has joined the network namespace
// at path; the thread is thrown away afterwards. Sockets fn creates live in
// that namespace.
func inNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		ns, err := os.Open(path)
		if err != nil {
			errc <- fmt.Errorf("network namespace: %w", err)
			return
		}
		defer ns.Close()
		var st unix.Statfs_t
		if err := unix.Fstatfs(int(ns.Fd()), &st); err != nil || st.Type != unix.NSFS_MAGIC {
			errc <- fmt.Errorf("network namespace: %s is not one", path)
			return
		}
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("network namespace: setns: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// listenInNetns opens TCP listeners at addrs in the namespace at path.
func listenInNetns(path string, addrs []string) ([]net.Listener, error) {
	var ls []net.Listener
	err := inNetns(path, func() error {
		for _, a := range addrs {
			l, err := net.Listen("tcp4", a)
			if err != nil {
				return fmt.Errorf("listen on %s in the sandbox's network namespace: %w", a, err)
			}
			ls = append(ls, l)
		}
		return nil
	})
	if err != nil {
		for _, l := range ls {
			l.Close()
		}
		return nil, err
	}
	return ls, nil
}

// dialAgent connects to the agent of a sandbox at AgentAddr in the
// namespace at path and sends its token; the agent's hello follows.
func dialAgent(ctx context.Context, path string, token []byte) (net.Conn, error) {
	var c net.Conn
	err := inNetns(path, func() error {
		d := net.Dialer{Timeout: 5 * time.Second}
		var err error
		c, err = d.DialContext(ctx, "tcp4", AgentAddr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("gvisor: dial agent: %w", err)
	}
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Write(agent.ReconnectPreamble(token))
	c.SetWriteDeadline(time.Time{})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("gvisor: agent token: %w", err)
	}
	return c, nil
}

// setToken gives a live sandbox its agent token, a new one or, for a fork,
// the snapshot's (its agent has that one in memory), and stores it in the
// sandbox's state directory for a restarted server.
func (s *Sandbox) setToken(image string) error {
	var err error
	if image == "" {
		s.token, err = newToken()
	} else {
		s.token, err = readToken(image)
	}
	if err != nil {
		return err
	}
	return writeToken(s.dir, s.token)
}

// SaveToken stores the sandbox's agent token next to a snapshot image, for
// its forks.
func (s *Sandbox) SaveToken(image string) error {
	if s.token == nil {
		return errors.New("gvisor: the sandbox has no agent token")
	}
	return writeToken(image, s.token)
}

// makeNetns gives the sandbox its network namespace: one of its own,
// pinned at netnsPath, for a live sandbox (its agent's reconnect listener
// is there, and the egress proxy's listeners, now or when a network is
// given later) and for one with network; none (gVisor's netstack) for a
// one-shot run without network.
func (s *Sandbox) makeNetns(cfg native.Config) error {
	if len(cfg.Listen) == 0 && !cfg.Agent {
		s.enforced = append(s.enforced, rt.Layer{Name: "netns", State: rt.StateOK, Detail: "runsc --network=none: gVisor netstack with loopback only"})
		return nil
	}
	ns, ls, err := egressNetns(cfg.Listen)
	if err != nil {
		return err
	}
	s.netns, s.listeners = ns, ls
	if s.nsPath, err = pinNetns(s.ID, ns); err != nil {
		return err
	}
	detail := "runsc --network=host inside a fresh network namespace holding only loopback"
	if cfg.Agent {
		detail += ", the agent's reconnect listener (" + AgentAddr + ", token-checked)"
	}
	if len(cfg.Listen) > 0 {
		detail += " and the egress proxy's listeners (" + strings.Join(cfg.Listen, ", ") + "): every connection goes through the proxy"
	} else {
		detail += ": nothing outside the sandbox is reachable (a network given later adds only the egress proxy's listeners)"
	}
	s.enforced = append(s.enforced, rt.Layer{Name: "netns", State: rt.StateOK, Detail: detail})
	return nil
}

// adoptNetns gives a paused sandbox being adopted a fresh network
// namespace with the proxy's listeners at listen (the previous server's
// are gone with it), pins it, and points the bundle (spec, namespace idx)
// at it, which runsc restore allows.
func (s *Sandbox) adoptNetns(spec *specs.Spec, idx int, listen []string) error {
	ns, ls, err := egressNetns(listen)
	if err != nil {
		return fmt.Errorf("egress namespace: %w", err)
	}
	s.netns, s.listeners = ns, ls
	unpinNetns(s.ID) // the previous server's, if it was pinned
	fail := func(err error) error {
		s.closeNet()
		for _, l := range s.listeners {
			l.Close()
		}
		s.listeners = nil
		return err
	}
	if s.nsPath, err = pinNetns(s.ID, ns); err != nil {
		return fail(err)
	}
	spec.Linux.Namespaces[idx].Path = s.nsPath
	if err := writeSpec(filepath.Join(s.dir, "bundle"), spec); err != nil {
		unpinNetns(s.ID)
		return fail(err)
	}
	return nil
}
