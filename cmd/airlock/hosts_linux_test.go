package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The hosts users have that forbid what airlock needs (issue 31): airlock
// must not start sandboxes that silently lack a layer there, and must say
// what forbids it and the fix. Each case runs the real binary in that
// situation: as a non-root user, inside a user namespace of its own, and in
// a container made by runc (Docker's own runtime) with Docker's default seccomp profile and
// capabilities.

type hostRun struct {
	out      string
	exitCode int
}

func runIn(t *testing.T, cmd *exec.Cmd) hostRun {
	t.Helper()
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, buf.String())
	}
	return hostRun{buf.String(), code}
}

func needRootHere(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make the hosts (setuid, unshare, runc)")
	}
}

// TestHostNonRoot: as a non-root user the sandboxes get no cgroups: doctor
// says so with the fix and exits 1 (it said "ok" and exited 0), and run
// warns with the fix.
func TestHostNonRoot(t *testing.T) {
	needRootHere(t)
	cred := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	tmp, err := os.MkdirTemp("", "airlock-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o777); err != nil {
		t.Fatal(err)
	}
	// The test binary's directory is root's alone: a copy the user can run.
	b, err := os.ReadFile(airlockBin(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(tmp, "airlock")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + tmp, "TMPDIR=" + tmp, "AIRLOCK_WASM_CACHE=" + filepath.Join(tmp, "wasm")}

	doc := exec.Command(bin, "doctor")
	doc.SysProcAttr, doc.Env, doc.Dir = cred, env, tmp
	r := runIn(t, doc)
	if r.exitCode != exitDoctorFail || !strings.Contains(r.out, "strict profile: CANNOT") {
		t.Fatalf("non-root doctor exited %d, want %d (cgroups cannot be created):\n%s", r.exitCode, exitDoctorFail, r.out)
	}
	if !strings.Contains(r.out, "cgroup        missing") || !strings.Contains(r.out, "fix: run airlock as root") {
		t.Fatalf("non-root doctor does not name the cgroup problem and its fix:\n%s", r.out)
	}

	run := exec.Command(bin, "run", "--", "/bin/echo", "hi")
	run.SysProcAttr, run.Env, run.Dir = cred, env, tmp
	r = runIn(t, run)
	if r.exitCode != 0 || !strings.Contains(r.out, "hi") || !strings.Contains(r.out, "WARNING: cgroup missing") || !strings.Contains(r.out, "airlock: fix: run airlock as root") {
		t.Fatalf("non-root run (exit %d) does not warn with the fix:\n%s", r.exitCode, r.out)
	}
}

// TestHostNestedUserNamespace: inside a user namespace with one id mapped
// (`unshare -Ur`, as in rootless containers), run fails and says why.
func TestHostNestedUserNamespace(t *testing.T) {
	needRootHere(t)
	bin := airlockBin(t)
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatal("unshare (util-linux) is needed")
	}
	r := runIn(t, exec.Command(unshare, "-Ur", bin, "run", "--", "/bin/true"))
	if r.exitCode == 0 {
		t.Fatalf("run in a nested user namespace succeeded:\n%s", r.out)
	}
	for _, want := range []string{"this host forbids what airlock needs", "inside a user namespace (uid_map \"0 0 1\")", "fix: run airlock without a user namespace"} {
		if !strings.Contains(r.out, want) {
			t.Fatalf("run in a nested user namespace: no %q in:\n%s", want, r.out)
		}
	}
	r = runIn(t, exec.Command(unshare, "-Ur", bin, "doctor"))
	if r.exitCode != exitDoctorFail || !strings.Contains(r.out, "host          missing   airlock runs inside a user namespace") {
		t.Fatalf("doctor in a nested user namespace (exit %d):\n%s", r.exitCode, r.out)
	}
}

// TestHostDockerDefaultProfile: in a container with Docker's default
// seccomp profile and capabilities (made here with runc), doctor and run
// fail, naming the seccomp filter, the missing CAP_SYS_ADMIN and Docker's
// flags that fix it.
func TestHostDockerDefaultProfile(t *testing.T) {
	needRootHere(t)
	bin := airlockBin(t)
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Fatal("runc is needed (scripts/setup.sh installs it)")
	}
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	for _, d := range []string{"usr", "bin", "sbin", "lib", "lib64", "etc", "proc", "dev", "sys", "tmp", "opt", "run", "var"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(rootfs, ".dockerenv"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "opt", "airlock"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	// Docker's default capabilities (moby's oci/caps/defaults.go).
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
		"CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}
	ro := func(src, dst string) specs.Mount {
		return specs.Mount{Destination: dst, Source: src, Type: "bind", Options: []string{"rbind", "ro"}}
	}
	spec := &specs.Spec{
		Version: "1.0.2", // what Debian 12's runc knows
		Root:    &specs.Root{Path: "rootfs", Readonly: true},
		Process: &specs.Process{
			Args:            []string{"/opt/airlock", "doctor"},
			Env:             []string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/tmp", "TMPDIR=/tmp"},
			Cwd:             "/tmp",
			Capabilities:    &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			NoNewPrivileges: false,
		},
		Hostname: "docker-like",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "size=1g"}},
			// A container's root is writable: airlock gets as far as creating
			// the sandbox, and fails there for the profile's reasons.
			{Destination: "/run", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "size=64m"}},
			{Destination: "/var", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "size=64m"}},
			ro("/usr", "/usr"), ro("/bin", "/bin"), ro("/sbin", "/sbin"), ro("/lib", "/lib"), ro("/lib64", "/lib64"), ro("/etc", "/etc"),
			ro(bin, "/opt/airlock"),
		},
		Linux: &specs.Linux{
			Namespaces:    []specs.LinuxNamespace{{Type: "pid"}, {Type: "mount"}, {Type: "ipc"}, {Type: "uts"}, {Type: "network"}, {Type: "cgroup"}},
			MaskedPaths:   []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
	sc, err := seccomp.GetDefaultProfile(spec)
	if err != nil {
		t.Fatalf("Docker's default seccomp profile: %v", err)
	}
	spec.Linux.Seccomp = sc
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	id := "airlock-hosttest-" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
	t.Cleanup(func() { exec.Command(runc, "delete", "-f", id).Run() })
	r := runIn(t, exec.Command(runc, "run", "--bundle", bundle, id))
	t.Logf("doctor in a Docker-like container:\n%s", r.out)
	if r.exitCode != exitDoctorFail || !strings.Contains(r.out, "strict profile: CANNOT") {
		t.Fatalf("doctor in a Docker-like container exited %d, want %d:\n%s", r.exitCode, exitDoctorFail, r.out)
	}
	for _, want := range []string{"sandbox       missing   cannot start a strict sandbox", "runs under a seccomp filter (this docker container's profile", "without CAP_SYS_ADMIN", "parts of /proc are masked (/proc/", "--security-opt seccomp=unconfined"} {
		if !strings.Contains(r.out, want) {
			t.Fatalf("doctor in a Docker-like container: no %q in:\n%s", want, r.out)
		}
	}

	// The fix it names works: the same container without the seccomp
	// profile, with CAP_SYS_ADMIN, an unmasked /proc and the host's cgroups
	// (`--security-opt seccomp=unconfined --security-opt systempaths=unconfined
	// --cap-add SYS_ADMIN --cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:rw`)
	// runs a strict sandbox.
	spec.Linux.Seccomp = nil
	spec.Linux.MaskedPaths, spec.Linux.ReadonlyPaths = nil, nil
	spec.Process.Capabilities.Bounding = append(caps, "CAP_SYS_ADMIN")
	spec.Process.Capabilities.Effective = spec.Process.Capabilities.Bounding
	spec.Process.Capabilities.Permitted = spec.Process.Capabilities.Bounding
	spec.Linux.Namespaces = spec.Linux.Namespaces[:len(spec.Linux.Namespaces)-1] // the host's cgroup namespace
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/sys/fs/cgroup", Source: "/sys/fs/cgroup", Type: "bind", Options: []string{"rbind", "rw"}})
	if b, err = json.Marshal(spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	exec.Command(runc, "delete", "-f", id).Run()
	r = runIn(t, exec.Command(runc, "run", "--bundle", bundle, id))
	if r.exitCode != 0 || !strings.Contains(r.out, "strict profile: can be honoured") {
		t.Fatalf("doctor in the container with the fix applied exited %d:\n%s", r.exitCode, r.out)
	}
}
