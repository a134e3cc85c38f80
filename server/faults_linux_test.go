package server_test

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/testserver"
	"github.com/airlock-dev/airlock/runtime/gvisor"
	"github.com/airlock-dev/airlock/runtime/native/idrange"
	"github.com/airlock-dev/airlock/store"
)

// faultPoints are the operations TestFaults kills the server in the middle
// of, with the longest delay (after the request is sent) it kills at.
var faultPoints = []struct {
	name     string
	maxDelay time.Duration
	gvisor   bool
}{
	{"create", 1500 * time.Millisecond, false},
	{"pull", 800 * time.Millisecond, false},
	{"pause", 1200 * time.Millisecond, true},
	{"snapshot", 1500 * time.Millisecond, false},
	{"template", 4 * time.Second, false},
	{"image fork", 2 * time.Second, true},
}

// TestFaults is the fault script (scripts/faults.sh): AIRLOCK_FAULTS
// rounds, each killing the server with SIGKILL at a random point of one
// operation (create, image pull, pause, snapshot, template build, memory
// snapshot of a gvisor image sandbox; each at
// least once, then at random; seed AIRLOCK_FAULTS_SEED), restarting it and
// checking that nothing is left beyond the live sandboxes: no mount under
// the state directory, no loop device backed by one of its files, no
// cgroup, runsc state or state directory of a sandbox that is not live,
// no temporary file of the image store or of a checkpoint, no store row
// of a running sandbox that does not run; a sandbox that ran across the
// crash runs on with its files, and none is lost without a reason. It
// ends with a clean shutdown, after which nothing at all may be left
// (uid leases included). Before that shutdown, AIRLOCK_CHURN sandboxes are
// created and killed (native, native from an image and gvisor in turn;
// every tenth runs a memory or a fork bomb first, which must end as oom or
// at its pids limit with the sandbox answering after it). Without AIRLOCK_FAULTS (CI) it runs each kill point once with
// a fixed seed and a churn of 20; scripts/faults.sh runs 20 rounds and a
// churn of 1,000.
func TestFaults(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("AIRLOCK_FAULTS"))
	seed := uint64(time.Now().UnixNano())
	churnN := 20
	if rounds <= 0 {
		rounds, seed = len(faultPoints), 1
	}
	if v := os.Getenv("AIRLOCK_CHURN"); v != "" {
		churnN, _ = strconv.Atoi(v)
	}
	needRoot(t)
	if v := os.Getenv("AIRLOCK_FAULTS_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d (AIRLOCK_FAULTS_SEED=%d reruns the same kill points)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	_, gvErr := gvisor.Available()

	reg := it.Registry(t)
	base := it.Push(t, reg, "faults/busybox:1", it.Busybox(t))
	state := stateDir(t)
	args := []string{"--image-registry", reg}
	s := startServer(t, state, args...)
	key := newKey(t, state, "faults")
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	pullImage(t, s.URL, key, base)

	// The anchor runs across every crash: reattached each time, its file
	// kept.
	anchor, err := c.Create(ctx, client.CreateRequest{Image: base, Timeout: 3600})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, anchor.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo anchor > /workspace/a"}}); err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{anchor.ID: true}
	servers := []int{s.Pid()}      // the template builds' one-shot runs name them
	found := map[string][]string{} // kill point -> what was left
	counts := map[string]int{}
	for round := range rounds {
		p := faultPoints[round%len(faultPoints)]
		if round >= len(faultPoints) {
			p = faultPoints[rng.IntN(len(faultPoints))]
		}
		if p.gvisor && gvErr != nil {
			t.Logf("round %d: %s skipped: gvisor unavailable: %v", round, p.name, gvErr)
			continue
		}
		delay := time.Duration(rng.Int64N(int64(p.maxDelay)))
		op, pausing := faultOp(t, c, s.URL, key, reg, base, p.name, round, known)
		done := make(chan struct{})
		go func() { op(); close(done) }()
		time.Sleep(delay)
		begun := pausing != "" && runscCheckpointOf(pausing)
		s.crash()
		<-done
		s = startServer(t, state, args...)
		servers = append(servers, s.Pid())
		c = client.New(s.URL, key)
		left := faultCheck(t, state, c, known, anchor.ID)
		left = append(left, oneShotLeftovers(state, servers[:len(servers)-1])...)
		if p.name == "pause" {
			left = append(left, pausedKept(t, c, pausing, begun)...)
		}
		counts[p.name]++
		t.Logf("round %d: killed %v into %s: %d left", round, delay.Round(time.Millisecond), p.name, len(left))
		for _, l := range left {
			found[p.name] = append(found[p.name], fmt.Sprintf("round %d (+%v): %s", round, delay.Round(time.Millisecond), l))
		}
		// Sandboxes of the round go (the anchor stays).
		live, _ := c.List(ctx, nil, "running")
		for _, sb := range live {
			if sb.ID != anchor.ID {
				_ = c.Kill(ctx, sb.ID)
			}
		}
	}
	// The churn's leftovers are looked for after the clean shutdown below
	// (a live server keeps its ready disks).
	churn(t, c, base, churnN, gvErr == nil, known)
	// A clean shutdown kills the anchor too: nothing at all may be left.
	s.stop(t)
	final := faultCheck(t, state, nil, known, "")
	final = append(final, uidLeasesLeft(t, state)...)
	final = append(final, oneShotLeftovers(state, servers)...)
	if len(final) > 0 { // a key in found is a failure, even with nothing under it
		found["after the clean shutdown"] = append(found["after the clean shutdown"], final...)
	}
	names := make([]string, 0, len(found))
	for n := range counts {
		t.Logf("kill point %-9s %d rounds, %d left", n, counts[n], len(found[n]))
	}
	for n := range found {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t.Errorf("%s:\n  %s", n, strings.Join(found[n], "\n  "))
	}
}

// churn creates and kills n sandboxes (native and, with gv, gvisor, each
// from the default root and from image base, in turn). Two in ten first
// run a bomb, every kind in turn: a memory bomb (64 MiB limit) must end as
// oom, a fork bomb (32 pids) at its limit, and the sandbox must answer
// after it.
func churn(t *testing.T, c *client.Client, base string, n int, gv bool, known map[string]bool) {
	t.Helper()
	// Bombs: two in ten for a short churn (CI: every kind in turn), two in
	// fifty for a long one (scripts/faults.sh: a gvisor fork bomb takes tens
	// of seconds).
	every := 10
	if n > 100 {
		every = 50
	}
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // per sandbox
		churnOne(t, ctx, c, base, i, every, gv, known)
		cancel()
	}
}

// churnOne is round i of churn.
func churnOne(t *testing.T, ctx context.Context, c *client.Client, base string, i, every int, gv bool, known map[string]bool) {
	t.Helper()
	req := client.CreateRequest{Timeout: 300}
	// native, native from the image, gvisor, gvisor from the image
	if i%2 == 1 {
		req.Image = base
	}
	if i%4 >= 2 && gv {
		req.Runtime = "gvisor"
	}
	bomb := ""
	if i%every == 0 || i%every == 3 { // every kind in turn
		req.Limits = &client.Limits{MemoryBytes: 64 << 20, Pids: 32}
		bomb = "x=aaaaaaaaaaaaaaaa; while :; do x=$x$x; done" // memory
		if (i/every)%2 == 1 {
			bomb = "f() { f | f & }; f; sleep 5" // fork
		}
	}
	sb, err := c.Create(ctx, req)
	if err != nil {
		t.Errorf("churn %d (%+v): create: %v", i, req, err)
		return
	}
	known[sb.ID] = true
	if bomb != "" {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", bomb}, Timeout: 60})
		if err == nil && strings.HasPrefix(bomb, "x=") && res.Status != "oom" {
			err = fmt.Errorf("memory bomb ended %q, not oom", res.Status)
		}
		if err != nil {
			t.Errorf("churn %d (%s): bomb: %v", i, req.Runtime, err)
		}
		c.KillProcesses(ctx, sb.ID)
		after, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo alive"}, Timeout: 60})
		if err != nil || after.Stdout != "alive\n" {
			t.Errorf("churn %d (%s): after the bomb: %+v %v", i, req.Runtime, after, err)
		}
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Errorf("churn %d: kill: %v", i, err)
	}
}

// faultOp prepares one round's operation (what must exist before it) and
// returns it, and the sandbox it pauses if it does; its errors are
// expected (the server dies under it).
func faultOp(t *testing.T, c *client.Client, url, key, reg, base, point string, round int, known map[string]bool) (func(), string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	created := func(sb *client.Sandbox, err error) {
		if err == nil {
			known[sb.ID] = true
		}
	}
	switch point {
	case "create":
		req := client.CreateRequest{Timeout: 600}
		switch round % 3 {
		case 1:
			req.Image = base
		case 2:
			if _, err := gvisor.Available(); err == nil {
				req.Runtime = "gvisor"
			}
		}
		// The id comes back only if the create finishes first: the
		// checks find the others through the store.
		return func() { created(c.Create(ctx, req)) }, ""
	case "pull":
		// A new image each round (64 MB of noise): a real download.
		noise := make([]byte, 64<<20)
		for i := range noise {
			noise[i] = byte(rand.Uint32())
		}
		ref := it.Push(t, reg, fmt.Sprintf("faults/big:%d", round), it.Image(t, it.TarLayer(t, it.Entry{Name: "noise", Type: tar.TypeReg, Data: string(noise)})))
		return func() { postQuiet(url+"/v1/images", key, `{"ref":"`+ref+`"}`) }, ""
	case "pause":
		sb, err := c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Timeout: 600})
		if err != nil {
			t.Fatal(err)
		}
		known[sb.ID] = true
		if _, err := c.WriteFile(ctx, sb.ID, "kept.txt", strings.NewReader("kept\n"), 0); err != nil {
			t.Fatal(err)
		}
		return func() { c.Pause(ctx, sb.ID) }, sb.ID
	case "snapshot":
		if round%2 == 0 {
			if _, err := gvisor.Available(); err == nil {
				sb, err := c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Timeout: 600})
				if err != nil {
					t.Fatal(err)
				}
				known[sb.ID] = true
				return func() { c.MemorySnapshot(ctx, sb.ID) }, ""
			}
		}
		sb, err := c.Create(ctx, client.CreateRequest{Image: base, Timeout: 600})
		if err != nil {
			t.Fatal(err)
		}
		known[sb.ID] = true
		if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "head -c 20000000 /dev/urandom > /workspace/big"}}); err != nil {
			t.Fatal(err)
		}
		return func() {
			postQuiet(url+"/v1/sandboxes/"+sb.ID+"/snapshot", key, fmt.Sprintf(`{"name":"faults/snap:%d"}`, round))
		}, ""
	case "image fork":
		// A memory snapshot of a gvisor image sandbox pauses it while its
		// root's changes are copied: a kill then leaves it paused by runsc
		// and a partial image, which the next server resumes and removes.
		sb, err := c.Create(ctx, client.CreateRequest{Runtime: "gvisor", Image: base, Timeout: 600})
		if err != nil {
			t.Fatal(err)
		}
		known[sb.ID] = true
		if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "head -c 20000000 /dev/urandom > /workspace/big"}}); err != nil {
			t.Fatal(err)
		}
		return func() { c.MemorySnapshot(ctx, sb.ID) }, ""
	case "template":
		b, _ := json.Marshal(map[string]any{"name": fmt.Sprintf("faults/tmpl:%d", round),
			"dockerfile": "FROM " + base + fmt.Sprintf("\nRUN echo %d > /round\nRUN head -c 5000000 /dev/urandom > /noise\n", round)})
		return func() { postQuiet(url+"/v1/templates", key, string(b)) }, ""
	}
	t.Fatalf("unknown fault point %q", point)
	return nil, ""
}

// pausedKept checks the sandbox a killed pause was pausing: kept (paused
// or running) with its file, or, only if the kill came before runsc began
// the checkpoint (begun false: a running gvisor sandbox does not survive
// its server), lost with a reason.
func pausedKept(t *testing.T, c *client.Client, id string, begun bool) []string {
	ctx := ctxT(t)
	sb, err := c.Get(ctx, id)
	if err != nil {
		return []string{"paused sandbox " + id + ": " + err.Error()}
	}
	if sb.State != "running" {
		if begun {
			return []string{fmt.Sprintf("sandbox %s, killed while runsc checkpointed it, is %s: %s", id, sb.State, sb.EndReason)}
		}
		t.Logf("sandbox %s, killed before its checkpoint began: %s: %s", id, sb.State, sb.EndReason)
		return nil
	}
	if sb.Paused {
		if _, err := c.Resume(ctx, id); err != nil {
			return []string{"paused sandbox " + id + " does not resume: " + err.Error()}
		}
	}
	if res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"cat", "kept.txt"}}); err != nil || res.Stdout != "kept\n" {
		return []string{fmt.Sprintf("paused sandbox %s lost its file: %+v %v", id, res, err)}
	}
	return nil
}

// faultCheck lists what the host and the state directory hold beyond the
// live sandboxes, after a restart (c set: the server runs) or a clean
// shutdown (c nil: nothing may run). It adds every sandbox of the store
// to known.
func faultCheck(t *testing.T, state string, c *client.Client, known map[string]bool, anchor string) []string {
	t.Helper()
	var left []string
	live := map[string]bool{}
	if c != nil {
		ctx := ctxT(t)
		all, err := c.List(ctx, nil, store.StateRunning, store.StateKilled, store.StateExpired, store.StateLost, store.StateExited)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range all {
			known[sb.ID] = true
			if sb.State == "running" {
				live[sb.ID] = true
			}
			if sb.State == "lost" && sb.EndReason == "" {
				left = append(left, "sandbox "+sb.ID+" lost without a reason")
			}
		}
		if anchor != "" {
			res, err := c.Exec(ctx, anchor, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /workspace/a"}})
			if err != nil || res.Stdout != "anchor\n" {
				left = append(left, fmt.Sprintf("the sandbox that ran across the crash: %+v %v", res, err))
			}
		}
		for id := range live {
			sb, err := c.Get(ctx, id)
			if err != nil || sb.Paused {
				continue
			}
			if _, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "true"}}); err != nil {
				left = append(left, "store row of running sandbox "+id+" that does not answer: "+err.Error())
			}
		}
	} else {
		st, err := store.Open(state)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := st.ListSandboxes(context.Background(), store.ListFilter{})
		st.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			known[r.ID] = true
			if r.State == store.StateRunning {
				left = append(left, "store row of sandbox "+r.ID+" still running after a clean shutdown")
			}
		}
	}
	keep := make([]string, 0, len(live))
	for id := range live {
		keep = append(keep, id)
	}
	left = append(left, testserver.HostLeftovers(state, keep...)...)
	// Give cgroups and runsc a moment: recovery kills, the kernel reaps.
	for id := range known {
		if live[id] {
			continue
		}
		var stale []string
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			stale = stale[:0]
			stale = append(stale, cgroupDirs(id)...)
			for _, p := range []string{filepath.Join(gvisor.StateBase, "bundles", id), filepath.Join(gvisor.StateBase, "root", "*"+id+"*"), filepath.Join(state, "sandboxes", id)} {
				m, _ := filepath.Glob(p)
				stale = append(stale, m...)
			}
			if len(stale) == 0 || time.Now().After(deadline) {
				break
			}
		}
		for _, p := range stale {
			left = append(left, "of ended sandbox "+id+": "+p)
		}
	}
	for id := range live {
		for _, tmp := range []string{"checkpoint.tmp"} {
			if _, err := os.Stat(filepath.Join(state, "sandboxes", id, tmp)); err == nil {
				left = append(left, "temp file "+filepath.Join(state, "sandboxes", id, tmp))
			}
		}
	}
	return left
}

// uidLeasesLeft lists the host uid range leases of the store's sandboxes
// that are still on file after a clean shutdown.
func uidLeasesLeft(t *testing.T, state string) []string {
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rows, err := st.ListSandboxes(context.Background(), store.ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	seen := map[int]bool{}
	for _, r := range rows {
		if r.UIDBase <= 0 || seen[r.UIDBase] {
			continue
		}
		seen[r.UIDBase] = true
		p := filepath.Join(idrange.DefaultDir, strconv.Itoa(r.UIDBase))
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) == 3 && f[0] == "dir" && !strings.Contains(f[2], r.ID) {
			if _, err := os.Stat(f[2]); err == nil {
				continue // another sandbox (its state directory) holds it now
			}
		}
		if len(f) == 2 {
			pid, _ := strconv.Atoi(f[0])
			if st, err := idrange.StartTime(pid); err == nil && strconv.FormatUint(st, 10) == f[1] && !ownedByUs(r.ID, pid) {
				continue // another sandbox (of another server) holds it now
			}
		}
		left = append(left, "uid lease "+p+" of sandbox "+r.ID+": "+strings.TrimSpace(string(b)))
	}
	return left
}

// ownedByUs reports whether pid belongs to sandbox id (its cgroup).
func ownedByUs(id string, pid int) bool {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	return strings.Contains(string(b), id)
}

// postQuiet sends an authenticated JSON POST whose answer does not matter
// (the server is killed under it).
func postQuiet(url, key, body string) {
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// oneShotLeftovers lists what the one-shot runs of dead servers pids (a
// template build's RUN steps, named run-<server pid>-...) left: roots in
// STATE/roots, cgroups, host uid range leases, image store leases.
func oneShotLeftovers(state string, pids []int) []string {
	var left []string
	roots, _ := os.ReadDir(filepath.Join(state, "roots"))
	for _, e := range roots {
		left = append(left, "build root "+filepath.Join(state, "roots", e.Name()))
	}
	leases, _ := os.ReadDir(filepath.Join(state, "images", "leases"))
	for _, e := range leases {
		if strings.HasPrefix(e.Name(), "run-") {
			left = append(left, "image lease "+filepath.Join(state, "images", "leases", e.Name()))
		}
	}
	for _, pid := range pids {
		for _, d := range cgroupDirs("run-" + strconv.Itoa(pid) + "-*") {
			left = append(left, "cgroup "+d)
		}
		files, _ := os.ReadDir(idrange.DefaultDir)
		for _, f := range files {
			b, _ := os.ReadFile(filepath.Join(idrange.DefaultDir, f.Name()))
			if fs := strings.Fields(string(b)); len(fs) == 2 && fs[0] == strconv.Itoa(pid) {
				left = append(left, "uid lease "+filepath.Join(idrange.DefaultDir, f.Name())+" held by dead server "+fs[0])
			}
		}
	}
	return left
}
