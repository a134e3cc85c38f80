package microvm

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cavaliergopher/cpio"
)

// CacheDir is where built guest initramfs images are kept, one per
// content key (kernel, agent binary, init script).
var CacheDir = "/var/cache/airlock/microvm"

// ensureCacheDir makes CacheDir, readable by QEMU's unprivileged uid
// (also when an older airlock made it 0700).
func ensureCacheDir() error {
	if err := os.MkdirAll(CacheDir, 0o755); err != nil {
		return fmt.Errorf("microvm: cache dir: %w", err)
	}
	if err := os.Chmod(CacheDir, 0o755); err != nil {
		return fmt.Errorf("microvm: cache dir: %w", err)
	}
	return nil
}

// cached reports whether path exists, and makes it readable by QEMU's
// unprivileged uid (an older airlock wrote it 0600). A hit marks the file
// used now (pruneCache).
func cached(path string) bool {
	if _, err := os.Stat(path); err != nil {
		return false
	}
	now := time.Now()
	os.Chtimes(path, now, now)
	return os.Chmod(path, 0o644) == nil
}

// cacheMaxIdle is how long a cached image nobody used stays.
const cacheMaxIdle = 7 * 24 * time.Hour

// pruneCache removes the cached files matching pattern (a glob in
// CacheDir) that were not used for cacheMaxIdle: each initramfs holds one
// agent build and each root image one image's layers, so they would pile
// up. A running VM keeps what it opened; a later start rebuilds a pruned
// one.
func pruneCache(pattern string) {
	m, _ := filepath.Glob(filepath.Join(CacheDir, pattern))
	for _, f := range m {
		if fi, err := os.Stat(f); err == nil && time.Since(fi.ModTime()) > cacheMaxIdle {
			os.Remove(f)
		}
	}
}

// busyboxPath is the static busybox the guest's userland comes from
// (Debian's busybox-static).
var busyboxPath = "/bin/busybox"

// guestModules are the kernel modules the guest needs when the kernel
// has them as modules: virtio over MMIO (the microvm machine's bus),
// virtio-console (the agent's virtio-serial port), virtio-blk and EROFS
// (the read-only /usr image, UsrImage, and image roots, RootImage) and
// overlayfs (an image root's writable overlay), and pvpanic (the ACPI
// QEMU0001 device through which a kernel panic ends QEMU at once) and
// virtio-fs (volumes). Their dependencies are
// added from modules.dep.
var guestModules = []string{"virtio_mmio", "virtio_console", "virtio_blk", "erofs", "overlay", "pvpanic-mmio", "virtiofs"}

// guestApplets are the busybox applets linked into the guest's /bin: the
// workload's shell and the usual tools (/usr is the EROFS image: python3).
var guestApplets = []string{"sh", "ash", "cat", "echo", "ls", "mkdir", "mount", "insmod", "rm", "cp", "mv",
	"sleep", "ps", "kill", "id", "env", "grep", "sed", "awk", "head", "tail", "wc", "true", "false", "test",
	"printf", "chmod", "touch", "uname", "stty", "tty", "reboot", "poweroff", "dd", "find", "sort", "tr", "cut", "date",
	"stat", "readlink", "basename", "dirname", "pwd", "which", "xargs", "tee", "yes", "seq", "md5sum", "sha256sum"}

// initScript is the guest's /init: it mounts the pseudo filesystems and
// the workload's tmpfs directories, loads the modules in dependency order
// (/.airlock/modules.order), finds the virtio-serial port named
// airlock.agent and execs the agent on it as PID 1, with the arguments
// the kernel passes after "--". Any failure powers the guest off, which
// ends QEMU. AIRLOCK_USER (UID:GID) owns /workspace; AIRLOCK_TMPFS is
// the tmpfs size in bytes. Disks are found by their serial numbers, never
// by their order: airlock-usr is the host's /usr image; with
// AIRLOCK_ROOT=image, airlock-lower is the image's read-only EROFS root
// and airlock-upper the sandbox's empty ext4 upper disk: the root becomes
// their overlay (nosuid, nodev), with /workspace on the upper disk, and
// the agent (the initramfs's /.airlock, bound read-only) runs in it.
// With AIRLOCK_FILES, the disk airlock-files is a newc archive
// (filesArchive) of the policy's environment (the agent's --env-file) and
// of the files it places (read-only host files, e.g. the egress CA's trust
// store), copied over the root before it turns read-only. With
// AIRLOCK_EGRESS, the agent also gets the port airlock.egress, which
// carries its loopback listeners' connections to the host's proxy.
// AIRLOCK_VOLUMES (TAG:TARGET,...) are virtio-fs shares mounted at their
// targets (nosuid, nodev).
const initScript = `#!/.airlock/busybox sh
B=/.airlock/busybox
die() { echo "airlock init: $*" >&2; $B poweroff -f; $B sleep 5; exit 1; }
$B mount -t proc -o nosuid,nodev,noexec proc /proc || die proc
$B mount -t sysfs -o nosuid,nodev,noexec sys /sys || die sysfs
$B mount -t devtmpfs -o nosuid,noexec dev /dev || die devtmpfs
$B mkdir -p /dev/pts /dev/shm
$B mount -t devpts -o nosuid,noexec devpts /dev/pts || die devpts
$B mount -t tmpfs -o nosuid,nodev,size=$AIRLOCK_TMPFS tmpfs /dev/shm || die shm
for m in $($B cat /.airlock/modules.order); do
	$B insmod /.airlock/modules/$m || die "insmod $m"
done
# vport NAME [TRIES]: the device of the virtio-serial port named NAME.
vport() {
	i=0
	while [ $i -lt ${2:-300} ]; do
		for p in /sys/class/virtio-ports/*; do
			if [ "$($B cat $p/name 2>/dev/null)" = "$1" ] && [ -c /dev/${p##*/} ]; then
				echo /dev/${p##*/}
				return 0
			fi
		done
		i=$((i+1))
		$B usleep 20000
	done
	return 1
}
port=$(vport airlock.agent) || die "no airlock.agent port"
egress=
if [ -n "$AIRLOCK_EGRESS" ]; then
	egress=--egress=$(vport airlock.egress) || die "no airlock.egress port"
fi
$B ip link set lo up || die "loopback"
disk() {
	i=0
	while [ $i -lt 300 ]; do
		for b in /sys/block/vd*; do
			if [ "$($B cat $b/serial 2>/dev/null)" = "$1" ] && [ -b /dev/${b##*/} ]; then
				echo /dev/${b##*/}
				return 0
			fi
		done
		i=$((i+1))
		$B usleep 20000
	done
	return 1
}
files=
envarg=
if [ -n "$AIRLOCK_FILES" ]; then
	files=$(disk airlock-files) || die "no files disk"
	$B mkdir -m 0700 /.airlock/files || die "mkdir files"
	(cd /.airlock/files && $B cpio -i -d -m < $files) 2>/dev/null || die "unpack the files"
	[ -f /.airlock/files/env ] && envarg=--env-file=/.airlock/files/env
	[ -d /.airlock/files/root ] || files=
fi
# volumes: mount AIRLOCK_VOLUMES (TAG:TARGET,...) over virtio-fs under $R.
volumes() {
	for v in $(echo "$AIRLOCK_VOLUMES" | $B tr , ' '); do
		t=${v#*:}
		$B mkdir -p $R$t || die "mkdir $t"
		$B mount -t virtiofs -o nosuid,nodev ${v%%:*} $R$t || die "mount volume $t"
	done
}
R=/
if [ "$AIRLOCK_ROOT" = image ]; then
	lower=$(disk airlock-lower) || die "no root image disk"
	upper=$(disk airlock-upper) || die "no upper disk"
	$B mkdir -p /.airlock/lower /.airlock/upper /.airlock/root || die mkdir
	$B mount -t erofs -o ro,nodev,nosuid $lower /.airlock/lower || die "mount the root image"
	$B mount -t ext4 -o nodev,nosuid $upper /.airlock/upper || die "mount the upper disk"
	$B mkdir -p /.airlock/upper/upper /.airlock/upper/work || die mkdir
	$B mount -t overlay -o nodev,nosuid,lowerdir=/.airlock/lower,upperdir=/.airlock/upper/upper,workdir=/.airlock/upper/work overlay /.airlock/root || die "mount the root overlay"
	R=/.airlock/root
	for d in proc sys dev tmp workspace .airlock; do
		[ -d $R/$d ] && [ ! -L $R/$d ] || { $B rm -f $R/$d; $B mkdir -p $R/$d; } || die "mkdir $d"
	done
	$B mount -t tmpfs -o nosuid,nodev,mode=1777,size=$AIRLOCK_TMPFS tmpfs $R/tmp || die tmp
	$B chown "$AIRLOCK_USER" $R/workspace || die chown
	$B mount --bind /.airlock $R/.airlock || die "bind the agent"
	$B mount -o remount,bind,ro $R/.airlock || die "bind the agent read-only"
	volumes
	[ -z "$files" ] || $B cp -R /.airlock/files/root/. $R/ || die "copy the files in"
	$B mount -o remount,ro / || die "remount / read-only"
	for d in proc sys dev; do $B mount --move /$d $R/$d || die "move $d"; done
else
	usr=$(disk airlock-usr) || die "no /usr disk"
	$B mount -t tmpfs -o nosuid,nodev,mode=1777,size=$AIRLOCK_TMPFS tmpfs /tmp || die tmp
	$B mount -t tmpfs -o nosuid,nodev,mode=0755,size=$AIRLOCK_TMPFS tmpfs /workspace || die workspace
	$B chown "$AIRLOCK_USER" /workspace || die chown
	$B mount -t erofs -o ro,nodev,nosuid $usr /usr || die "mount /usr"
	[ -z "$files" ] || $B cp -R /.airlock/files/root/. / || die "copy the files in"
	volumes
	$B mount -o remount,ro / || die "remount / read-only"
fi
unset AIRLOCK_USER AIRLOCK_TMPFS AIRLOCK_ROOT AIRLOCK_EGRESS AIRLOCK_FILES AIRLOCK_VOLUMES
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/workspace
if [ $R != / ]; then
	cd $R || die "cd root"
	$B mount --move . / || die "move the root"
	exec $B chroot . /.airlock/airlock "$@" --serial=$port $egress $envarg
fi
cd /workspace
exec /.airlock/airlock "$@" --serial=$port $egress $envarg
`

// Initramfs returns the path of the guest initramfs for kernel and the
// agent binary, building it at first use. It is cached by content: the
// kernel's path, the agent binary's SHA-256 and the init script.
func Initramfs(kernel, agentBinary string) (string, error) {
	agentBytes, err := os.ReadFile(agentBinary)
	if err != nil {
		return "", fmt.Errorf("microvm: agent binary: %w", err)
	}
	path := initramfsPath(kernel, agentBytes)
	if err := ensureCacheDir(); err != nil {
		return "", err
	}
	if cached(path) {
		return path, nil
	}
	mods, err := moduleFiles(kernel)
	if err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(CacheDir, ".initramfs-*")
	if err != nil {
		return "", fmt.Errorf("microvm: %w", err)
	}
	defer os.Remove(tmp.Name())
	bw := bufio.NewWriter(tmp)
	if err := writeInitramfs(bw, agentBytes, mods); err != nil {
		tmp.Close()
		return "", err
	}
	if err := bw.Flush(); err != nil {
		tmp.Close()
		return "", fmt.Errorf("microvm: write initramfs: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("microvm: write initramfs: %w", err)
	}
	// QEMU runs unprivileged and opens it; nothing in it is secret.
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return "", fmt.Errorf("microvm: initramfs: %w", err)
	}
	// A concurrent builder writes the same content: the last rename wins.
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("microvm: initramfs: %w", err)
	}
	pruneCache("initramfs-*.cpio")
	return path, nil
}

// initramfsPath is where the initramfs of kernel and agent is cached.
func initramfsPath(kernel string, agentBytes []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "kernel %s\n", kernel)
	ah := sha256.Sum256(agentBytes)
	fmt.Fprintf(h, "agent %x\ninit %s\napplets %q\n", ah, initScript, guestApplets)
	return filepath.Join(CacheDir, "initramfs-"+hex.EncodeToString(h.Sum(nil))[:24]+".cpio")
}

// module is one kernel module file for the guest.
type module struct{ name, path string }

// moduleFiles lists guestModules and their dependencies, dependencies
// first, from the kernel's modules.dep; a module built into the kernel
// (absent from modules.dep) needs nothing.
func moduleFiles(kernel string) ([]module, error) {
	return modulesOf(kernel, guestModules)
}

// modulesOf is moduleFiles for the modules named.
func modulesOf(kernel string, names []string) ([]module, error) {
	ver, ok := strings.CutPrefix(filepath.Base(kernel), "vmlinuz-")
	if !ok {
		return nil, fmt.Errorf("microvm: kernel %s: want a /boot/vmlinuz-VERSION", kernel)
	}
	dir := filepath.Join("/lib/modules", ver)
	b, err := os.ReadFile(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("microvm: kernel %s: %w (install its modules)", ver, err)
	}
	deps := map[string][]string{} // module name -> its file, then its dependencies' files
	for _, line := range strings.Split(string(b), "\n") {
		file, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		name := strings.TrimSuffix(filepath.Base(file), ".ko")
		deps[name] = append([]string{file}, strings.Fields(rest)...)
	}
	var out []module
	seen := map[string]bool{}
	var add func(file string)
	add = func(file string) {
		if seen[file] {
			return
		}
		seen[file] = true
		name := strings.TrimSuffix(filepath.Base(file), ".ko")
		for _, d := range deps[name][1:] {
			add(d)
		}
		out = append(out, module{name: filepath.Base(file), path: filepath.Join(dir, file)})
	}
	for _, m := range names {
		if d, ok := deps[m]; ok {
			if strings.HasSuffix(d[0], ".ko.xz") || strings.HasSuffix(d[0], ".ko.zst") || strings.HasSuffix(d[0], ".ko.gz") {
				return nil, fmt.Errorf("microvm: module %s is compressed; busybox insmod wants plain .ko", d[0])
			}
			add(d[0])
		}
	}
	return out, nil
}

// writeInitramfs writes the newc archive: busybox and its applet links,
// the modules, the agent at /.airlock/airlock, /init, and the mount points.
func writeInitramfs(w io.Writer, agentBytes []byte, mods []module) error {
	cw := cpio.NewWriter(w)
	dir := func(name string, mode cpio.FileMode) error {
		return cw.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeDir | mode})
	}
	file := func(name string, mode cpio.FileMode, data []byte) error {
		if err := cw.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeReg | mode, Size: int64(len(data))}); err != nil {
			return err
		}
		_, err := cw.Write(data)
		return err
	}
	link := func(name, target string) error {
		if err := cw.WriteHeader(&cpio.Header{Name: name, Mode: cpio.TypeSymlink | 0o777, Size: int64(len(target))}); err != nil {
			return err
		}
		_, err := cw.Write([]byte(target))
		return err
	}
	bb, err := os.ReadFile(busyboxPath)
	if err != nil {
		return fmt.Errorf("microvm: busybox: %w (install busybox-static)", err)
	}
	if !bytes.HasPrefix(bb, []byte("\x7fELF")) {
		return fmt.Errorf("microvm: %s is not an ELF binary", busyboxPath)
	}
	var order strings.Builder
	steps := []func() error{
		func() error { return dir(".airlock", 0o755) },
		func() error { return dir(".airlock/modules", 0o700) },
		func() error { return file(".airlock/busybox", 0o755, bb) },
		func() error { return file(".airlock/airlock", 0o755, agentBytes) },
		func() error { return file("init", 0o755, []byte(initScript)) },
		func() error { return dir("bin", 0o755) },
		func() error { return dir("usr", 0o755) },
		func() error { return link("lib", "usr/lib") },
		func() error { return link("lib64", "usr/lib64") },
		func() error { return dir("proc", 0o555) },
		func() error { return dir("sys", 0o555) },
		func() error { return dir("dev", 0o755) },
		func() error { return dir("tmp", 0o1777) },
		func() error { return dir("workspace", 0o755) },
		func() error { return dir("etc", 0o755) },
		func() error {
			return file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/workspace:/bin/sh\n"))
		},
		func() error { return file("etc/group", 0o644, []byte("root:x:0:\nuser:x:1000:\n")) },
		func() error { return link("bin/busybox", "/.airlock/busybox") },
	}
	for _, a := range guestApplets {
		steps = append(steps, func() error { return link("bin/"+a, "/.airlock/busybox") })
	}
	for _, m := range mods {
		steps = append(steps, func() error {
			b, err := os.ReadFile(m.path)
			if err != nil {
				return fmt.Errorf("microvm: module: %w", err)
			}
			order.WriteString(m.name + "\n")
			return file(".airlock/modules/"+m.name, 0o600, b)
		})
	}
	steps = append(steps, func() error { return file(".airlock/modules.order", 0o600, []byte(order.String())) })
	for _, s := range steps {
		if err := s(); err != nil {
			return fmt.Errorf("microvm: initramfs: %w", err)
		}
	}
	if err := cw.Close(); err != nil {
		return fmt.Errorf("microvm: initramfs: %w", err)
	}
	return nil
}
