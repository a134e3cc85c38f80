package microvm

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-dev/airlock/runtime/native"
)

// TestMicroVMVolume: a volume is the host directory itself, shared over
// virtio-fs: the guest reads what the host put there and the host sees
// what the guest writes, with the guest's uid; a symlink in the volume is
// resolved in the guest, never on the host; the volume's virtiofsd ends
// with the VM.
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
	if err := vm.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); !os.IsNotExist(err) {
		t.Fatalf("virtiofsd %d outlived its VM (%v)", pid, err)
	}
}
