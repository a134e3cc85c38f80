package microvm

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"strings"

	"github.com/cavaliergopher/cpio"
	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/policy"
)

// maxPlacedFile bounds one host file the policy places in a guest.
const maxPlacedFile = 8 << 20

// filesArchive returns, opened read-only, a newc archive of what the host
// gives the guest at boot besides its disks: "env", the policy's
// environment (NUL-separated KEY=VALUE, the agent's --env-file, from which
// every workload's environment starts, as a native sandbox's does), and
// under "root/" the host files the policy places: its mounts, which must
// be read-only regular files (the egress CA's trust store for credential
// injection, say), and, on the host-derived root, its /etc files that are
// regular files (a directory among them is left out, as a missing one
// is). The guest's /init unpacks it into /.airlock/files and copies root/
// over its root before the root turns read-only: copies, not binds, so
// nothing the guest does reaches the host's files. A mount the guest
// cannot honour this way (a directory, or writable) is refused, never
// dropped. The archive lives in a memfd: QEMU gets a descriptor, not a
// path.
func filesArchive(p policy.Policy, hostRoot bool) (*os.File, error) {
	type placed struct{ src, dst string }
	var list []placed
	if hostRoot {
		for _, f := range p.Filesystem.EtcFiles {
			if fi, err := os.Stat(f); err == nil && fi.Mode().IsRegular() && fi.Size() <= maxPlacedFile {
				list = append(list, placed{f, f})
			}
		}
	}
	for _, m := range p.Filesystem.Mounts {
		fi, err := os.Stat(m.Source)
		switch {
		case err != nil:
			return nil, fmt.Errorf("microvm: mount %s: %w", m.Source, err)
		case m.Writable || !fi.Mode().IsRegular():
			return nil, fmt.Errorf("microvm: mount %s at %s: a guest gets only read-only files (copied in at boot), not host directories or writable binds (the microvm runtime lacks the host_dirs capability; native and gvisor have it)", m.Source, m.Target)
		case fi.Size() > maxPlacedFile:
			return nil, fmt.Errorf("microvm: mount %s: larger than %d bytes", m.Source, maxPlacedFile)
		}
		list = append(list, placed{m.Source, m.Target})
	}
	// A later entry for a path replaces an earlier one (a mount over one
	// of the /etc files).
	last := map[string]int{}
	for i, f := range list {
		last[path.Clean("/"+f.dst)] = i
	}
	var buf bytes.Buffer
	w := cpio.NewWriter(&buf)
	var env bytes.Buffer
	for _, kv := range p.Env {
		if strings.ContainsRune(kv, 0) || !strings.Contains(kv, "=") {
			return nil, fmt.Errorf("microvm: environment entry %q", kv)
		}
		env.WriteString(kv)
		env.WriteByte(0)
	}
	if err := w.WriteHeader(&cpio.Header{Name: "env", Mode: cpio.TypeReg | 0o400, Size: int64(env.Len())}); err != nil {
		return nil, fmt.Errorf("microvm: files archive: %w", err)
	}
	if _, err := w.Write(env.Bytes()); err != nil {
		return nil, fmt.Errorf("microvm: files archive: %w", err)
	}
	for i, f := range list {
		dst := path.Clean("/" + f.dst)
		if last[dst] != i {
			continue
		}
		if dst == "/" || dst == "/.airlock" || strings.HasPrefix(dst, "/.airlock/") {
			return nil, fmt.Errorf("microvm: cannot place a file at %q", f.dst)
		}
		rel := "root" + dst
		b, err := os.ReadFile(f.src)
		if err != nil {
			return nil, fmt.Errorf("microvm: %w", err)
		}
		if len(b) > maxPlacedFile {
			return nil, fmt.Errorf("microvm: %s: larger than %d bytes", f.src, maxPlacedFile)
		}
		if err := w.WriteHeader(&cpio.Header{Name: rel, Mode: cpio.TypeReg | 0o444, Size: int64(len(b))}); err != nil {
			return nil, fmt.Errorf("microvm: files archive: %w", err)
		}
		if _, err := w.Write(b); err != nil {
			return nil, fmt.Errorf("microvm: files archive: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("microvm: files archive: %w", err)
	}
	if pad := buf.Len() % 512; pad != 0 { // whole sectors
		buf.Write(make([]byte, 512-pad))
	}
	fd, err := unix.MemfdCreate("airlock-files", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("microvm: files archive: %w", err)
	}
	mf := os.NewFile(uintptr(fd), "airlock-files")
	defer mf.Close()
	if _, err := mf.Write(buf.Bytes()); err != nil {
		return nil, fmt.Errorf("microvm: files archive: %w", err)
	}
	ro, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return nil, fmt.Errorf("microvm: files archive: %w", err)
	}
	return ro, nil
}
