package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/kube/agenttls"
)

func init() {
	// __agent is the in-sandbox agent: the airlock binary bound read-only
	// at native.AgentPath and started as the sandbox's PID 1.
	hidden["__agent"] = func([]string) int {
		agent.Main()
		return 0 // not reached: Main exits
	}
	hidden["agent"] = cmdAgent
	hidden["install-agent"] = cmdInstallAgent
	hidden[agent.StampArg] = func([]string) int {
		fmt.Println(agent.BuildStamp())
		return 0
	}
}

// cmdAgent runs the agent as the init process of a container that airlock
// did not start (a Kubernetes pod): `airlock agent --listen :7070
// --tls-dir /airlock-tls`. Every client must pass TLS with the sandbox's
// certificate and its token (kube/agenttls); there is no plaintext mode.
// A warm pool's pod, made before its sandbox, starts with --pool-ca DIR
// (the cluster CA's certificate alone) instead and serves nothing until a
// server enrolls it with its sandbox's credentials (agenttls.Pooled).
func cmdAgent(args []string) int {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	listen := fs.String("listen", "", "TCP address to serve hosts on, e.g. :7070 (required)")
	tlsDir := fs.String("tls-dir", "", "directory holding ca.crt, tls.crt, tls.key and token (this or --pool-ca)")
	poolCA := fs.String("pool-ca", "", "directory holding the cluster CA's ca.crt alone: a pooled agent, serving nothing until a server enrolls it")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *listen == "" || (*tlsDir == "") == (*poolCA == "") || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: airlock agent --listen ADDR (--tls-dir DIR | --pool-ca DIR)")
		return exitUsage
	}
	var auth func(net.Conn) (net.Conn, error)
	what := ""
	if *tlsDir != "" {
		srv, err := agenttls.LoadServer(*tlsDir)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
			return exitSetup
		}
		auth, what = srv.Authenticate, "sandbox "+srv.SandboxID()
	} else {
		p, err := agenttls.LoadPooled(*poolCA)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
			return exitSetup
		}
		auth, what = p.Authenticate, "pooled (not enrolled)"
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
		return exitSetup
	}
	fmt.Fprintf(os.Stderr, "airlock agent: %s listening on %s\n", what, ln.Addr())
	agent.MainListen(agent.ListenConfig{Listener: ln, Authenticate: auth})
	return 0 // not reached: MainListen exits
}

// cmdInstallAgent copies the running binary to DEST with mode 0555: the init
// container of a sandbox pod delivers the static agent into an emptyDir
// this way, so that any image can run it.
func cmdInstallAgent(args []string) int {
	if len(args) != 1 || args[0] == "" || args[0][0] == '-' {
		fmt.Fprintln(os.Stderr, "usage: airlock install-agent DEST")
		return exitUsage
	}
	if err := installSelf(args[0]); err != nil {
		fmt.Fprintf(os.Stderr, "airlock install-agent: %v\n", err)
		return exitSetup
	}
	return 0
}

// installSelf writes /proc/self/exe to dest through a temporary file in the
// same directory, so that dest is complete or absent, never partial.
func installSelf(dest string) error {
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("open own binary: %w", err)
	}
	defer src.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".airlock-install-*")
	if err != nil {
		return fmt.Errorf("create temporary file next to %s: %w", dest, err)
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return fmt.Errorf("copy to %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o555); err != nil {
		tmp.Close()
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), dest); err != nil {
		return fmt.Errorf("install %s: %w", dest, err)
	}
	return nil
}

// agentBinaryUsage documents --agent-binary of serve and mcp.
const agentBinaryUsage = "agent-only binary (cmd/airlock-agent, built from the same checkout) run as each sandbox's agent: faster starts, less memory per sandbox; default: " + leanAgentName + " next to this binary when its build stamp matches, else this binary; \"none\": this binary"

// leanAgentName is the agent-only binary `airlock serve` and `airlock mcp`
// look for next to their own executable when --agent-binary is not given.
const leanAgentName = "airlock-agent"

// leanAgent picks the agent-only binary (cmd/airlock-agent) that sandboxes
// get instead of self, or "" for self. flagValue is --agent-binary: "none"
// means self; "" means airlock-agent next to self when it is there and
// checks out (otherwise self, said through logf); a path must check out, or
// leanAgent fails. A binary checks out when it is a regular file that only
// its owner (root or us) can write, and its build stamp equals this
// binary's (agent.BuildStamp: the same revision of an unmodified tree, or
// the same -X github.com/airlock-dev/airlock/agent.stampOverride), and its directory is not
// writable by group or others either: it is bound into every sandbox as
// PID 1 and speaks this server's protocol.
func leanAgent(self, flagValue string, logf func(string, ...any)) (string, error) {
	if flagValue == "none" {
		return "", nil
	}
	explicit := flagValue != ""
	cand := flagValue
	if !explicit {
		cand = filepath.Join(filepath.Dir(self), leanAgentName)
		if _, err := os.Lstat(cand); err != nil {
			return "", nil // not built: the whole binary is the agent, as before
		}
	}
	path, err := checkLeanAgent(cand)
	if err != nil {
		if explicit {
			return "", fmt.Errorf("--agent-binary %s: %w", cand, err)
		}
		logf("agent: not using %s (%v); sandboxes run this binary as their agent (slower to start, more memory per sandbox)", cand, err)
		return "", nil
	}
	logf("agent: %s (agent-only build, same source)", path)
	return path, nil
}

// checkLeanAgent checks an agent-only binary for leanAgent and returns its
// resolved path. A file only its owner can write must also sit in a
// directory only its owner (root or us) can write.
func checkLeanAgent(cand string) (string, error) {
	path, err := filepath.EvalSymlinks(cand)
	if err != nil {
		return "", err
	}
	if path, err = filepath.Abs(path); err != nil {
		return "", err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return "", errors.New("not a regular file")
	case fi.Mode().Perm()&0o022 != 0:
		return "", fmt.Errorf("writable by group or others (mode %v)", fi.Mode().Perm())
	case !ok || (st.Uid != 0 && int(st.Uid) != os.Geteuid()):
		return "", errors.New("owned by another user")
	}
	// Whoever can write its directory can put another file in its place.
	dir := filepath.Dir(path)
	di, err := os.Stat(dir)
	if err != nil {
		return "", err
	}
	dst, ok := di.Sys().(*syscall.Stat_t)
	switch {
	case di.Mode().Perm()&0o022 != 0:
		return "", fmt.Errorf("its directory %s is writable by group or others (mode %v)", dir, di.Mode().Perm())
	case !ok || (dst.Uid != 0 && int(dst.Uid) != os.Geteuid()):
		return "", fmt.Errorf("its directory %s is owned by another user", dir)
	}
	want := agent.BuildStamp()
	if want == "" {
		return "", errors.New("this airlock binary carries no build stamp to match (built outside a git checkout or from a modified tree; build both from a clean checkout, or with the same -ldflags \"-X github.com/airlock-dev/airlock/agent.stampOverride=ID\")")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, agent.StampArg).Output()
	if err != nil {
		return "", fmt.Errorf("asking for its build stamp: %w", err)
	}
	if got := strings.TrimSpace(string(out)); got != want {
		return "", fmt.Errorf("built from other source: its stamp %q, this binary's %q (build both from the same checkout)", got, want)
	}
	return path, nil
}
