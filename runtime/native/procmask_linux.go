package native

import (
	"os"

	"golang.org/x/sys/unix"
)

// procMasked are the /proc entries that runc and Docker mask (plus
// /proc/config.gz, the host kernel's build configuration): kernel memory,
// keys, timers, scheduler and hardware details of the host. A file is
// covered by /dev/null (reads see nothing), a directory by an empty
// read-only tmpfs.
var procMasked = []string{
	"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
	"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
	"/proc/scsi", "/proc/config.gz",
}

// procReadOnly are the /proc entries runc and Docker make read-only: the
// sysctls (some of which, those of the sandbox's own network namespace,
// the sandbox's uid 0 could otherwise write), IRQ affinities, bus and
// filesystem settings, and the magic SysRq trigger.
var procReadOnly = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}

// late adds a mount step the child performs after pivot_root, with paths
// as the sandbox sees them, before it drops its capabilities.
func (t *treeBuilder) late(o op, step string) {
	t.remount = append(t.remount, o)
	t.rsteps = append(t.rsteps, step)
}

// maskProc covers and freezes the host-revealing or writable /proc entries
// of the sandbox's fresh procfs. Entries this kernel lacks (the sandbox's
// procfs has the same global entries as the host's) are skipped. The
// sandbox cannot undo a mask: mount and umount are denied by seccomp in
// every profile, and it holds no capability by then.
func (t *treeBuilder) maskProc() {
	for _, p := range procMasked {
		fi, err := os.Lstat(p)
		switch {
		case err != nil:
			continue
		case fi.IsDir():
			t.late(op{src: cstr("tmpfs"), path: cstr(p), fstype: cstr("tmpfs"),
				flags: unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, data: cstr("size=4k,nr_inodes=1,mode=0555")}, "mask "+p)
		default:
			t.late(op{src: cstr("/dev/null"), path: cstr(p), flags: unix.MS_BIND}, "mask "+p)
		}
	}
	for _, p := range procReadOnly {
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		t.late(op{src: cstr(p), path: cstr(p), flags: unix.MS_BIND | unix.MS_REC}, "bind "+p)
		t.late(op{path: cstr(p), flags: unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
			"remount "+p+" read-only")
	}
}
