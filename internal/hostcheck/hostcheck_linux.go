package hostcheck

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Paths Diagnose reads; tests point them elsewhere.
var (
	procRoot = "/proc"
	rootFS   = "/"
	getenv   = os.Getenv
	geteuid  = os.Geteuid
)

// Diagnose returns what on this host forbids airlock's sandboxes, with
// fixes. An empty result does not promise that sandboxes start (airlock
// doctor tries); it means none of the known obstacles is present.
func Diagnose() []Finding {
	var out []Finding
	kind := ContainerKind()
	ctrFix := containerFix(kind)
	where := "this host"
	if kind != "" {
		where = "this " + kind + " container"
	}
	root := geteuid() == 0

	if mode := statusField("Seccomp"); mode == "2" {
		fix := ctrFix
		if fix == "" {
			fix = "start airlock from a process without a seccomp filter (check the service manager or wrapper that launches it: systemd's SystemCallFilter=, a container runtime)"
		}
		out = append(out, Finding{
			Problem: fmt.Sprintf("airlock itself runs under a seccomp filter (%s's profile: Docker's and Podman's default profiles refuse the clone, unshare and mount calls that create a sandbox)", where),
			Fix:     fix,
		})
	}
	if prof := appArmorProfile(); prof != "" && prof != "unconfined" && !strings.HasPrefix(prof, "airlock") {
		fix := ctrFix
		if fix == "" {
			fix = fmt.Sprintf("run airlock unconfined or under a profile that allows `userns,` and `mount,` (for example `aa-exec -p unconfined -- airlock ...`); the profile now is %q", prof)
		}
		out = append(out, Finding{
			Problem: fmt.Sprintf("AppArmor confines airlock with profile %q (docker-default and containers-default deny mount, which every sandbox needs)", prof),
			Fix:     fix,
		})
	}
	if m, nested := uidMap(); nested {
		fix := "run airlock without a user namespace of its own around it (not under `unshare -U`, rootless Podman, Docker's userns-remap or another user-namespaced container): as root in the host's namespace it maps each sandbox to a host id range of its own"
		if kind == Podman || kind == OtherCtr {
			fix += "; for this container: " + ctrFix
		}
		out = append(out, Finding{
			Problem: fmt.Sprintf("airlock runs inside a user namespace (uid_map %q): it can map at most those ids into sandboxes, and without root in the host's namespace it cannot create their cgroups", m),
			Fix:     fix,
		})
	}
	if masked := procMasks(); len(masked) > 0 {
		fix := ctrFix
		if fix == "" {
			fix = "unmount what covers parts of /proc (" + strings.Join(masked, ", ") + ")"
		}
		out = append(out, Finding{
			Problem: fmt.Sprintf("parts of /proc are masked (%s, as a container runtime's maskedPaths/readonlyPaths do): the kernel then refuses each sandbox its own /proc", strings.Join(masked, ", ")),
			Fix:     fix,
		})
	}
	if root && !hasCap(21) { // CAP_SYS_ADMIN
		fix := ctrFix
		if fix == "" {
			fix = "give airlock CAP_SYS_ADMIN (it drops every capability inside its sandboxes)"
		}
		out = append(out, Finding{
			Problem: fmt.Sprintf("airlock runs as root without CAP_SYS_ADMIN (%s's default capabilities): it cannot mount a sandbox's root or create its cgroups", where),
			Fix:     fix,
		})
	}
	if v, ok := sysctl("user/max_user_namespaces"); ok && v == "0" {
		out = append(out, Finding{
			Problem: "user namespaces are disabled (user.max_user_namespaces = 0)",
			Fix:     "sysctl -w user.max_user_namespaces=15000 (persist it in /etc/sysctl.d/90-airlock.conf)",
		})
	}
	if !root {
		if v, ok := sysctl("kernel/unprivileged_userns_clone"); ok && v == "0" {
			out = append(out, Finding{
				Problem: "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)",
				Fix:     "sysctl -w kernel.unprivileged_userns_clone=1 (persist it in /etc/sysctl.d/90-airlock.conf), or run airlock as root",
			})
		}
		if v, ok := sysctl("kernel/apparmor_restrict_unprivileged_userns"); ok && v == "1" {
			exe, err := os.Executable()
			if err != nil {
				exe = "/usr/local/bin/airlock"
			}
			out = append(out, Finding{
				Problem: "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1, Ubuntu 23.10 and later): a non-root airlock cannot create its sandboxes' namespaces",
				Fix: fmt.Sprintf("run airlock as root, or allow it user namespaces with an AppArmor profile: write /etc/apparmor.d/airlock containing "+
					"`abi <abi/4.0>, include <tunables/global> profile airlock %s flags=(unconfined) { userns, }` and run `apparmor_parser -r /etc/apparmor.d/airlock` "+
					"(or, for the whole host, sysctl -w kernel.apparmor_restrict_unprivileged_userns=0)", exe),
			})
		}
	}
	return out
}

// ContainerKind names the container runtime airlock runs in ("" for none
// it recognises).
func ContainerKind() string {
	switch {
	case getenv("KUBERNETES_SERVICE_HOST") != "" || exists(rootFS+"var/run/secrets/kubernetes.io"):
		return Kubernetes
	case exists(rootFS+"run/.containerenv") || getenv("container") == "podman":
		return Podman
	case exists(rootFS + ".dockerenv"):
		return Docker
	case getenv("container") != "":
		return OtherCtr
	}
	return ""
}

// CgroupFix is the fix for a non-root airlock that cannot create cgroups.
func CgroupFix() string {
	if geteuid() == 0 {
		if fix := containerFix(ContainerKind()); fix != "" {
			return fix
		}
		return "mount the cgroup hierarchy read-write (cgroup v2 at /sys/fs/cgroup, or v1 with the memory, pids and cpu controllers)"
	}
	return "run airlock as root (sudo), or give it a delegated cgroup v2 subtree: `systemd-run --user --scope -p Delegate=yes airlock ...` on a pure cgroup v2 host"
}

// procMasks lists what is mounted over parts of /proc: a new proc mount
// in a user namespace is refused unless an existing one is fully visible
// (binfmt_misc, over an empty directory, does not count).
func procMasks() []string {
	b, err := os.ReadFile(procRoot + "/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := f[4]
		if strings.HasPrefix(mp, "/proc/") && mp != "/proc/sys/fs/binfmt_misc" {
			out = append(out, mp)
		}
	}
	if len(out) > 4 {
		out = append(out[:4], "...")
	}
	return out
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// statusField returns a field of /proc/self/status.
func statusField(name string) string {
	b, err := os.ReadFile(procRoot + "/self/status")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// hasCap reports whether the effective set holds capability n.
func hasCap(n uint) bool {
	v, err := strconv.ParseUint(statusField("CapEff"), 16, 64)
	return err == nil && v&(1<<n) != 0
}

// appArmorProfile is the AppArmor label of this process ("" without
// AppArmor).
func appArmorProfile() string {
	for _, p := range []string{"/self/attr/apparmor/current", "/self/attr/current"} {
		b, err := os.ReadFile(procRoot + p)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(strings.TrimRight(string(b), "\x00"))
		if s == "" {
			continue
		}
		// "docker-default (enforce)"
		if i := strings.Index(s, " ("); i > 0 {
			if strings.Contains(s[i:], "complain") || strings.Contains(s[i:], "unconfined") {
				return "unconfined"
			}
			s = s[:i]
		}
		return s
	}
	return ""
}

// uidMap returns /proc/self/uid_map and whether it is a nested user
// namespace's (anything but the initial namespace's full identity map).
func uidMap() (string, bool) {
	b, err := os.ReadFile(procRoot + "/self/uid_map")
	if err != nil {
		return "", false
	}
	f := strings.Fields(string(b))
	m := strings.Join(f, " ")
	return m, !(len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295")
}

func sysctl(name string) (string, bool) {
	b, err := os.ReadFile(procRoot + "/sys/" + name)
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}
