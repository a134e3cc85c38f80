package main

import (
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"airlock/internal/testserver"
)

// TestShellTTY runs `airlock shell --tty` on a real pseudo-terminal (the
// test holds its master, as a terminal emulator would) against a real
// server: the caller's terminal goes raw while it runs and is restored
// after; the sandbox's shell sees the caller's size and follows a resize
// (SIGWINCH), colours ls's output (it is on a terminal), takes Ctrl-C as
// an interrupt of its foreground sleep (airlock itself survives: raw
// mode), and `exit 3` makes airlock exit 3.
func TestShellTTY(t *testing.T) {
	testserver.NeedRoot(t)
	s := testserver.Start(t, testserver.StateDir(t), "--no-auth")
	cmd := exec.Command(airlockBin(t), "shell", "--tty", "--url", s.URL)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp", "TERM=xterm-256color"}
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: 90, Rows: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	defer cmd.Process.Kill()
	var out testserver.Output
	go io.Copy(&out, ptmx)
	type_ := func(s string) {
		t.Helper()
		if _, err := ptmx.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	lflag := func() uint32 {
		t.Helper()
		tio, err := unix.IoctlGetTermios(int(ptmx.Fd()), unix.TCGETS)
		if err != nil {
			t.Fatal(err)
		}
		return tio.Lflag
	}
	type_("echo hi-$((40+2)); stty size\n")
	at := out.WaitFor(t, 0, "hi-42")
	at = out.WaitFor(t, at, "30 90")
	if l := lflag(); l&(unix.ICANON|unix.ECHO|unix.ISIG) != 0 {
		t.Errorf("the caller's terminal is not raw while the shell runs (lflag %#x)", l)
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Cols: 120, Rows: 40}); err != nil {
		t.Fatal(err)
	}
	// The resize travels as SIGWINCH to airlock, then a control message;
	// ask until the shell sees it.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String()[at:], "40 120") {
		if time.Now().After(deadline) {
			t.Fatalf("the resize never reached the sandbox; output:\n%q", out.String())
		}
		type_("stty size\n")
		time.Sleep(200 * time.Millisecond)
	}
	at = out.WaitFor(t, at, "40 120")
	type_("ls --color=auto -d /\n")
	at = out.WaitFor(t, at, "34m/")
	type_("sleep 4711; echo not-interrupted\n")
	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; output:\n%q", what, out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	eventually("sleep 4711 to run (host /proc)", func() bool { return testserver.HostRuns("sleep\x004711\x00") })
	type_("\x03")
	eventually("sleep 4711 to end after Ctrl-C (host /proc)", func() bool { return !testserver.HostRuns("sleep\x004711\x00") })
	type_("echo back-$((2+3))\n")
	at = out.WaitFor(t, at, "back-5")
	if strings.Contains(out.String(), "\nnot-interrupted") {
		t.Fatalf("sleep was not interrupted:\n%q", out.String())
	}
	type_("exit 3\n")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 3 {
			t.Fatalf("airlock shell --tty after `exit 3`: %v, want exit status 3; output:\n%q", err, out.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("airlock shell --tty did not exit; output:\n%q", out.String())
	}
	if l := lflag(); l&(unix.ICANON|unix.ECHO|unix.ISIG) != unix.ICANON|unix.ECHO|unix.ISIG {
		t.Errorf("the caller's terminal was not restored (lflag %#x)", l)
	}
}
