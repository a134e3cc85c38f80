// Package cgroup2vm boots the microVM tier's guest kernel under QEMU on a
// pure cgroup v2 hierarchy and runs programs (compiled Go test binaries of
// the native tier) inside it, as root and as an unprivileged user in a
// systemd-style delegated subtree. It exists because the CI hosts bind
// their controllers to cgroup v1, so the native tier's v2 paths would
// otherwise never run there; see docs/RATIONALE.md.
//
// The guest is the microvm tier's: the Debian kernel from /boot
// (microvm.GuestKernel, with its modules), the host's python3 as a
// read-only EROFS /usr (microvm.UsrImage) under a tmpfs overlay that adds
// busybox as the shell and tools. Its /init mounts only cgroup2 at
// /sys/fs/cgroup (nsdelegate, as systemd does), enables every controller
// in the root's subtree_control, and then runs Config.Script; each
// Phase's exit status comes back on the serial console.
package cgroup2vm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cavaliergopher/cpio"

	"github.com/airlock-dev/airlock/runtime/microvm"
)

// Config is one guest run.
type Config struct {
	// Files are copied into the guest's /t, executable, by base name
	// (the key) from the host path (the value).
	Files map[string]string
	// Script is a busybox sh script run as root in /t once cgroup2 is
	// set up. It reports each step with the shell function
	// `phase NAME COMMAND...`, which runs COMMAND and reports its exit
	// status as Result.Exits[NAME]; `as_user NAME COMMAND...` does the
	// same as uid 1000 alone in a delegated cgroup (see guestInit).
	Script string
	// MemoryMiB and CPUs size the guest (defaults 2048 and 2).
	MemoryMiB, CPUs int
	// Output, when set, receives the guest's console as it runs.
	Output io.Writer
}

// Result is what a guest run reported.
type Result struct {
	// Console is everything the guest wrote to its serial console.
	Console string
	// Exits maps each phase name to its exit status.
	Exits map[string]int
	// Order lists the phase names in the order they reported.
	Order []string
	// Done reports whether the script ran to its end.
	Done bool
}

// modules are the kernel modules the guest needs beyond what is built in:
// virtio over MMIO (the microvm machine's bus), virtio-blk and EROFS for
// the /usr image, overlayfs for the writable /usr above it.
var modules = []string{"virtio_mmio", "virtio_blk", "erofs", "overlay"}

// busyboxPath is the static busybox (Debian's busybox-static).
var busyboxPath = "/bin/busybox"

// Available reports why a guest cannot be booted here (nil if it can):
// QEMU, the guest kernel, busybox-static and mkfs.erofs come from
// scripts/setup.sh.
func Available() error {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return errors.New("qemu-system-x86_64 not found (apt-get install qemu-system-x86, or scripts/setup.sh)")
	}
	if _, err := microvm.GuestKernel(); err != nil {
		return err
	}
	if _, err := os.Stat(busyboxPath); err != nil {
		return fmt.Errorf("no static busybox at %s (apt-get install busybox-static)", busyboxPath)
	}
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		return errors.New("mkfs.erofs not found (apt-get install erofs-utils, or scripts/setup.sh)")
	}
	return nil
}

// Run boots a guest with cfg and returns what it reported once it has
// powered off. It fails if the guest cannot be built or booted, or if ctx
// ends first (the guest is killed; the console so far is in the Result).
func Run(ctx context.Context, dir string, cfg Config) (*Result, error) {
	kernel, err := microvm.GuestKernel()
	if err != nil {
		return nil, err
	}
	usr, err := microvm.UsrImage()
	if err != nil {
		return nil, fmt.Errorf("cgroup2vm: /usr image: %w", err)
	}
	initrd := filepath.Join(dir, "initramfs.cpio")
	if err := writeInitramfs(initrd, kernel, cfg); err != nil {
		return nil, err
	}
	mem, cpus := cfg.MemoryMiB, cfg.CPUs
	if mem == 0 {
		mem = 2048
	}
	if cpus == 0 {
		cpus = 2
	}
	args := []string{"-M", "microvm,pit=on,pic=on,rtc=on", "-accel", "tcg,tb-size=256", "-cpu", "max",
		"-m", strconv.Itoa(mem), "-smp", strconv.Itoa(cpus),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con",
		"-drive", "file=" + usr + ",if=none,format=raw,readonly=on,id=usr",
		"-device", "virtio-blk-device,drive=usr,serial=cg2-usr",
		"-kernel", kernel, "-initrd", initrd,
		// cgroup_no_v1=all: no controller can be bound to v1, as on a
		// host booted with systemd's unified hierarchy. init_on_alloc=0:
		// zeroing every page allocated is slow under emulation.
		"-append", "console=ttyS0 loglevel=4 panic=-1 rdinit=/init cgroup_no_v1=all init_on_alloc=0 " + microvm.TCGKernelArgs}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	cmd.WaitDelay = 5 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cgroup2vm: start qemu: %w", err)
	}
	res := &Result{Exits: map[string]int{}}
	var console bytes.Buffer
	parsed := make(chan struct{})
	go func() {
		defer close(parsed)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			console.WriteString(line + "\n")
			if cfg.Output != nil {
				fmt.Fprintln(cfg.Output, line)
			}
			if m := exitLine.FindStringSubmatch(line); m != nil {
				rc, _ := strconv.Atoi(m[2])
				if _, dup := res.Exits[m[1]]; !dup {
					res.Order = append(res.Order, m[1])
				}
				res.Exits[m[1]] = rc
			}
			if strings.Contains(line, doneMarker) {
				res.Done = true
			}
		}
		io.Copy(io.Discard, pr)
	}()
	werr := cmd.Wait()
	pw.Close()
	<-parsed
	res.Console = console.String()
	if ctx.Err() != nil {
		return res, fmt.Errorf("cgroup2vm: guest did not finish: %w", ctx.Err())
	}
	if werr != nil && !res.Done {
		return res, fmt.Errorf("cgroup2vm: qemu: %w", werr)
	}
	return res, nil
}

// The console lines the guest's phases and its end are reported with.
const (
	exitMarker = "@@cgroup2vm-exit"
	doneMarker = "@@cgroup2vm-done"
)

var exitLine = regexp.MustCompile(exitMarker + ` (\S+) (\d+)`)

// writeInitramfs writes the guest's newc archive: busybox, the modules,
// /init (stage one), /t with cfg's files, /t/init2 and /t/run.sh.
func writeInitramfs(path, kernel string, cfg Config) error {
	mods, err := microvm.KernelModules(kernel, modules...)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cgroup2vm: %w", err)
	}
	defer f.Close()
	bw := bufio.NewWriter(f)
	cw := cpio.NewWriter(bw)
	dir := func(name string) error {
		return cw.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeDir | 0o755})
	}
	file := func(name string, data []byte) error {
		if err := cw.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeReg | 0o755, Size: int64(len(data))}); err != nil {
			return err
		}
		_, err := cw.Write(data)
		return err
	}
	hostFile := func(name, src string) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		return file(name, b)
	}
	var order strings.Builder
	steps := []func() error{
		func() error { return dir("bin") },
		func() error { return hostFile("bin/busybox", busyboxPath) },
		func() error { return dir("modules") },
		func() error { return dir("t") },
		func() error { return dir("etc") },
		func() error { return dir("proc") },
		func() error { return dir("sys") },
		func() error { return dir("dev") },
		func() error { return file("init", []byte(stageOne)) },
		func() error { return file("t/init2", []byte(guestInit)) },
		func() error { return file("t/run.sh", []byte(cfg.Script)) },
		func() error {
			return file("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"))
		},
		func() error { return file("etc/group", []byte("root:x:0:\nuser:x:1000:\n")) },
	}
	for _, m := range mods {
		steps = append(steps, func() error {
			order.WriteString(filepath.Base(m) + "\n")
			return hostFile("modules/"+filepath.Base(m), m)
		})
	}
	steps = append(steps, func() error { return file("modules/order", []byte(order.String())) })
	for name, src := range cfg.Files {
		if strings.ContainsAny(name, "/ ") || name == "init2" || name == "run.sh" {
			return fmt.Errorf("cgroup2vm: bad guest file name %q", name)
		}
		steps = append(steps, func() error { return hostFile("t/"+name, src) })
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return fmt.Errorf("cgroup2vm: initramfs: %w", err)
		}
	}
	if err := cw.Close(); err != nil {
		return fmt.Errorf("cgroup2vm: initramfs: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("cgroup2vm: initramfs: %w", err)
	}
	return f.Close()
}

// stageOne is the guest's /init in the initramfs. pivot_root, which the
// native tier uses, cannot leave an initramfs: so it builds a tmpfs root
// with Debian's merged-/usr layout (/usr an overlay of the host's python3
// image and a tmpfs holding busybox's applets), copies /t and /etc into
// it and switches to it.
const stageOne = `#!/bin/busybox sh
B=/bin/busybox
die() { echo "cgroup2vm: $*"; $B poweroff -f; $B sleep 5; exit 1; }
$B mount -t proc proc /proc || die proc
$B mount -t sysfs sys /sys || die sys
$B mount -t devtmpfs dev /dev || die dev
for m in $($B cat /modules/order); do $B insmod /modules/$m || die "insmod $m"; done
usr=
i=0
while [ -z "$usr" ] && [ $i -lt 500 ]; do
	for b in /sys/block/vd*; do
		[ "$($B cat $b/serial 2>/dev/null)" = cg2-usr ] && [ -b /dev/${b##*/} ] && usr=/dev/${b##*/}
	done
	[ -n "$usr" ] || { i=$((i+1)); $B usleep 20000; }
done
[ -n "$usr" ] || die "no /usr disk"
N=/newroot
$B mkdir -p $N || die mkdir
$B mount -t tmpfs -o mode=0755 root $N || die "tmpfs root"
$B mkdir -p $N/usr $N/.usr/lower $N/.usr/rw $N/proc $N/sys $N/dev $N/tmp $N/run $N/var/tmp $N/root $N/home/user $N/t $N/etc || die mkdir
$B chmod 1777 $N/tmp $N/var/tmp
$B mount -t erofs -o ro $usr $N/.usr/lower || die "mount /usr image"
$B mount -t tmpfs -o mode=0755 usr-rw $N/.usr/rw || die "tmpfs /usr"
$B mkdir -p $N/.usr/rw/upper $N/.usr/rw/work || die mkdir
$B mount -t overlay -o lowerdir=$N/.usr/lower,upperdir=$N/.usr/rw/upper,workdir=$N/.usr/rw/work usr $N/usr || die "overlay /usr"
$B mkdir -p $N/usr/bin $N/usr/sbin $N/usr/lib $N/usr/lib64 || die mkdir
$B cp /bin/busybox $N/usr/bin/busybox || die "copy busybox"
for a in $($B --list); do [ -e $N/usr/bin/$a ] || $B ln -s busybox $N/usr/bin/$a; done
for d in bin sbin lib lib64; do $B ln -s usr/$d $N/$d || die "link $d"; done
$B cp -a /t/. $N/t/ || die "copy /t"
$B cp -a /etc/. $N/etc/ || die "copy /etc"
$B chown 1000:1000 $N/home/user
for d in proc sys dev; do $B mount --move /$d $N/$d || die "move $d"; done
exec $B switch_root $N /t/init2
`

// guestInit is /t/init2, PID 1 on the new root. It mounts cgroup2 alone
// (nsdelegate, as systemd does), enables every controller the root offers
// in its subtree_control, moves itself into a leaf (init.scope) as systemd
// does, and sources /t/run.sh, which has:
//
//	phase NAME CMD...    run CMD as root (in its own leaf) and report it
//	as_user NAME CMD...  run CMD as uid 1000, alone in the systemd-style
//	                     delegated cgroup /user.slice/user-1000.slice/
//	                     user@1000.service/app.scope (owned by uid 1000,
//	                     memory, pids and cpu enabled above it), and report
//	                     it
const guestInit = `#!/bin/sh
export PATH=/usr/bin:/bin HOME=/root TMPDIR=/tmp
die() { echo "cgroup2vm: $*"; poweroff -f; sleep 5; exit 1; }
mount -t devpts -o nosuid,noexec devpts /dev/pts 2>/dev/null || { mkdir -p /dev/pts && mount -t devpts -o nosuid,noexec devpts /dev/pts; } || die devpts
mkdir -p /dev/shm && mount -t tmpfs -o nosuid,nodev tmpfs /dev/shm || die shm
mount -t cgroup2 -o nosuid,nodev,noexec,nsdelegate cgroup2 /sys/fs/cgroup || die "mount cgroup2"
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
	echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control || die "enable $c"
done
mkdir /sys/fs/cgroup/init.scope && echo $$ > /sys/fs/cgroup/init.scope/cgroup.procs || die "init.scope"
ip link set lo up
echo "cgroup2vm: $(uname -r), $(nproc) CPUs, cgroup2 controllers: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
grep cgroup /proc/self/mountinfo
n=0
phase() {
	name=$1; shift
	n=$((n+1))
	mkdir /sys/fs/cgroup/phase-$n
	sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' /sys/fs/cgroup/phase-$n "$@"
	echo "@@cgroup2vm-exit $name $?"
}
U=/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service
as_user() {
	name=$1; shift
	mkdir -p $U || die "mkdir $U"
	for d in /sys/fs/cgroup/user.slice /sys/fs/cgroup/user.slice/user-1000.slice; do
		for c in memory pids cpu; do echo "+$c" > $d/cgroup.subtree_control || die "enable $c in $d"; done
	done
	chown 1000:1000 $U $U/cgroup.procs $U/cgroup.subtree_control $U/cgroup.threads || die "delegate $U"
	# The user's manager enables the controllers down to a delegated scope.
	for c in memory pids cpu; do echo "+$c" > $U/cgroup.subtree_control || die "enable $c in $U"; done
	mkdir $U/app.scope && chown 1000:1000 $U/app.scope $U/app.scope/cgroup.procs $U/app.scope/cgroup.subtree_control $U/app.scope/cgroup.threads || die "app.scope"
	(cd /home/user && HOME=/home/user exec sh -c 'echo $$ > "$0/cgroup.procs" && exec su -s /bin/sh -c "exec \"\$0\" \"\$@\"" -- user "$@"' $U/app.scope "$@")
	echo "@@cgroup2vm-exit $name $?"
	rmdir $U/app.scope/* 2>/dev/null; rmdir $U/app.scope 2>/dev/null
}
cd /t
. /t/run.sh
echo "@@cgroup2vm-done"
sync
poweroff -f
sleep 10
`
