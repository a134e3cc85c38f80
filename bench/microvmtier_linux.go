package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cavaliergopher/cpio"

	"github.com/airlock-dev/airlock/runtime/microvm"
)

// MicroVMFigure measures the microvm tier's cold start: `airlock run
// --runtime microvm -- /bin/true` (exec'ed: QEMU start, guest kernel boot,
// /init, the agent's hello, one exec, teardown; the initramfs cached)
// against QEMU itself booting the same kernel, on the same machine type
// and accelerator with the same memory and kernel arguments, into a
// busybox initramfs whose /init runs the command and powers off, in the
// same run. The accelerator is decided once (the KVM probe) and given to
// every run, and is in the figure's notes: which host gave which figure.
func MicroVMFigure(exe, scratch string, runs int, timeout time.Duration) Figure {
	const name = "microvm cold start"
	if timeout <= 0 {
		timeout = 5 * time.Minute
	}
	if exe == "" {
		return Unavailable(name, "airlock binary unknown")
	}
	r, err := microvm.Describe(exe)
	if err != nil {
		return Unavailable(name, err.Error())
	}
	q, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return Unavailable(name, err.Error())
	}
	dir, err := os.MkdirTemp(scratch, "airlock-bench-microvm-")
	if err != nil {
		return Unavailable(name, err.Error())
	}
	defer os.RemoveAll(dir)
	initrd := filepath.Join(dir, "initramfs.cpio")
	if err := writeBenchInitramfs(initrd); err != nil {
		return Unavailable(name, err.Error())
	}
	cli := Peer{Name: Reference, Note: fmt.Sprintf("airlock run --runtime microvm --microvm-accel %s -- CMD (the whole CLI, exec'ed: %s)", r.Accel, r.Why),
		Run: func(argv []string) error {
			return runWith(timeout, runSpec{}, exe, append([]string{"run", "--runtime", "microvm", "--microvm-accel", r.Accel, "--"}, argv...)...)
		}}
	qemu := qemuBootPeer(r, q, initrd, timeout)
	f := Alternate([]Peer{cli, qemu}, []string{"/bin/true"}, runs)
	f.Name = name + " (" + r.Accel + ")"
	return f
}

// benchDone is the line the QEMU peer's /init prints once the command
// has succeeded.
const benchDone = "AIRLOCK-BENCH-DONE"

// runQEMUPeer runs QEMU until its console prints benchDone, then kills
// it; a guest that ends or times out first is an error.
func runQEMUPeer(timeout time.Duration, q string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, q, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	sc := bufio.NewScanner(out)
	done := false
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == benchDone {
			done = true
			break
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	if !done {
		return fmt.Errorf("qemu: the guest ended without running the command (%v)", ctx.Err())
	}
	return nil
}

// writeBenchInitramfs writes the QEMU peer's initramfs: the host's static
// busybox and an /init that runs its arguments and powers off.
func writeBenchInitramfs(path string) error {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fmt.Errorf("busybox: %w", err)
	}
	init := "#!/bin/busybox sh\n\"$@\" && echo " + benchDone + "\n/bin/busybox poweroff -f\n"
	var buf bytes.Buffer
	w := cpio.NewWriter(&buf)
	add := func(h *cpio.Header, data []byte) error {
		h.Size = int64(len(data))
		if err := w.WriteHeader(h); err != nil {
			return err
		}
		_, err := w.Write(data)
		return err
	}
	for _, e := range []struct {
		h    cpio.Header
		data []byte
	}{
		{cpio.Header{Name: "bin", Mode: cpio.TypeDir | 0o755}, nil},
		{cpio.Header{Name: "proc", Mode: cpio.TypeDir | 0o755}, nil},
		{cpio.Header{Name: "bin/busybox", Mode: cpio.TypeReg | 0o755}, bb},
		{cpio.Header{Name: "bin/sh", Mode: cpio.TypeSymlink | 0o777}, []byte("busybox")},
		{cpio.Header{Name: "bin/true", Mode: cpio.TypeSymlink | 0o777}, []byte("busybox")},
		{cpio.Header{Name: "init", Mode: cpio.TypeReg | 0o755}, []byte(init)},
	} {
		if err := add(&e.h, e.data); err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}
