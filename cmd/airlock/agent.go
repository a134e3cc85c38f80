package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"

	"airlock/agent"
	"airlock/kube/agenttls"
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
}

// cmdAgent runs the agent as the init process of a container that airlock
// did not start (a Kubernetes pod): `airlock agent --listen :7070
// --tls-dir /airlock-tls`. Every client must pass TLS with the sandbox's
// certificate and its token (kube/agenttls); there is no plaintext mode.
func cmdAgent(args []string) int {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	listen := fs.String("listen", "", "TCP address to serve hosts on, e.g. :7070 (required)")
	tlsDir := fs.String("tls-dir", "", "directory holding ca.crt, tls.crt, tls.key and token (required)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *listen == "" || *tlsDir == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: airlock agent --listen ADDR --tls-dir DIR")
		return exitUsage
	}
	srv, err := agenttls.LoadServer(*tlsDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
		return exitSetup
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
		return exitSetup
	}
	fmt.Fprintf(os.Stderr, "airlock agent: sandbox %s listening on %s\n", srv.SandboxID(), ln.Addr())
	agent.MainListen(agent.ListenConfig{Listener: ln, Authenticate: srv.Authenticate})
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
