package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/runtime/microvm"
	"github.com/airlock-dev/airlock/runtime/native/idrange"
)

// qemuOf lists the pids of the QEMU processes of sandbox id (by the
// "-name airlock-ID" QEMU runs with).
func qemuOf(id string) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), "\x00airlock-"+id+"\x00") && strings.Contains(string(b), "qemu") {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// leaseOf returns the uid range lease file of the range whose first id
// QEMU process pid runs as.
func leaseOf(t *testing.T, pid string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
			p := filepath.Join(idrange.DefaultDir, f[1])
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("QEMU's uid %s: no lease: %v", f[1], err)
			}
			return p
		}
	}
	t.Fatalf("no uid in %s", b)
	return ""
}

// TestMicroVMPauseToDisk: pausing a microvm sandbox saves the whole guest
// to disk and ends its QEMU (no process of it runs while paused, its
// memory is freed); resuming starts a new QEMU from the saved state: a
// Python variable, a file and a background process are still there, and
// the API's pause capability says "checkpoint".
func TestMicroVMPauseToDisk(t *testing.T) {
	e := startNetEnv(t, "--microvm-accel", "tcg")
	caps, ok := runtimeCaps(t, e.c)["microvm"]
	if !ok {
		t.Skip("runtime microvm is not available here")
	}
	if caps.Pause != "checkpoint" || !caps.MemorySnapshot {
		t.Fatalf("microvm capabilities: %+v", caps)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, client.CreateRequest{Runtime: "microvm", Timeout: 900})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Kill(context.Background(), sb.ID)
	seedMicroVMState(ctx, t, e.c, sb.ID)
	if err := backgroundAlive(ctx, e.c, sb.ID); err != nil {
		t.Fatal(err)
	}
	if len(qemuOf(sb.ID)) != 1 {
		t.Fatalf("QEMU of %s: %v", sb.ID, qemuOf(sb.ID))
	}
	lease := leaseOf(t, qemuOf(sb.ID)[0])
	if _, err := e.c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if q := qemuOf(sb.ID); len(q) > 0 {
		t.Fatalf("QEMU %v of %s runs while it is paused to disk", q, sb.ID)
	}
	if cg := cgroupDirs(sb.ID); len(cg) > 0 {
		for _, d := range cg {
			if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil && len(strings.TrimSpace(string(b))) > 0 {
				t.Fatalf("tasks in %s while paused to disk: %s", d, b)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(e.state, "sandboxes", sb.ID, "checkpoint", "memory.mig")); err != nil {
		t.Fatalf("the paused guest's saved state: %v", err)
	}
	// Its host uid range stays its own while no QEMU of it runs: the lease
	// is held by its state directory, and reaping dead holders' leases (as
	// every lease taken for a new sandbox does) leaves it.
	if pool, err := idrange.Default(); err != nil {
		t.Fatal(err)
	} else if _, err := pool.Reap(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(lease); err != nil {
		t.Fatalf("the paused sandbox's uid range lease %s was reaped: %v (another sandbox could get its uid)", lease, err)
	}
	if _, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "true", Timeout: 60}); err == nil {
		t.Fatal("a paused sandbox ran a command")
	}
	if _, err := e.c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if len(qemuOf(sb.ID)) != 1 {
		t.Fatalf("QEMU of the resumed %s: %v", sb.ID, qemuOf(sb.ID))
	}
	checkMicroVMState(ctx, t, e.c, sb.ID)
	if _, err := os.Stat(filepath.Join(e.state, "sandboxes", sb.ID, "checkpoint")); err == nil {
		t.Fatal("the saved state is left after the resume")
	}
}

// TestMicroVMServerKilledMidPause: a server killed with SIGKILL while it
// pauses a microvm sandbox to disk leaves nothing half done: the next
// server takes the sandbox over running (its QEMU outlived the server: the
// migration is cancelled and the guest runs on) or paused (the pause was
// whole), or reports it lost with its reason; once it is killed no QEMU,
// cgroup, state directory or saved state of it is left.
func TestMicroVMServerKilledMidPause(t *testing.T) {
	e := startNetEnv(t, "--microvm-accel", "tcg")
	if _, ok := runtimeCaps(t, e.c)["microvm"]; !ok {
		t.Skip("runtime microvm is not available here")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, client.CreateRequest{Runtime: "microvm", Timeout: 900})
	if err != nil {
		t.Fatal(err)
	}
	// Memory the migration must write (non-zero pages): the pause lasts.
	if _, err := e.c.Start(ctx, sb.ID, client.ExecRequest{Shell: "python3 -c 'import time; b = bytearray(b\"\\x01\") * (160 << 20); print(\"ready\", flush=True); time.sleep(100000)' > /tmp/ready"}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		res, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "cat /tmp/ready", Timeout: 60})
		if err == nil && res.Stdout == "ready\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the memory hog did not start: %+v %v", res, err)
		}
	}
	tmp := filepath.Join(e.state, "sandboxes", sb.ID, "checkpoint.tmp", "memory.mig")
	go e.c.Pause(context.Background(), sb.ID)
	mid := false
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if fi, err := os.Stat(tmp); err == nil && fi.Size() > 0 {
			mid = true
			break
		}
	}
	e.srv.crash()
	t.Logf("server killed mid pause: %v (else before the migration began)", mid)
	e.srv = startServer(t, e.state, e.serveArgs()...)
	e.c = client.New(e.srv.URL, e.key)
	got, err := e.c.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case !mid && got.State == "running" && got.Paused:
		// The pause was whole before the kill: taken over paused.
		t.Logf("the pause completed before the kill: taken over paused")
	case got.State == "running" && !got.Paused:
		// Its QEMU outlived the server (adopt_running): the pause, cut
		// short, is undone and the guest taken over running.
		res, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "cat /tmp/ready", Timeout: 120})
		if err != nil || res.Stdout != "ready\n" {
			t.Fatalf("taken over running after a pause cut short: %+v %v", res, err)
		}
		t.Logf("the pause was cut short: taken over running")
	case got.State == "running" || got.EndReason == "":
		t.Fatalf("after the restart: %+v", got)
	default:
		t.Logf("reported: %s: %s", got.State, got.EndReason)
	}
	e.c.Kill(ctx, sb.ID)
	checkNothingLeft(t, e, sb.ID)
}

// TestMicroVMPausedSurvivesRestart: a microvm sandbox paused to disk is
// taken over paused by the next server after a kill -9 (no QEMU of it
// ran, its saved state and disks are on disk), and resuming it there
// brings back its Python variable, file and background process.
func TestMicroVMPausedSurvivesRestart(t *testing.T) {
	e := startNetEnv(t, "--microvm-accel", "tcg")
	if _, ok := runtimeCaps(t, e.c)["microvm"]; !ok {
		t.Skip("runtime microvm is not available here")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, client.CreateRequest{Runtime: "microvm", Timeout: 900})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Kill(context.Background(), sb.ID)
	seedMicroVMState(ctx, t, e.c, sb.ID)
	if _, err := e.c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.srv.crash()
	e.srv = startServer(t, e.state, e.serveArgs()...)
	e.c = client.New(e.srv.URL, e.key)
	got, err := e.c.Get(ctx, sb.ID)
	if err != nil || got.State != "running" || !got.Paused {
		t.Fatalf("after the restart: %+v %v", got, err)
	}
	if q := qemuOf(sb.ID); len(q) > 0 {
		t.Fatalf("QEMU %v of the paused %s runs after the restart", q, sb.ID)
	}
	if _, err := e.c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	checkMicroVMState(ctx, t, e.c, sb.ID)
}

// checkNothingLeft fails t if a QEMU, cgroup (QEMU's or its volume
// daemons') or state directory of the ended microvm sandbox id is left
// (after a grace for the kernel to reap).
func checkNothingLeft(t *testing.T, e *netEnv, id string) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left = append(append(qemuOf(id), cgroupDirs(id)...), cgroupDirs(id+"-vfs")...)
		for _, p := range []string{filepath.Join(microvm.StateDir, id), filepath.Join(e.state, "sandboxes", id)} {
			if _, err := os.Stat(p); err == nil {
				left = append(left, p)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Fatal(fmt.Sprint("left behind: ", left))
	}
}

// TestMicroVMServerKilledWhileFrozen: a microvm sandbox with a volume is
// paused by freezing its QEMU (QEMU cannot migrate virtio-fs); a server
// killed with SIGKILL meanwhile leaves no frozen QEMU behind: the next
// server reports the sandbox lost and removes everything of it (a frozen
// task dies of SIGKILL only once thawed), its volume daemon's cgroup too.
func TestMicroVMServerKilledWhileFrozen(t *testing.T) {
	e := startNetEnv(t, "--microvm-accel", "tcg")
	if _, ok := runtimeCaps(t, e.c)["microvm"]; !ok {
		t.Skip("runtime microvm is not available here")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if code, v := post(t, e.srv.URL+"/v1/volumes", e.key, `{"name":"frozen","size_bytes":16777216}`); code != 201 {
		t.Fatalf("create volume: %d %v", code, v)
	}
	sb, err := e.c.Create(ctx, client.CreateRequest{Runtime: "microvm", Timeout: 900,
		Volumes: []client.VolumeRef{{Name: "frozen", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if len(qemuOf(sb.ID)) != 1 {
		t.Fatalf("QEMU of the frozen %s: %v", sb.ID, qemuOf(sb.ID))
	}
	if len(cgroupDirs(sb.ID+"-vfs")) == 0 {
		t.Fatalf("no cgroup of %s's volume daemon", sb.ID)
	}
	e.srv.crash()
	e.srv = startServer(t, e.state, e.serveArgs()...)
	e.c = client.New(e.srv.URL, e.key)
	got, err := e.c.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State == "running" || got.EndReason == "" {
		t.Fatalf("after the restart: %+v", got)
	}
	checkNothingLeft(t, e, sb.ID)
}

// TestMicroVMPauseToDiskWithNetwork: a microvm sandbox with network is
// paused to disk and resumed like one without: its egress port's stream
// (the yamux session to the host's proxy) goes on over the new QEMU, so
// allowlisted requests with the injected header work after the resume and
// others are still refused.
func TestMicroVMPauseToDiskWithNetwork(t *testing.T) {
	e := startNetEnv(t, "--microvm-accel", "tcg")
	if _, ok := runtimeCaps(t, e.c)["microvm"]; !ok {
		t.Skip("runtime microvm is not available here")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	sb, err := e.c.Create(ctx, client.CreateRequest{Runtime: "microvm", Timeout: 900,
		Network: &client.Network{Mode: "allowlist", Allow: []string{"secret.test", "127.0.0.1"}},
		Secrets: []client.Secret{{Host: "secret.test", Header: "Authorization", Value: testSecret}}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Kill(context.Background(), sb.ID)
	if err := netProbe(ctx, e, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if q := qemuOf(sb.ID); len(q) > 0 {
		t.Fatalf("QEMU %v of %s runs while it is paused to disk", q, sb.ID)
	}
	if _, err := e.c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := netProbe(ctx, e, sb.ID); err != nil {
		t.Fatalf("after the resume: %v", err)
	}
}

// seedMicroVMState leaves state of every kind in sandbox id: a Python
// variable (x = 41), a workspace file and a background process.
func seedMicroVMState(ctx context.Context, t *testing.T, c *client.Client, id string) {
	t.Helper()
	if _, err := c.RunCode(ctx, id, client.CodeRequest{Code: "x = 41"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, id, client.ExecRequest{Shell: "echo kept > /workspace/f", Timeout: 60}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Start(ctx, id, client.ExecRequest{Argv: []string{"sleep", "100000"}, Tag: "matrix-bg"}); err != nil {
		t.Fatal(err)
	}
}

// checkMicroVMState checks that what seedMicroVMState left is all back
// after a resume.
func checkMicroVMState(ctx context.Context, t *testing.T, c *client.Client, id string) {
	t.Helper()
	r, err := c.RunCode(ctx, id, client.CodeRequest{Code: "x += 1; print(x)"})
	if err != nil || r.Stdout != "42\n" {
		t.Fatalf("cell after resume: %+v %v", r, err)
	}
	res, err := c.Exec(ctx, id, client.ExecRequest{Shell: "cat /workspace/f", Timeout: 60})
	if err != nil || res.Stdout != "kept\n" {
		t.Fatalf("file after resume: %+v %v", res, err)
	}
	if err := backgroundAlive(ctx, c, id); err != nil {
		t.Fatal(err)
	}
}
