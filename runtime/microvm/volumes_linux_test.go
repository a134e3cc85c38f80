package microvm

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
)

// TestMicroVMVolume: a volume is the host directory itself, shared over
// virtio-fs: the guest reads what the host put there and the host sees
// what the guest writes, with the guest's uid; a symlink in the volume is
// resolved in the guest, never on the host; the volume's virtiofsd (and
// the process of its sandbox) runs in a cgroup of its own, not QEMU's,
// with memory and task limits and its usage accounted, and ends with the
// VM, which removes that cgroup.
func TestMicroVMVolume(t *testing.T) {
	if err := (Tier{}).Available(); err != nil {
		t.Skipf("microvm tier not available: %v", err)
	}
	if _, err := os.Stat(VirtiofsdBinary); err != nil {
		t.Skipf("no virtiofsd: %v", err)
	}
	dir := t.TempDir()
	vol := filepath.Join(dir, "vol")
	if err := os.Mkdir(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(vol, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "from-host"), []byte("host data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "host-secret")
	if err := os.WriteFile(secret, []byte("HOST SECRET\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(vol, "escape")); err != nil {
		t.Fatal(err)
	}
	vm, c := bootGuestWith(t, func(cfg *native.Config) {
		cfg.Volumes = []native.VolumeMount{{Dir: vol, Target: "/data"}}
	})
	out, st := run(t, c, "cat /data/from-host; echo guest data > /data/from-guest; cat /data/escape 2>&1; grep ' /data ' /proc/mounts")
	if st.Code != 0 || !strings.HasPrefix(out, "host data\n") || strings.Contains(out, "HOST SECRET") || !strings.Contains(out, "virtiofs") || !strings.Contains(out, "nosuid") {
		t.Fatalf("guest: %d %q", st.Code, out)
	}
	b, err := os.ReadFile(filepath.Join(vol, "from-guest"))
	if err != nil || string(b) != "guest data\n" {
		t.Fatalf("host side of the guest's write: %q %v", b, err)
	}
	var s syscall.Stat_t
	if err := syscall.Stat(filepath.Join(vol, "from-guest"), &s); err != nil || s.Uid != 1000 {
		t.Fatalf("the guest's file on the host: uid %d (%v), want 1000", s.Uid, err)
	}
	if len(vm.vols) != 1 {
		t.Fatalf("volume daemons: %d", len(vm.vols))
	}
	pid := vm.vols[0].daemon.Process.Pid
	dirs := checkVolumeGroup(t, vm, pid)
	if err := vm.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); !os.IsNotExist(err) {
		t.Fatalf("virtiofsd %d outlived its VM (%v)", pid, err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("the volume daemons' cgroup %s outlived the VM (%v)", d, err)
		}
	}
}

// checkVolumeGroup fails t unless virtiofsd (pid) and its children are all
// in the sandbox's volume daemons' cgroup, outside QEMU's, and that group
// has its limits and accounts the daemons' memory. It returns the group's
// directories.
func checkVolumeGroup(t *testing.T, vm *VM, pid int) []string {
	t.Helper()
	want := "/airlock/" + volumeGroup(vm.id)
	procs := append([]int{pid}, childrenOf(pid)...)
	if len(procs) < 2 {
		t.Errorf("virtiofsd %d has no sandbox process (sandbox=namespace forks one): %v", pid, procs)
	}
	g, err := cgroups.Lookup(volumeGroup(vm.id))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p))
		if err != nil {
			t.Fatal(err)
		}
		checked := 0
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			// v2: the unified line; v1: the memory and pids hierarchies'.
			f := strings.SplitN(l, ":", 3)
			if len(f) == 3 && (g.Version() == 2 && f[1] == "" || g.Version() == 1 && (strings.Contains(f[1], "memory") || strings.Contains(f[1], "pids"))) {
				checked++
				if f[2] != want {
					t.Errorf("volume daemon process %d is in cgroup %s, want %s", p, l, want)
				}
			}
		}
		if checked == 0 {
			t.Errorf("volume daemon process %d: no cgroup line checked in %q", p, b)
		}
	}
	limits := map[string]string{} // file name -> value, over the group's directories (v1: one per controller)
	for _, d := range g.Dirs() {
		for _, f := range []string{"memory.limit_in_bytes", "memory.max", "pids.max"} {
			if b, err := os.ReadFile(filepath.Join(d, f)); err == nil {
				limits[f] = strings.TrimSpace(string(b))
			}
		}
	}
	mem := limits["memory.limit_in_bytes"] + limits["memory.max"]
	if mem != strconv.Itoa(volumeDaemonMemory) || limits["pids.max"] != strconv.Itoa(volumeDaemonTasks) {
		t.Errorf("the volume daemons' cgroup limits: memory %q, tasks %q; want %d, %d", mem, limits["pids.max"], volumeDaemonMemory, volumeDaemonTasks)
	}
	st, err := g.Stats()
	if err != nil || st.MemoryBytes <= 0 {
		t.Errorf("the volume daemons' cgroup accounts no memory: %+v %v", st, err)
	}
	qemuCg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", vm.Pid()))
	if err != nil || strings.Contains(string(qemuCg), volumeGroup(vm.id)) {
		t.Errorf("QEMU is in the volume daemons' cgroup: %s %v", qemuCg, err)
	}
	return g.Dirs()
}

// childrenOf lists pid's children (by their parent pid in /proc).
func childrenOf(pid int) []int {
	var kids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces; it ends at the last ')'.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			if k, err := strconv.Atoi(e.Name()); err == nil {
				kids = append(kids, k)
			}
		}
	}
	return kids
}
