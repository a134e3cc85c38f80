package gvisor_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/gvisor"
	"github.com/airlock-dev/airlock/runtime/native"
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

// TestCheckpointRestoreNetwork: a sandbox with network (runsc
// --network=host in its egress namespace) can be checkpointed and
// restored: the restored sandbox joins the same namespace and reaches the
// proxy's listener again, a connection open across the checkpoint comes
// back broken (not reconnected anywhere), and nothing of it runs while on
// disk. A later process adopts it paused only with new listener
// addresses (else ErrNetworkAdopt): the proxy's listeners went with the
// process that held them.
func TestCheckpointRestoreNetwork(t *testing.T) {
	needRunsc(t)
	// Each stdin line: connect to the proxy's listener, print its answer;
	// "old" uses the connection opened at the start instead.
	prog := `import socket, sys
old = socket.create_connection(("127.0.0.1", 3128))
old.recv(64)
for line in sys.stdin:
    try:
        c = old if line.strip() == "old" else socket.create_connection(("127.0.0.1", 3128))
        c.sendall(b"x")
        print(c.recv(64).decode() or "eof", flush=True)
    except OSError as e:
        print("error", e.errno, flush=True)
`
	host, inside := socketPair(t)
	defer host.Close()
	p := gvPolicy(t, func(p *policy.Policy) {
		p.Network = policy.Network{Mode: policy.NetAllowlist, Allow: []string{"example.com"}}
	})
	sb, err := gvisor.Start(native.Config{Policy: p, Args: []string{"python3", "-c", prog}, Stdin: inside, Stdout: inside,
		Listen: []string{"127.0.0.1:3128"}})
	inside.Close()
	if err != nil {
		t.Fatal(err)
	}
	ls := sb.Listeners()
	if len(ls) != 1 {
		sb.Destroy()
		t.Fatalf("listeners %v", ls)
	}
	defer ls[0].Close()
	var served atomic.Int32
	serve(ls[0], "proxy", &served)
	if got := sayLine(t, host, "new"); got != "proxy-2" {
		sb.Destroy()
		t.Fatalf("before checkpoint: %q", got)
	}
	image := t.TempDir()
	if err := sb.Checkpoint(image); err != nil {
		sb.Destroy()
		t.Fatal(err)
	}
	if st, err := sb.Stats(); err != nil || st.Pids != 0 {
		sb.Destroy()
		t.Fatalf("after checkpoint the sandbox's cgroup holds %d tasks (%v)", st.Pids, err)
	}
	host2, inside2 := socketPair(t)
	defer host2.Close()
	sb2, err := sb.Restore(image, inside2, inside2, nil)
	inside2.Close()
	if err != nil {
		sb.Destroy()
		t.Fatal(err)
	}
	if got := sayLine(t, host2, "new"); got != "proxy-3" {
		sb2.Destroy()
		t.Fatalf("a new connection after restore: %q", got)
	}
	if got := sayLine(t, host2, "old"); !strings.HasPrefix(got, "error") && got != "eof" {
		sb2.Destroy()
		t.Fatalf("the connection open across the checkpoint: %q, want it broken", got)
	}
	if n := served.Load(); n != 3 {
		sb2.Destroy()
		t.Fatalf("the listener served %d connections, want 3", n)
	}

	// A later process (as after a server restart) adopts it paused: its
	// namespace is gone with the process that held it, so adoption makes a
	// new one with new proxy listeners, where the restore lands.
	image = t.TempDir()
	if err := sb2.Checkpoint(image); err != nil {
		sb2.Destroy()
		t.Fatal(err)
	}
	if _, err := gvisor.Adopt(sb.ID, nil, nil); !errors.Is(err, gvisor.ErrNetworkAdopt) {
		sb2.Destroy()
		t.Fatalf("adopt of a paused sandbox with network, no listener addresses: %v", err)
	}
	a, err := gvisor.Adopt(sb.ID, nil, []string{"127.0.0.1:3128"})
	if err != nil {
		sb2.Destroy()
		t.Fatalf("adopt of a paused sandbox with network: %v", err)
	}
	als := a.Listeners()
	if len(als) != 1 {
		sb2.Destroy()
		t.Fatalf("adopted listeners %v", als)
	}
	defer als[0].Close()
	var served2 atomic.Int32
	serve(als[0], "adopted", &served2)
	host3, inside3 := socketPair(t)
	defer host3.Close()
	sb3, err := a.Restore(image, inside3, inside3, nil)
	inside3.Close()
	if err != nil {
		sb2.Destroy()
		t.Fatal(err)
	}
	defer sb3.Destroy()
	if got := sayLine(t, host3, "new"); got != "adopted-1" {
		t.Fatalf("a new connection after the adopted restore: %q, want the new namespace's listener", got)
	}
	if n := served.Load(); n != 3 {
		t.Fatalf("the old namespace's listener served %d connections, want still 3", n)
	}
}

// serve answers every connection on l with "NAME-N" (N counts them in n)
// and then reads it to its end.
func serve(l net.Listener, name string, n *atomic.Int32) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(fmt.Sprintf("%s-%d", name, n.Add(1))))
			go func() { defer c.Close(); io.Copy(io.Discard, c) }()
		}
	}()
}
