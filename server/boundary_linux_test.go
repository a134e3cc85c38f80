package server_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"airlock/client"
)

// tracemePy makes the exec'd process (whose parent is the agent) or one of
// its threads call ptrace(PTRACE_TRACEME) and take a signal.
const tracemePy = `
import ctypes, os, signal, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
def traceme():
    if libc.ptrace(0, 0, 0, 0) != 0:
        sys.exit("PTRACE_TRACEME failed: errno %d" % ctypes.get_errno())
signal.signal(signal.SIGUSR1, lambda *a: None)
`

// TestExecTracemeNeverFakesExit: a process that makes the agent its tracer
// and stops is never reported as exited 0 while it is alive and stopped; the
// agent kills it, and the sandbox goes on serving (light profile, which
// allows ptrace).
func TestExecTracemeNeverFakesExit(t *testing.T) {
	needRoot(t)
	state := stateDir(t)
	key := newKey(t, state, "traceme")
	s := startServer(t, state)
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	sb, err := c.Create(ctx, client.CreateRequest{Profile: "light", Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"process": `traceme(); os.kill(os.getpid(), signal.SIGUSR1); print("resumed")`,
		"thread": `
def t():
    traceme(); signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
th = threading.Thread(target=t); th.start(); th.join(); time.sleep(30); print("resumed")`,
	} {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", tracemePy + body}, Timeout: 20})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Logf("%s: %+v", name, res)
		if strings.Contains(res.Stderr, "PTRACE_TRACEME failed") {
			t.Fatalf("%s: the light profile must allow ptrace: %s", name, res.Stderr)
		}
		if res.ExitCode == 0 || strings.Contains(res.Stdout, "resumed") || res.Signal != "SIGKILL" || res.Status == "timeout" {
			t.Errorf("%s: exit %d signal %q status %q stdout %q: want killed by SIGKILL at its ptrace-stop", name, res.ExitCode, res.Signal, res.Status, res.Stdout)
		}
		// Nothing of it is left, checked from the host.
		for _, pid := range pidsInCgroup(t, sb.ID) {
			if b, _ := readCmdline(pid); strings.Contains(b, "traceme") {
				t.Errorf("%s: process %d (%q) survived", name, pid, b)
			}
		}
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"echo", "alive"}})
	if err != nil || strings.TrimSpace(res.Stdout) != "alive" {
		t.Fatalf("sandbox did not survive: %+v %v", res, err)
	}
}

// pidsInCgroup lists the host pids in the sandbox's cgroups (every
// controller's directory and child cgroups), read on the host.
func pidsInCgroup(t testing.TB, id string) []int {
	t.Helper()
	seen := map[int]bool{}
	var out []int
	for _, dir := range cgroupDirs(id) {
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					out = append(out, pid)
				}
			}
			return nil
		})
	}
	return out
}

// readCmdline returns a host process's command line, NULs as spaces.
func readCmdline(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return strings.ReplaceAll(string(b), "\x00", " "), err
}
