package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/microvm"
	"github.com/airlock-dev/airlock/runtime/native"
)

// webProbe runs, in sandbox id (network allowlist of web.test), a request
// to web.test, which must be answered, and one to other.test, which the
// proxy must refuse.
func webProbe(ctx context.Context, t *testing.T, e *netEnv, id, what string) {
	t.Helper()
	py := fmt.Sprintf(`
import urllib.request, urllib.error
print(urllib.request.urlopen(%q, timeout=60).read().decode().split()[0])
try:
    urllib.request.urlopen(%q, timeout=60)
    print("other reached")
except urllib.error.HTTPError as e:
    print("other refused", e.code)
`, e.url("http", "web.test", "/"), e.url("http", "other.test", "/"))
	if _, err := e.c.WriteFile(ctx, id, "/workspace/web.py", strings.NewReader(py), 0o644); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	res, err := e.c.Exec(ctx, id, client.ExecRequest{Shell: "python3 /workspace/web.py", Timeout: 120})
	if err != nil || res.Stdout != "http-ok\nother refused 403\n" {
		t.Fatalf("%s: network: %+v %v", what, res, err)
	}
}

// procRuns reports whether a process of sandbox id has the command line
// cmdline (its words joined by spaces, with a trailing space).
func procRuns(ctx context.Context, c *client.Client, id, cmdline string) (bool, error) {
	res, err := c.Exec(ctx, id, client.ExecRequest{Shell: `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' <$f; echo; done | grep -cx '` + cmdline + `'`, Timeout: 60})
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(res.Stdout) != "0", nil
}

// TestMicroVMRunningSurvivesRestart: a running microvm sandbox outlives a
// server killed with SIGKILL in the middle of an exec: the next server
// takes it over (the same QEMU process, its deadline unchanged), and its
// Python variable, file and background process are there; the exec that
// was streaming ended with its connection (its process was a foreground
// one); its network goes on through the new server's proxy (allowlist
// kept); a pause to disk and resume works on it; and killing it removes
// its QEMU, cgroup and state. Old code: the QEMU died with the server
// (parent-death signal) and the sandbox was recorded lost.
func TestMicroVMRunningSurvivesRestart(t *testing.T) {
	e := startNetEnv(t, "--microvm-accel", "tcg")
	caps, ok := runtimeCaps(t, e.c)["microvm"]
	if !ok {
		t.Skip("runtime microvm is not available here")
	}
	if !caps.AdoptRunning {
		t.Fatalf("microvm does not declare adopt_running: %+v", caps)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, client.CreateRequest{Runtime: "microvm", Timeout: 1200,
		Network: &client.Network{Mode: "allowlist", Allow: []string{"web.test", "127.0.0.1"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Kill(context.Background(), sb.ID)
	seedMicroVMState(ctx, t, e.c, sb.ID)
	webProbe(ctx, t, e, sb.ID, "before the restart")
	before, err := e.c.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	q := qemuOf(sb.ID)
	if len(q) != 1 {
		t.Fatalf("QEMU of %s: %v", sb.ID, q)
	}
	// The server dies while an exec streams.
	execDone := make(chan error, 1)
	go func() {
		_, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "echo started > /tmp/mid; exec sleep 6000", Timeout: 1200})
		execDone <- err
	}()
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if ok, err := procRuns(ctx, e.c, sb.ID, "sleep 6000 "); err == nil && ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the exec did not start")
		}
	}
	e.srv.crash()
	if err := <-execDone; err == nil {
		t.Fatal("the exec the server died in the middle of succeeded")
	}
	e.srv = startServer(t, e.state, e.serveArgs()...)
	e.c = client.New(e.srv.URL, e.key)
	got, err := e.c.Get(ctx, sb.ID)
	if err != nil || got.State != "running" || !got.Reattached {
		t.Fatalf("after the restart: %+v %v", got, err)
	}
	if got.ExpiresAt == nil || before.ExpiresAt == nil || !got.ExpiresAt.Equal(*before.ExpiresAt) {
		t.Fatalf("deadline before %v, after the restart %v", before.ExpiresAt, got.ExpiresAt)
	}
	if q2 := qemuOf(sb.ID); len(q2) != 1 || q2[0] != q[0] {
		t.Fatalf("QEMU of %s after the restart: %v, before %v", sb.ID, q2, q)
	}
	checkMicroVMState(ctx, t, e.c, sb.ID)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		ok, err := procRuns(ctx, e.c, sb.ID, "sleep 6000 ")
		if err == nil && !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the foreground process of the exec cut short runs on (%v)", err)
		}
	}
	nw, err := e.c.Network(ctx, sb.ID)
	if err != nil || nw.Mode != "allowlist" || !nw.Listening {
		t.Fatalf("network after the restart: %+v %v", nw, err)
	}
	webProbe(ctx, t, e, sb.ID, "after the restart")

	// The pause to disk (the port relays) works on a sandbox taken over.
	if _, err := e.c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if q := qemuOf(sb.ID); len(q) > 0 {
		t.Fatalf("QEMU %v runs while paused to disk", q)
	}
	if _, err := e.c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	r, err := e.c.RunCode(ctx, sb.ID, client.CodeRequest{Code: "print(x)"})
	if err != nil || r.Stdout != "42\n" {
		t.Fatalf("cell after the resume: %+v %v", r, err)
	}
	if err := backgroundAlive(ctx, e.c, sb.ID); err != nil {
		t.Fatal(err)
	}
	webProbe(ctx, t, e, sb.ID, "after the resume")
	if err := e.c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, e, sb.ID)
}

// TestMicroVMAdoptRefusesTampered: a restarted server takes over no running
// microvm sandbox whose state directory was tampered with while it was
// down, and does not hang on one: a wrong QEMU pid, the pid of another
// (live) process, the agent's socket replaced by another process's
// listener, a garbage launch record; nor one whose QEMU died meanwhile.
// Each is reported lost with its reason, and no QEMU, cgroup or state
// directory of it is left; the other process lives on, the stranger's
// listener gets not a byte, and an untampered sandbox beside them is taken
// over and works, after a stranger that reached its agent's socket with a
// wrong token got nothing from it. (Old code lost every running sandbox
// and had no sockets: only the last two checks are property changes.)
func TestMicroVMAdoptRefusesTampered(t *testing.T) {
	e := startNetEnv(t, "--microvm-accel", "tcg")
	if _, ok := runtimeCaps(t, e.c)["microvm"]; !ok {
		t.Skip("runtime microvm is not available here")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	cases := []string{"wrong pid", "pid of another process", "stranger's socket", "garbage launch", "qemu died", "intact"}
	ids := map[string]string{}
	for _, c := range cases {
		sb, err := e.c.Create(ctx, client.CreateRequest{Runtime: "microvm", Timeout: 1200})
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		ids[c] = sb.ID
		t.Cleanup(func() { e.c.Kill(context.Background(), sb.ID) })
		if _, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "echo " + strconv.Quote(c) + " > /workspace/f", Timeout: 120}); err != nil {
			t.Fatalf("%s: %v", c, err)
		}
	}
	stranger := exec.Command("sleep", "3600")
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	defer stranger.Process.Kill()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	e.srv.crash()

	dir := func(c string) string { return filepath.Join(microvm.StateDir, ids[c]) }
	writeRunning := func(c string, pid int, start uint64) {
		b, _ := json.Marshal(map[string]any{"qemu": map[string]any{"pid": pid, "start_time": start}})
		if err := os.WriteFile(filepath.Join(dir(c), "running.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeRunning("wrong pid", dead.Process.Pid, 1)
	st, err := native.ProcStartTime(stranger.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	writeRunning("pid of another process", stranger.Process.Pid, st)
	sock := filepath.Join(dir("stranger's socket"), "agent.sock")
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var strangerGot, strangerConns atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			strangerConns.Add(1)
			c.Write([]byte("AIRLOCK-SERIAL-READY\n")) // as a guest would
			go func() {
				n, _ := io.Copy(io.Discard, c)
				strangerGot.Add(n)
			}()
		}
	}()
	if err := os.WriteFile(filepath.Join(dir("garbage launch"), "launch.json"), []byte("{\"qemu\": [garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range qemuOf(ids["qemu died"]) {
		pid, _ := strconv.Atoi(p)
		if err := killAndWait(pid); err != nil {
			t.Fatal(err)
		}
	}

	// A stranger that reaches a guest's agent socket while no server is
	// connected gets the guest's ready line and then nothing: a wrong
	// token ends its session, and what it sends after is dropped.
	// The stranger dials as the server does (adoptPort): a connection
	// made before the guest saw the killed server's go reaches the old
	// session, which the guest keeps (it saw no hang-up); closing it is a
	// hang-up the guest does see, so it dials again, waiting longer.
	var sc net.Conn
	ready := make([]byte, len("AIRLOCK-SERIAL-READY\n"))
	for pause, deadline := 500*time.Millisecond, time.Now().Add(2*time.Minute); ; pause *= 2 {
		sc, err = net.Dial("unix", filepath.Join(dir("intact"), "agent.sock"))
		if err != nil {
			t.Fatal(err)
		}
		sc.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = io.ReadFull(sc, ready)
		if err == nil || time.Now().After(deadline) {
			break
		}
		t.Logf("a new connection to the agent's socket: %v; dialling again in %s", err, pause)
		sc.Close()
		time.Sleep(pause)
	}
	if err != nil || string(ready) != "AIRLOCK-SERIAL-READY\n" {
		t.Fatalf("a new connection to the agent's socket: %q %v", ready, err)
	}
	sc.SetDeadline(time.Time{})
	junk := strings.Repeat("0", 64) + "\n" + strings.Repeat("\x00\x01junk", 100)
	if _, err := sc.Write([]byte(junk)); err != nil {
		t.Fatal(err)
	}
	sc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, _ := io.Copy(io.Discard, sc); n != 0 {
		t.Fatalf("a connection with a wrong token got %d bytes from the guest", n)
	}
	sc.Close()

	start := time.Now()
	e.srv = startServer(t, e.state, e.serveArgs()...)
	e.c = client.New(e.srv.URL, e.key)
	t.Logf("restart with %d sandboxes to take over: %s", len(cases), time.Since(start))
	for _, c := range cases[:len(cases)-1] {
		got, err := e.c.Get(ctx, ids[c])
		if err != nil || got.State == "running" || got.EndReason == "" {
			t.Errorf("%s: after the restart: %+v %v", c, got, err)
			continue
		}
		t.Logf("%s: %s: %s", c, got.State, got.EndReason)
		checkNothingLeft(t, e, ids[c])
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", stranger.Process.Pid)); err != nil || strings.Contains(string(b), ") Z ") {
		t.Errorf("the process whose pid was put in a state directory was killed: %v %s", err, b)
	}
	if n := strangerGot.Load(); n != 0 {
		t.Errorf("the stranger's listener got %d bytes (from %d connections)", n, strangerConns.Load())
	}
	intact := ids["intact"]
	got, err := e.c.Get(ctx, intact)
	if err != nil || got.State != "running" || !got.Reattached {
		t.Fatalf("the untampered sandbox after the restart: %+v %v", got, err)
	}
	res, err := e.c.Exec(ctx, intact, client.ExecRequest{Shell: "cat /workspace/f", Timeout: 120})
	if err != nil || res.Stdout != "intact\n" {
		t.Fatalf("the untampered sandbox: %+v %v", res, err)
	}
	if err := e.c.Kill(ctx, intact); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, e, intact)
}

// killAndWait kills process pid with SIGKILL and waits until it is gone.
func killAndWait(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	if err := p.Kill(); err != nil {
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b), ") Z ") { // gone, or a zombie nobody reaped yet
			return nil
		}
	}
	return fmt.Errorf("pid %d did not end", pid)
}

// virtiofsds lists the pids of the running virtiofsd processes serving a
// directory under dir.
func virtiofsds(dir string) map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || exe != microvm.VirtiofsdBinary {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && strings.Contains(string(b), "source="+dir) {
			out[e.Name()] = true
		}
	}
	return out
}

// TestMicroVMVolumeSurvivesRestart: a running microvm sandbox with a volume
// is taken over after a server kill -9 with its volume daemons (virtiofsd,
// which hold their connections to QEMU): the volume's file is there and
// the volume takes writes; killing the sandbox then ends those daemons
// too. Old code: lost with the server.
func TestMicroVMVolumeSurvivesRestart(t *testing.T) {
	e := startNetEnv(t, "--microvm-accel", "tcg")
	if _, ok := runtimeCaps(t, e.c)["microvm"]; !ok {
		t.Skip("runtime microvm is not available here")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if code, v := post(t, e.srv.URL+"/v1/volumes", e.key, `{"name":"kept","size_bytes":16777216}`); code != 201 {
		t.Fatalf("create volume: %d %v", code, v)
	}
	before := virtiofsds(e.state)
	sb, err := e.c.Create(ctx, client.CreateRequest{Runtime: "microvm", Timeout: 900,
		Volumes: []client.VolumeRef{{Name: "kept", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Kill(context.Background(), sb.ID)
	var ours []string
	for p := range virtiofsds(e.state) {
		if !before[p] {
			ours = append(ours, p)
		}
	}
	if len(ours) == 0 {
		t.Fatal("no virtiofsd started for the sandbox's volume")
	}
	if res, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "echo before > /data/f && cat /data/f", Timeout: 120}); err != nil || res.Stdout != "before\n" {
		t.Fatalf("volume before the restart: %+v %v", res, err)
	}
	e.srv.crash()
	e.srv = startServer(t, e.state, e.serveArgs()...)
	e.c = client.New(e.srv.URL, e.key)
	got, err := e.c.Get(ctx, sb.ID)
	if err != nil || got.State != "running" || !got.Reattached {
		t.Fatalf("after the restart: %+v %v", got, err)
	}
	res, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "cat /data/f && echo after >> /data/f && cat /data/f", Timeout: 120})
	if err != nil || res.Stdout != "before\nbefore\nafter\n" {
		t.Fatalf("volume after the restart: %+v %v", res, err)
	}
	if err := e.c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	checkNothingLeft(t, e, sb.ID)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		now := virtiofsds(e.state)
		var left []string
		for _, p := range ours {
			if now[p] {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the volume's virtiofsd %v outlived its sandbox", left)
		}
	}
}
