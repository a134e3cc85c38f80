package microvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Accel modes for Accel.
const (
	AccelAuto = "auto" // KVM if a probe guest boots on it, else TCG
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// Accel is how guests are run: "auto" (default), "kvm" or "tcg". Set it
// before the first sandbox (serve --microvm-accel).
var Accel = AccelAuto

// QEMUBinary is the emulator; empty means qemu-system-x86_64 on PATH.
var QEMUBinary = ""

// KernelPath is the guest kernel; empty means the newest
// /boot/vmlinuz-*-cloud-amd64 (Debian's linux-image-cloud-amd64), else
// the newest /boot/vmlinuz-*.
var KernelPath = ""

// ProbeTimeout bounds the KVM probe boot.
var ProbeTimeout = 30 * time.Second

func qemuPath() (string, error) {
	if QEMUBinary != "" {
		return QEMUBinary, nil
	}
	p, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return "", fmt.Errorf("microvm: qemu-system-x86_64 not found (apt-get install qemu-system-x86, or scripts/setup.sh)")
	}
	return p, nil
}

func kernelPath() (string, error) {
	if KernelPath != "" {
		if _, err := os.Stat(KernelPath); err != nil {
			return "", fmt.Errorf("microvm: kernel: %w", err)
		}
		return KernelPath, nil
	}
	for _, pat := range []string{"/boot/vmlinuz-*-cloud-amd64", "/boot/vmlinuz-*"} {
		m, _ := filepath.Glob(pat)
		sort.Strings(m)
		if len(m) > 0 {
			return m[len(m)-1], nil
		}
	}
	return "", fmt.Errorf("microvm: no guest kernel in /boot (apt-get install linux-image-cloud-amd64, or scripts/setup.sh)")
}

// accelChoice is the accelerator in use and why.
type accelChoice struct{ accel, why string }

var (
	accelOnce sync.Once
	accelRes  accelChoice
	accelErr  error
)

// chooseAccel decides between KVM and TCG once per process.
func chooseAccel() (accelChoice, error) {
	accelOnce.Do(func() { accelRes, accelErr = decideAccel(Accel) })
	return accelRes, accelErr
}

func decideAccel(mode string) (accelChoice, error) {
	switch mode {
	case AccelTCG:
		return accelChoice{AccelTCG, "TCG emulation: chosen by --microvm-accel=tcg"}, nil
	case AccelKVM:
		if err := probeKVM(); err != nil {
			return accelChoice{}, fmt.Errorf("microvm: --microvm-accel=kvm: %w", err)
		}
		return accelChoice{AccelKVM, "KVM: chosen by --microvm-accel=kvm (a probe guest booted on it)"}, nil
	case AccelAuto, "":
		if err := probeKVM(); err != nil {
			return accelChoice{AccelTCG, "TCG emulation: " + err.Error()}, nil
		}
		return accelChoice{AccelKVM, "KVM: a probe guest booted on it"}, nil
	}
	return accelChoice{}, fmt.Errorf("microvm: unknown accel %q (want auto, kvm or tcg)", mode)
}

// probeKVM boots the guest kernel without a root on KVM: a working KVM
// reaches the kernel's "unable to mount root" panic and QEMU exits (panic=-1,
// -no-reboot); a KVM that cannot run a guest (nested KVM over PVM, say)
// hangs or fails.
func probeKVM() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("no usable /dev/kvm (%v)", err)
	}
	f.Close()
	q, err := qemuPath()
	if err != nil {
		return err
	}
	k, err := kernelPath()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), ProbeTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, q, "-M", "microvm,accel=kvm", "-cpu", "host", "-m", "128",
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", k, "-append", "console=ttyS0 panic=-1 loglevel=4")
	cmd.Stdout, cmd.Stderr = &out, &out
	// A probe that hangs is killed at ProbeTimeout, and with its parent if
	// that dies first (seen: servers killed by tests left probe QEMUs hung
	// at SeaBIOS for an hour). The parent-death signal follows the thread
	// that forks, so this goroutine keeps it until the probe has ended.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	runtime.LockOSThread()
	err = cmd.Run()
	runtime.UnlockOSThread()
	if ctx.Err() != nil {
		return fmt.Errorf("KVM present but cannot run a guest (a probe kernel made no progress in %s: nested KVM over PVM?)", ProbeTimeout)
	}
	if !strings.Contains(out.String(), "Kernel panic") {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 200 {
			msg = msg[len(msg)-200:]
		}
		return fmt.Errorf("KVM present but cannot run a guest (%v: %s)", err, msg)
	}
	return nil
}

// errNotReady marks a host that lacks what the tier needs.
var errNotReady = errors.New("microvm tier not available")
