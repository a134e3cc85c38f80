package gvisor_test

import (
	"bufio"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"airlock/runtime/gvisor"
	"airlock/runtime/native"
)

// TestSnapshotForksDiverge snapshots a running sandbox (it keeps running)
// and starts three forks from the one image: each continues from the
// snapshot's state (a Python list and a file in its tmpfs /tmp) and then
// keeps its own, as does the original. Each sandbox's state is read
// through its own socket, and each fork runs in a cgroup of its own.
func TestSnapshotForksDiverge(t *testing.T) {
	needRunsc(t)
	// Each line is appended to a list and to /tmp/log; the answer is both.
	prog := "import sys\nseen = []\nfor line in sys.stdin:\n    seen.append(line.strip())\n" +
		"    open('/tmp/log', 'a').write(line)\n" +
		"    print(','.join(seen), '|', open('/tmp/log').read().replace('\\n', ','), flush=True)\n"
	pair := func() (*os.File, *os.File) { return socketPair(t) }
	say := func(f *os.File, line string) string { t.Helper(); return sayLine(t, f, line) }
	cfg := native.Config{Policy: gvPolicy(t, nil), Args: []string{"python3", "-c", prog}}
	host, inside := pair()
	defer host.Close()
	orig := cfg
	orig.Stdin, orig.Stdout = inside, inside
	sb, err := gvisor.Start(orig)
	inside.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	if got := say(host, "base"); got != "base | base," {
		t.Fatalf("before the snapshot: %q", got)
	}
	image := t.TempDir()
	if err := sb.Snapshot(image); err != nil {
		t.Fatal(err)
	}
	if got := say(host, "orig"); got != "base,orig | base,orig," {
		t.Fatalf("the original after the snapshot: %q", got)
	}
	hosts := map[string]*os.File{}
	forks := map[string]*gvisor.Sandbox{}
	for _, name := range []string{"a", "b", "c"} {
		h, in := pair()
		defer h.Close()
		fc := cfg
		fc.Stdin, fc.Stdout = in, in
		f, err := gvisor.Fork(fc, image)
		in.Close()
		if err != nil {
			t.Fatalf("fork %s: %v", name, err)
		}
		defer f.Destroy()
		if f.ID == sb.ID {
			t.Fatalf("fork %s has the original's id", name)
		}
		hosts[name] = h
		forks[name] = f
	}
	for name, h := range hosts {
		if got, want := say(h, name), "base,"+name+" | base,"+name+","; got != want {
			t.Fatalf("fork %s: %q, want %q", name, got, want)
		}
		if st, err := forks[name].Stats(); err != nil || st.Pids == 0 {
			t.Fatalf("fork %s is not in a cgroup of its own: %+v %v", name, st, err)
		}
	}
	for name, h := range hosts {
		if got, want := say(h, name+"2"), "base,"+name+","+name+"2 | base,"+name+","+name+"2,"; got != want {
			t.Fatalf("fork %s, second line: %q, want %q", name, got, want)
		}
	}
	if got := say(host, "orig2"); got != "base,orig,orig2 | base,orig,orig2," {
		t.Fatalf("the original after the forks: %q", got)
	}
}

// socketPair returns the two ends of a new socketpair: the host's and the
// sandbox's (its stdio).
func socketPair(t *testing.T) (host *os.File, sandbox *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "sandbox")
}

// sayLine writes line to f and returns the line the sandbox answers.
func sayLine(t *testing.T, f *os.File, line string) string {
	t.Helper()
	if _, err := f.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	f.SetReadDeadline(time.Now().Add(60 * time.Second))
	got, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", line, err)
	}
	return strings.TrimSpace(got)
}
