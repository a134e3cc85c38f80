package microvm

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// kvmProbeEnv makes the test binary run probeKVM and print its answer
// (TestMain).
const kvmProbeEnv = "AIRLOCK_TEST_KVM_PROBE"

// TestKVMProbeDiesWithServer: a process killed (SIGKILL) while its KVM
// probe runs leaves no probe QEMU behind. On a host where KVM cannot run
// a guest (this one: nested KVM over PVM) the probe hangs until
// ProbeTimeout, and servers killed by tests left such QEMUs for an hour;
// where the probe ends before the kill, there is nothing to check (said
// in the log).
func TestKVMProbeDiesWithServer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (/dev/kvm)")
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		t.Skip("no /dev/kvm")
	}
	if _, err := qemuPath(); err != nil {
		t.Skip(err)
	}
	if _, err := kernelPath(); err != nil {
		t.Skip(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(self, "-test.run=^$")
	child.Env = append(os.Environ(), kvmProbeEnv+"=1")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- child.Wait() }()
	// The probe's QEMU: a child of the child.
	var qemu int
	for deadline := time.Now().Add(2 * time.Minute); qemu == 0 && time.Now().Before(deadline); {
		select {
		case <-done:
			t.Logf("the probe ended before it could be killed: nothing to check on this host")
			return
		case <-time.After(100 * time.Millisecond):
		}
		qemu = childOf(child.Process.Pid, "qemu-system")
	}
	if qemu == 0 {
		child.Process.Kill()
		t.Fatal("no probe QEMU appeared under the probing process in 2 min")
	}
	child.Process.Kill()
	<-done
	for deadline := time.Now().Add(30 * time.Second); ; {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(qemu) + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			return // gone (or a zombie its new parent reaps)
		}
		if time.Now().After(deadline) {
			exec.Command("kill", "-9", strconv.Itoa(qemu)).Run()
			t.Fatalf("the probe QEMU (pid %d) outlived the killed process that started it", qemu)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// childOf returns the pid of a child of parent whose command name starts
// with name (0 if none).
func childOf(parent int, name string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		f := strings.Fields(s[close+1:])
		if len(f) < 2 || !strings.HasPrefix(s[open+1:close], name) {
			continue
		}
		if pp, _ := strconv.Atoi(f[1]); pp == parent {
			return pid
		}
	}
	return 0
}
