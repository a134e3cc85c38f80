package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/internal/testserver"
)

// TestShellTTY runs `airlock shell --tty` against a real server through
// terminalSession.
func TestShellTTY(t *testing.T) {
	testserver.NeedRoot(t)
	s := testserver.Start(t, testserver.StateDir(t), "--no-auth")
	terminalSession(t, "shell", "--tty", "--url", s.URL)
}

// TestRunTTY runs `airlock run -it -- bash` (a one-shot native sandbox
// whose bash gets a fresh pseudo-terminal from the launcher) through
// terminalSession.
func TestRunTTY(t *testing.T) {
	testserver.NeedRoot(t)
	terminalSession(t, "run", "-it", "--", "bash", "--norc", "-i")
}

// terminalSession runs airlock with args on a real pseudo-terminal (the
// test holds its master, as a terminal emulator would) and drives a shell
// in the sandbox: the caller's terminal goes raw while it runs and is
// restored after; the shell sees the caller's size and follows a resize
// (SIGWINCH), colours ls's output (it is on a terminal), takes Ctrl-C as
// an interrupt of its foreground sleep (airlock itself survives: raw
// mode), its sleep holds a terminal that is not the caller's (host
// /proc), and `exit 3` makes airlock exit 3.
func terminalSession(t *testing.T, args ...string) {
	term := startOnTerminal(t, args...)
	out, ptmx, callerTTY := &term.out, term.ptmx, term.callerTTY
	type_ := func(s string) { t.Helper(); term.type_(t, s) }
	lflag := func() uint32 { t.Helper(); return term.lflag(t) }
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
	if pid := hostPid("sleep\x004711\x00"); pid == 0 {
		t.Fatal("sleep 4711 vanished")
	} else if fd0, err := os.Stat(fmt.Sprintf("/proc/%d/fd/0", pid)); err != nil || fd0.Mode()&os.ModeCharDevice == 0 || os.SameFile(fd0, callerTTY) {
		t.Fatalf("the sandbox's sleep has stdin %v (%v), not a terminal of its own; the caller's is %v", fd0, err, callerTTY)
	}
	type_("\x03")
	eventually("sleep 4711 to end after Ctrl-C (host /proc)", func() bool { return !testserver.HostRuns("sleep\x004711\x00") })
	type_("echo back-$((2+3))\n")
	out.WaitFor(t, at, "back-5")
	if strings.Contains(out.String(), "\nnot-interrupted") {
		t.Fatalf("sleep was not interrupted:\n%q", out.String())
	}
	type_("exit 3\n")
	select {
	case err := <-term.done:
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

// onTerminal is airlock running on a real pseudo-terminal whose master the
// test holds, as a terminal emulator would.
type onTerminal struct {
	cmd       *exec.Cmd
	ptmx      *os.File
	out       testserver.Output // what airlock writes to its terminal
	done      chan error        // cmd.Wait's result
	callerTTY os.FileInfo       // the terminal airlock runs on
}

// startOnTerminal starts airlock with args on a new pseudo-terminal of 30
// rows and 90 columns (its stdin, stdout, stderr and controlling
// terminal); it is killed at the end of the test.
func startOnTerminal(t *testing.T, args ...string) *onTerminal {
	t.Helper()
	cmd := exec.Command(airlockBin(t), args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/tmp", "TERM=xterm-256color"}
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ptmx.Close() })
	if err := pty.Setsize(ptmx, &pty.Winsize{Cols: 90, Rows: 30}); err != nil {
		t.Fatal(err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	term := &onTerminal{cmd: cmd, ptmx: ptmx, done: make(chan error, 1)}
	if term.callerTTY, err = tty.Stat(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	t.Cleanup(func() { cmd.Process.Kill() })
	go func() { term.done <- cmd.Wait() }()
	go io.Copy(&term.out, ptmx)
	return term
}

// type_ types s on the terminal.
func (term *onTerminal) type_(t *testing.T, s string) {
	t.Helper()
	if _, err := term.ptmx.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

// lflag is the terminal's local modes (raw or not).
func (term *onTerminal) lflag(t *testing.T) uint32 {
	t.Helper()
	tio, err := unix.IoctlGetTermios(int(term.ptmx.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	return tio.Lflag
}

// hostPid returns the pid of a host process with exactly this
// NUL-separated command line, or 0.
func hostPid(cmdline string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && string(b) == cmdline {
			pid, _ := strconv.Atoi(e.Name())
			return pid
		}
	}
	return 0
}
