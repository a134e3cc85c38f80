package native_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-dev/airlock/internal/probe/probebuild"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// rootCapHex is native.RootCaps as /proc/self/status prints it.
const rootCapHex = "00000000000004cf"

// TestImageRootUser: an image sandbox with user root is uid 0 of its own
// user namespace holding exactly RootCaps there: package-manager-style
// writes work (chown to other ids, files under /usr owned by the image's
// root, dpkg's status file), while on the host every file it made belongs
// to its range (never host root), and the hostile probe still finds every
// dangerous call refused (seccomp, no_new_privs, no mount, no namespace),
// run as that root. Without Root the same chown fails (the image's root
// has no capabilities), which is how the test fails before the feature.
func TestImageRootUser(t *testing.T) {
	_, img := busyboxImage(t)
	bin := probebuild.Build(t)
	for _, root := range []bool{true, false} {
		t.Run(map[bool]string{true: "root", false: "no-caps"}[root], func(t *testing.T) {
			rootDir := filepath.Join(t.TempDir(), "sb-root")
			p := strict(t)
			p.User.UID, p.User.GID, p.User.Name, p.User.Root = 0, 0, "root", root
			p.Env = []string{"PATH=/bin"}
			p.Filesystem.Mounts = append(p.Filesystem.Mounts, policy.Mount{Source: filepath.Dir(bin), Target: "/probe"})
			script := `mkdir -p /var/lib/dpkg/info /opt/pkg && echo 'Package: demo' > /var/lib/dpkg/status
echo data > /opt/pkg/owned && chown 1234:1234 /opt/pkg/owned && echo chown-ok
chown 0:0 /home/app && echo chown-home-ok
chmod 0700 /var/lib/dpkg/info && echo chmod-ok
stat -c '%u:%g' /opt/pkg/owned
/probe/` + filepath.Base(bin) + ` > /tmp/probe.json && echo probed
cat /tmp/probe.json
`
			res, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"/bin/sh", "-c", script},
				Image: &native.ImageRoot{Layers: img.LayerDirs(), Dir: rootDir}}, native.RunOptions{Capture: true})
			if err != nil {
				t.Fatal(err)
			}
			defer native.RemoveImageRoot(rootDir)
			lines := strings.SplitN(res.Stdout, "probed\n", 2)
			if !root {
				if strings.Contains(res.Stdout, "chown-ok") || strings.Contains(res.Stdout, "chown-home-ok") {
					t.Fatalf("chown worked without user root: %q", res.Stdout)
				}
				return
			}
			if len(lines) != 2 {
				t.Fatalf("script: %+v", res)
			}
			for _, w := range []string{"chown-ok", "chown-home-ok", "chmod-ok", "1234:1234"} {
				if !strings.Contains(lines[0], w) {
					t.Errorf("inside: %q missing from %q (stderr %q)", w, lines[0], res.Stderr)
				}
			}
			got := map[string]string{}
			if err := json.Unmarshal([]byte(lines[1]), &got); err != nil {
				t.Fatalf("probe output %q: %v", lines[1], err)
			}
			want := map[string]string{
				"uid": "0", "cap_eff": rootCapHex, "cap_amb": rootCapHex, "no_new_privs": "1", "seccomp_mode": "2",
				"mount": "denied:EPERM", "umount2": "denied:EPERM", "unshare_user": "denied:EPERM", "unshare_ns": "denied:EPERM",
				"clone_newns": "denied:EPERM", "pivot_root": "denied:EPERM", "chroot": "denied:EPERM", "setns": "denied:EPERM",
				"bpf": "denied:EPERM", "io_uring_setup": "denied:EPERM", "keyctl": "denied:EPERM", "open_by_handle_at": "denied:EPERM",
				"ptrace_attach_1": "denied:EPERM", "fsopen": "denied:ENOSYS", "open_tree": "denied:ENOSYS", "syslog": "denied:EPERM",
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("probe as root: %s = %q, want %q", k, got[k], v)
				}
			}
			// Host side: the upper directory holds the root's files under
			// the sandbox's host range, never host root.
			upper := (&native.ImageRoot{Dir: rootDir}).UpperDir()
			var base uint32
			for _, rel := range []string{"opt/pkg", "var/lib/dpkg/status", "opt/pkg/owned"} {
				var st syscall.Stat_t
				if err := syscall.Lstat(filepath.Join(upper, rel), &st); err != nil {
					t.Fatal(err)
				}
				if st.Uid == 0 || st.Gid == 0 {
					t.Errorf("host: %s owned by %d:%d: host root", rel, st.Uid, st.Gid)
				}
				if rel == "opt/pkg" {
					base = st.Uid
				} else if rel == "opt/pkg/owned" && (st.Uid != base+1234 || st.Gid != base+1234) {
					t.Errorf("host: %s owned by %d:%d, want the range's %d", rel, st.Uid, st.Gid, base+1234)
				}
			}
			if l, ok := res.Enforced.Get("capabilities"); !ok || !strings.Contains(l.Detail, "root of the sandbox's user namespace") {
				t.Errorf("capabilities layer: %+v", l)
			}
		})
	}
}

// TestRootUserNeedsImage: user root on the host-derived root is refused
// with the cause.
func TestRootUserNeedsImage(t *testing.T) {
	p := strict(t)
	p.User.UID, p.User.GID, p.User.Root = 0, 0, true
	_, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"true"}}, native.RunOptions{})
	if err == nil || !strings.Contains(err.Error(), "needs an image root") {
		t.Fatalf("user root without an image: %v", err)
	}
}
