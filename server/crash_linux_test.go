package server_test

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// pullImage pulls ref into the server's store through the API.
func pullImage(t *testing.T, url, key, ref string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/images", strings.NewReader(`{"ref":"`+ref+`"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("pull %s: %s", ref, resp.Status)
	}
}

// poolDisks lists the ready disks mounted in the server's disk pool.
func poolDisks(state string) []string {
	var out []string
	for _, l := range testserver.HostLeftovers(state) {
		if strings.HasPrefix(l, "mount "+filepath.Join(state, "diskpool")+"/") {
			out = append(out, l)
		}
	}
	return out
}

// TestCrashDiskPoolReclaimed: a server killed with SIGKILL leaves its
// pool of ready disks (a bind mount, ext4 disks on loop devices) mounted;
// the next server removes them when it starts, not only once an image
// sandbox opens the pool, so that after its clean shutdown nothing of
// either run is mounted, and no loop device is backed by a file of the
// state directory. The sandbox that ran across the crash keeps its disk.
func TestCrashDiskPoolReclaimed(t *testing.T) {
	needRoot(t)
	reg := it.Registry(t)
	ref := it.Push(t, reg, "crash/busybox:1", it.Busybox(t))
	state := stateDir(t)
	s1 := startServer(t, state, "--image-registry", reg)
	key := newKey(t, state, "crash-disks")
	pullImage(t, s1.URL, key, ref)
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	sb, err := c.Create(ctx, client.CreateRequest{Image: ref, Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo kept > /workspace/f"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the pool made its ready disks", func() bool { return len(poolDisks(state)) >= 2 })
	s1.crash()
	if len(poolDisks(state)) == 0 {
		t.Fatal("the crash left no ready disk: nothing to reclaim")
	}

	s2 := startServer(t, state, "--image-registry", reg)
	c = client.New(s2.URL, key)
	if left := testserver.HostLeftovers(state, sb.ID); len(left) > 0 {
		t.Errorf("after the restart, before any image sandbox: %v", left)
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /workspace/f"}})
	if err != nil || res.Stdout != "kept\n" {
		t.Fatalf("the sandbox that ran across the crash: %+v %v", res, err)
	}
	s2.stop(t)
	noLeftovers(t, state)
	if _, err := os.Stat(filepath.Join(state, "diskpool")); !os.IsNotExist(err) {
		t.Errorf("the pool's directory is left: %v", err)
	}
}

// noLeftovers waits (generously: loop devices clear themselves
// asynchronously) until nothing of state is mounted, on a loop device or
// in the image store's tmp/, and fails with what is left.
func noLeftovers(t *testing.T, state string, keep ...string) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if left = testserver.HostLeftovers(state, keep...); len(left) == 0 {
			return
		}
	}
	t.Fatalf("left behind:\n%s", strings.Join(left, "\n"))
}

// runscCheckpointOf reports whether a `runsc checkpoint` of sandbox id runs.
func runscCheckpointOf(id string) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 0 && strings.HasSuffix(args[0], "runsc") && slices.Contains(args, "checkpoint") && slices.Contains(args, id) {
			return true
		}
	}
	return false
}

// TestCrashMidGVisorPause: a server killed with SIGKILL while `runsc
// checkpoint` writes a gvisor sandbox's pause image does not lose the
// sandbox: the restarted server has it, paused, and resume brings back
// its files and its Python session; nothing of a half-written image is
// left once it is killed.
func TestCrashMidGVisorPause(t *testing.T) {
	state, key, s1, sb := gvisorSandbox(t)
	c := client.New(s1.URL, key)
	ctx := ctxT(t)
	seedKept(ctx, t, c, sb.ID)
	// SIGKILL mid checkpoint. A pause may end between two looks for its
	// runsc checkpoint (a fast disk, a slow /proc scan under load): it is
	// then resumed and tried again.
	crashMidPause := func() bool {
		paused := make(chan error, 1)
		go func() { _, err := c.Pause(ctx, sb.ID); paused <- err }()
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if runscCheckpointOf(sb.ID) {
				s1.crash()
				<-paused
				return true
			}
			select {
			case err := <-paused:
				if err != nil {
					t.Fatalf("pause: %v", err)
				}
				if _, err := c.Resume(ctx, sb.ID); err != nil {
					t.Fatalf("resume: %v", err)
				}
				return false
			default:
			}
		}
		t.Fatal("timed out waiting for: runsc checkpoint of the sandbox runs")
		return false
	}
	for attempt := 1; !crashMidPause(); attempt++ {
		if attempt == 5 {
			t.Fatal("5 pauses ended before a look saw their runsc checkpoint")
		}
	}

	s2 := startServer(t, state)
	c = client.New(s2.URL, key)
	got, err := c.Get(ctx, sb.ID)
	if err != nil || got.State != "running" || !got.Paused || !got.Reattached {
		t.Fatalf("after a crash mid pause the sandbox is %+v (%v), want it kept, paused", got, err)
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("resume after restart: %v", err)
	}
	checkKept(ctx, t, c, sb.ID, "after the crash")
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "no process of the sandbox left", func() bool { return !hostHasArg(sb.ID) })
	if _, err := os.Stat(filepath.Join(state, "sandboxes", sb.ID)); !os.IsNotExist(err) {
		t.Errorf("the sandbox's directory (and its checkpoint) is left: %v", err)
	}
}

// TestCrashMidTemplateBuild: a server killed with SIGKILL while a
// template build's RUN step runs leaves its root (an overlay on an upper
// disk, mounted), its cgroup and its host id range lease; the restarted
// server removes them all, and a clean shutdown leaves nothing mounted.
func TestCrashMidTemplateBuild(t *testing.T) {
	needRoot(t)
	reg := it.Registry(t)
	ref := it.Push(t, reg, "crash/tmpl:1", it.Busybox(t))
	state := stateDir(t)
	s1 := startServer(t, state, "--image-registry", reg)
	key := newKey(t, state, "crash-build")
	pullImage(t, s1.URL, key, ref)
	body := `{"name":"crash/built:1","dockerfile":"FROM ` + ref + `\nRUN sleep 600\n"}`
	go postQuiet(s1.URL+"/v1/templates", key, body)
	eventually(t, 2*time.Minute, "the RUN step's root is mounted", func() bool {
		for _, l := range testserver.HostLeftovers(state) {
			if strings.HasPrefix(l, "mount "+filepath.Join(state, "roots")+"/") {
				return true
			}
		}
		return false
	})
	pid := s1.Pid()
	s1.crash()
	if left := oneShotLeftovers(state, []int{pid}); len(left) == 0 {
		t.Fatal("the killed build left nothing: the test did not kill it mid RUN")
	}
	s2 := startServer(t, state, "--image-registry", reg)
	if left := append(oneShotLeftovers(state, []int{pid}), testserver.HostLeftovers(state)...); len(left) > 0 {
		t.Errorf("after the restart:\n%s", strings.Join(left, "\n"))
	}
	s2.stop(t)
	noLeftovers(t, state)
}
