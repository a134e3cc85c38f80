package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/runtime/gvisor"
	"github.com/airlock-dev/airlock/runtime/microvm"
)

// MicroVMSessionBytes is how much the Python session of the microvm pause
// figures holds: less than gVisor's, since every byte is made by emulated
// instructions where KVM cannot run a guest.
const MicroVMSessionBytes = 100 << 20

// MicroVMDensityMax caps the microvm idle-memory figure's sandboxes per
// peer: each one is a guest of 512 MiB.
const MicroVMDensityMax = 4

// MicroVMServeFigures measure the microvm tier through airlock serve (its
// own server, started with the accelerator the KVM probe chose, which
// every figure's name carries): create to first exec against QEMU itself
// booting the same kernel to a command and against native and gVisor
// sandboxes of the same server; exec against native and gVisor; pause to
// disk and resume of a Python session; and the idle memory of a sandbox
// against native and gVisor ones. Which host gave which figure is in the
// names: "(kvm)" or "(tcg)".
func MicroVMServeFigures(exe, scratch string, runs int, opts DensityOptions, timeout time.Duration) []Figure {
	names := []string{"microvm create to first exec", "microvm exec", "microvm pause", "microvm resume", "microvm idle memory"}
	fail := func(why string) []Figure {
		out := make([]Figure, len(names))
		for i, n := range names {
			out[i] = Unavailable(n, why)
		}
		return out
	}
	if exe == "" {
		return fail("airlock binary unknown")
	}
	r, err := microvm.Describe(exe)
	if err != nil {
		return fail(err.Error())
	}
	if timeout <= 0 {
		timeout = 5 * time.Minute
	}
	srv, err := startServer(exe, scratch, 3*MicroVMDensityMax+8, timeout, "--microvm-accel", r.Accel)
	if err != nil {
		return fail("airlock serve did not start: " + err.Error())
	}
	defer srv.stop()
	suffix := " (" + r.Accel + ")"

	mv := srv.peer()
	mv.Note = fmt.Sprintf("airlock serve --microvm-accel %s (%s) and the Go client: POST /v1/sandboxes {\"runtime\":\"microvm\"}, then POST /v1/sandboxes/{id}/exec", r.Accel, r.Why)
	mv.IdleNote = "a live microvm sandbox of airlock serve: QEMU with the agent as the guest's PID 1, idle and ready to exec (PSS of QEMU, guest memory included)"
	mv.StartIdle = func([]string) (*Idle, error) { return srv.startLiveRuntime("microvm") }
	native := srv.peer()
	native.Name = Reference + " native"
	gv := srv.gvisorPeer()
	if _, err := gvisor.Available(); err != nil {
		gv.Missing = err.Error()
	}
	qemu := Peer{Name: "qemu", Missing: "qemu-system-x86_64 not found"}
	if q, err := exec.LookPath("qemu-system-x86_64"); err == nil {
		dir, err := os.MkdirTemp(scratch, "airlock-bench-microvm-")
		if err != nil {
			return fail(err.Error())
		}
		defer os.RemoveAll(dir)
		initrd := filepath.Join(dir, "initramfs.cpio")
		if err := writeBenchInitramfs(initrd); err != nil {
			return fail(err.Error())
		}
		qemu = qemuBootPeer(r, q, initrd, timeout)
	}

	var figs []Figure
	// Create to first exec, alternating: the QEMU peer boots the same
	// kernel into a busybox /init that runs the command.
	peers := []Peer{mv, native, gv, qemu}
	for i := range peers[:3] {
		if peers[i].Missing == "" {
			peers[i].Note = peers[i].IdleNote + "; then " + peers[i].ExecNote
		}
	}
	start := Sample(peers, UnitMS, runs, func(p Peer) (float64, error) {
		t0 := time.Now()
		if p.Run != nil {
			err := p.Run([]string{"/bin/true"})
			return float64(time.Since(t0)) / float64(time.Millisecond), err
		}
		idle, err := p.StartIdle(liveIdle)
		if err != nil {
			return 0, err
		}
		err = idle.Exec([]string{"/bin/true"})
		d := time.Since(t0)
		if err == nil {
			err = idle.settle() // finding its host processes is not timed
		}
		if serr := idle.Stop(); err == nil && serr != nil {
			err = fmt.Errorf("stop: %w", serr)
		}
		return float64(d) / float64(time.Millisecond), err
	})
	start.Name, start.Command = names[0]+suffix, []string{"/bin/true"}
	start.Note = "POST /v1/sandboxes then an exec of the command through the API, until it has exited (stopping is not timed); qemu: QEMU started on the same kernel until its /init has run the command"
	figs = append(figs, start)

	ex := ExecFigure([]Peer{mv, native, gv}, []string{"/bin/true"}, runs)
	ex.Name = names[1] + suffix
	figs = append(figs, ex)

	pr := srv.pauseFigures(pauseTier{runtime: "microvm", label: "microvm",
		pause:  "POST /v1/sandboxes/{id}/pause: QEMU's migration stream of the stopped guest into a file, then QEMU exits (memory freed)",
		resume: "POST /v1/sandboxes/{id}/resume: a new QEMU -incoming from the file, then the agent answers a ping"},
		nil, max(2, runs/5), MicroVMSessionBytes)
	for i := range pr {
		pr[i].Name += suffix
	}
	figs = append(figs, pr...)

	opts.Max = min(opts.Max, MicroVMDensityMax)
	if opts.Max <= 0 {
		opts.Max = MicroVMDensityMax
	}
	// A guest boots in seconds emulated: the native figure's 10 s would
	// stop at the first one.
	opts.StartTime = max(opts.StartTime, 3*time.Minute)
	d := Density([]Peer{mv, native, gv}, []string{"/bin/true"}, opts)
	d.Name = names[4] + suffix
	d.Note = fmt.Sprintf("each microvm guest has %d MiB of memory (the default limit); %s", 512, d.Note)
	figs = append(figs, d)
	return figs
}

// qemuBootPeer is QEMU itself booting the microvm tier's kernel r.Kernel,
// on the same machine type and accelerator with the same memory and
// kernel arguments, into the busybox initramfs initrd whose /init runs the
// command and prints benchDone.
func qemuBootPeer(r microvm.Report, q, initrd string, timeout time.Duration) Peer {
	machine, cpu := "microvm,accel=tcg,pit=on,pic=on,rtc=on", "max"
	timing := " tsc_early_khz=2000000 lpj=4000000 no_timer_check"
	if r.Accel == microvm.AccelKVM {
		machine, cpu, timing = "microvm,accel=kvm", "host", ""
	}
	return Peer{Name: "qemu", Note: fmt.Sprintf("%s -M %s -m 512 -kernel %s -initrd (busybox; /init runs CMD and prints a line on the console, on which QEMU is killed, as airlock's run kills its guest once the command's exit arrives)", q, machine, r.Kernel),
		Run: func(argv []string) error {
			return runQEMUPeer(timeout, q, "-M", machine, "-cpu", cpu, "-m", "512", "-smp", "1",
				"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
				"-kernel", r.Kernel, "-initrd", initrd,
				"-append", "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init"+timing+" -- "+strings.Join(argv, " "))
		}}
}
