package bench

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestProcHelpers(t *testing.T) {
	st, ppid, ok := procStat(os.Getpid())
	if !ok || ppid != os.Getppid() || st == 'Z' {
		t.Errorf("procStat(self) = %c, %d, %v", st, ppid, ok)
	}
	pss, rss, ok := smapsRollup(os.Getpid())
	if !ok || pss <= 0 || rss < pss {
		t.Errorf("smapsRollup(self) = %d, %d, %v", pss, rss, ok)
	}
	cmd := exec.Command("/bin/sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	found := false
	for _, pid := range descendants(os.Getpid()) {
		found = found || pid == cmd.Process.Pid
	}
	scanned := false
	for _, pid := range descendantsIn(processTree(), os.Getpid()) {
		scanned = scanned || pid == cmd.Process.Pid
	}
	if !scanned {
		t.Errorf("child %d not found by scanning /proc", cmd.Process.Pid)
	}
	if !found {
		t.Errorf("child %d not among the descendants of %d", cmd.Process.Pid, os.Getpid())
	}
	if err := aliveErr(cmd.Process.Pid); err != nil {
		t.Error(err)
	}
	if err := aliveErr(1 << 30); err == nil {
		t.Error("a pid that does not exist is alive")
	}
}

func TestIdleComm(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"/bin/sleep", []string{"3600"}, "sleep"},
		{"/usr/bin/bwrap", bwrapArgs([]string{"/bin/sleep", "3600"}), "sleep"},
		{"/usr/bin/unshare", append(append([]string{}, unshareFlags...), "--", "/bin/sleep", "1"), "sleep"},
		{"/usr/local/bin/srt", []string{"-c", shellJoin([]string{"/bin/sleep", "3600"})}, "sleep"},
	}
	for _, c := range cases {
		if got := idleComm(c.name, c.args); got != c.want {
			t.Errorf("idleComm(%s %v) = %q, want %q", c.name, c.args, got, c.want)
		}
	}
}

func TestCgroupKernel(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		if err := os.WriteFile(dir+"/"+name, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("memory.stat", "anon 100\nkernel 4096\n")
	if v, src := cgroupKernel(dir, 0); v != 4096 || src != "memory.stat kernel" {
		t.Errorf("v2 = %d (%s)", v, src)
	}
	write("memory.usage_in_bytes", "10000\n")
	if v, src := cgroupKernel(dir, 4000); v != 6000 || !strings.Contains(src, "minus RSS") {
		t.Errorf("v1 without kmem = %d (%s)", v, src)
	}
	write("memory.kmem.usage_in_bytes", "123\n")
	if v, src := cgroupKernel(dir, 4000); v != 123 || src != "memory.kmem.usage_in_bytes" {
		t.Errorf("v1 kmem = %d (%s)", v, src)
	}
}

// TestDensitySmall starts a few idle sandboxes of bare, bwrap (if present)
// and airlock, and checks the figure's shape, not its values.
func TestDensitySmall(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode")
	}
	all := DetectPeers(Options{ScratchDir: t.TempDir()})
	peers := []Peer{AirlockInProcess(), all[0], all[2]}
	fig := Density(peers, []string{"/bin/sleep", "600"}, DensityOptions{Max: 3, StartTime: 30 * time.Second})
	if fig.Unit != UnitMiB || fig.Rounds != 3 {
		t.Errorf("figure = %+v", fig)
	}
	for _, r := range fig.Results {
		if r.Missing != "" {
			t.Logf("%s missing: %s", r.Peer, r.Missing)
			continue
		}
		if r.Peer == Reference && os.Geteuid() != 0 {
			t.Logf("airlock (not root): %+v", r)
			continue
		}
		d := r.Density
		if r.Error != "" || d == nil || d.Started != 3 || d.Alive != 3 || len(r.Samples) != 3 || r.Median <= 0 || d.PSSMiB <= 0 {
			t.Errorf("%s: %+v density %+v", r.Peer, r, d)
		}
	}
	if air := fig.Result(Reference); os.Geteuid() == 0 && air.Density != nil && air.Density.KernelSource == "" {
		t.Errorf("airlock kernel memory source unknown: %+v", air.Density)
	}
	// Every idle sandbox is gone.
	for _, pid := range descendants(os.Getpid())[1:] {
		if procComm(pid) == "sleep" {
			t.Errorf("idle sandbox process %d left running", pid)
		}
	}
}
