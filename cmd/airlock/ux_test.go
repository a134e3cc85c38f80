package main

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/internal/testserver"
)

// TestRunSignals: SIGINT (Ctrl-C) and SIGTERM of `airlock run` stop the
// sandbox, remove it (no process, no cgroup left) and exit 130 and 143
// with a message naming the signal, never the 137 of a SIGKILL or an OOM
// kill.
func TestRunSignals(t *testing.T) {
	bin := airlockBin(t)
	for i, tc := range []struct {
		sig  syscall.Signal
		name string
		code int
	}{{syscall.SIGINT, "SIGINT", 130}, {syscall.SIGTERM, "SIGTERM", 143}} {
		t.Run(tc.name, func(t *testing.T) {
			marker := "6171." + strconv.Itoa(i) + strconv.Itoa(os.Getpid())
			cmd := exec.Command(bin, "run", "--", "/bin/sh", "-c", "echo ready; exec sleep "+marker)
			cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp"}
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var errOut strings.Builder
			cmd.Stderr = &errOut
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil || line != "ready\n" {
				cmd.Process.Kill()
				t.Fatalf("sandbox did not start: %q %v %q", line, err, errOut.String())
			}
			// The launcher's own command line holds the marker too.
			for deadline := time.Now().Add(30 * time.Second); testserver.HostProcesses(marker) < 2; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					cmd.Process.Kill()
					t.Fatal("the sandbox's sleep never started")
				}
			}
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			err = cmd.Wait()
			code := cmd.ProcessState.ExitCode()
			if code != tc.code || !strings.Contains(errOut.String(), "interrupted by "+tc.name) {
				t.Fatalf("after %s: exit %d (%v), stderr %q; want %d and a message", tc.name, code, err, errOut.String(), tc.code)
			}
			if n := testserver.HostProcesses(marker); n != 0 {
				t.Fatalf("%d sandbox processes left after %s", n, tc.name)
			}
			if left := testserver.RunCgroups(cmd.Process.Pid); len(left) != 0 {
				t.Fatalf("cgroups left after %s: %v", tc.name, left)
			}
		})
	}
}

// TestDidYouMean: an unknown flag, command or image subcommand close to a
// known one gets a suggestion; a far one gets none; both exit 125.
func TestDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--iamge", "x", "--", "true"}, "flag provided but not defined: -iamge; did you mean --image?"},
		{[]string{"run", "--memroy", "1G", "--", "true"}, "did you mean --memory?"},
		{[]string{"run", "--tiemout=3s", "--", "true"}, "did you mean --timeout?"},
		{[]string{"template", "build", "--no-cahce", "-t", "x"}, "did you mean --no-cache?"},
		{[]string{"shell", "--ulr", "http://x"}, "did you mean --url?"},
		{[]string{"image", "ls", "--jsno"}, "did you mean --json?"},
		{[]string{"runn", "--", "true"}, `unknown command "runn"; did you mean "run"?`},
		{[]string{"serv"}, `did you mean "serve"?`},
		{[]string{"tempalte", "build"}, `did you mean "template"?`},
		{[]string{"image", "lst"}, `did you mean "ls"?`},
	} {
		_, errOut, code := runCLI(t, nil, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("airlock %s: exit %d, stderr %q; want %d and %q", strings.Join(tc.args, " "), code, errOut, exitUsage, tc.want)
		}
	}
	for _, args := range [][]string{{"run", "--zzzzzzzz", "--", "true"}, {"frobnicate"}} {
		_, errOut, code := runCLI(t, nil, args...)
		if code != exitUsage || strings.Contains(errOut, "did you mean") || !strings.Contains(errOut, "not defined") && !strings.Contains(errOut, "unknown command") {
			t.Errorf("airlock %s: exit %d, stderr %q; want no suggestion", strings.Join(args, " "), code, errOut)
		}
	}
}

// TestShellEnv: `airlock shell` takes the server and the key from
// $AIRLOCK_URL and $AIRLOCK_API_KEY (flags win over them), and without
// either a URL says both ways of giving it.
func TestShellEnv(t *testing.T) {
	testserver.NeedRoot(t)
	state := testserver.StateDir(t)
	key := testserver.NewKey(t, state, "shell-env")
	srv := testserver.Start(t, state)
	shell := func(env []string, stdin string, args ...string) (string, int) {
		cmd := exec.Command(airlockBin(t), append([]string{"shell", "--language", "bash"}, args...)...)
		cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=/tmp"}, env...)
		cmd.Dir = t.TempDir()
		cmd.Stdin = strings.NewReader(stdin)
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}
	out, code := shell([]string{"AIRLOCK_URL=" + srv.URL, "AIRLOCK_API_KEY=" + key}, "echo hi-from-$((40+2))\n")
	if code != 0 || !strings.Contains(out, "hi-from-42") {
		t.Fatalf("shell with $AIRLOCK_URL and $AIRLOCK_API_KEY: %d %q", code, out)
	}
	out, code = shell([]string{"AIRLOCK_URL=" + srv.URL, "AIRLOCK_API_KEY=al_wrong"}, "echo never\n")
	if code == 0 || strings.Contains(out, "never") {
		t.Fatalf("a wrong $AIRLOCK_API_KEY was not used: %d %q", code, out)
	}
	out, code = shell([]string{"AIRLOCK_URL=http://127.0.0.1:1", "AIRLOCK_API_KEY=al_wrong"}, "echo flags-win\n", "--url", srv.URL, "--key", key)
	if code != 0 || !strings.Contains(out, "flags-win") {
		t.Fatalf("flags over the environment: %d %q", code, out)
	}
	out, code = shell(nil, "")
	if code != exitUsage || !strings.Contains(out, "--url URL or $AIRLOCK_URL") {
		t.Fatalf("no URL: %d %q", code, out)
	}
}
