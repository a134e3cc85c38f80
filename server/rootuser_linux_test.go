package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-dev/airlock/client"
	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/probe/probebuild"
)

// TestImageRootUserAPI: "user": "root" through the API makes an image
// sandbox's commands uid 0 of its own user namespace with the root
// capabilities there (chown works; without it, it does not), and the
// hostile probe, uploaded and run as that root, finds every dangerous call
// refused, including becoming the agent's uid (seccomp, since root has
// CAP_SETUID). The agent stays out of reach (signals to PID 1 change
// nothing; the next exec works), and on the host the sandbox's files
// belong to its range, never to root. "root" without an image, and any
// other user, are 400s.
func TestImageRootUserAPI(t *testing.T) {
	needRoot(t)
	reg := it.Registry(t)
	ref := it.Push(t, reg, "api/busybox:root", it.Busybox(t))
	state := stateDir(t)
	s := startServer(t, state, "--image-registry", reg)
	key := newKey(t, state, "root-user")
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	if code, v := post(t, s.URL+"/v1/images", key, `{"ref":"`+ref+`"}`); code != 200 {
		t.Fatalf("pull: %d %v", code, v)
	}
	for _, body := range []string{`{"user":"root"}`, `{"image":"` + ref + `","user":"admin"}`} {
		if code, v := post(t, s.URL+"/v1/sandboxes", key, body); code != 400 || !strings.Contains(fmt.Sprint(v), "user") {
			t.Errorf("create %s: %d %v, want 400 naming the user", body, code, v)
		}
	}
	chown := "mkdir -p /opt/pkg && echo x > /opt/pkg/f && chown 1234:1234 /opt/pkg/f && stat -c %u:%g /opt/pkg/f"
	plain, err := c.Create(ctx, client.CreateRequest{Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := c.Exec(ctx, plain.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", chown}}); err != nil || res.ExitCode == 0 {
		t.Fatalf("chown worked without user root: %+v %v", res, err)
	}
	sb, err := c.Create(ctx, client.CreateRequest{Image: ref, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", chown + "; id -u; grep CapEff /proc/self/status"}})
	if err != nil || res.ExitCode != 0 || res.Stdout != "1234:1234\n0\nCapEff:\t00000000000004cf\n" {
		t.Fatalf("as root: %+v %v", res, err)
	}
	bin, err := os.ReadFile(probebuild.Build(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/tmp/probe", bytes.NewReader(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/tmp/probe"}, Env: map[string]string{"AIRLOCK_PROBE_PTRACE_PID": "1"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("probe: %+v %v", res, err)
	}
	got := map[string]string{}
	if err := json.Unmarshal([]byte(res.Stdout), &got); err != nil {
		t.Fatalf("probe output %q: %v", res.Stdout, err)
	}
	for k, v := range map[string]string{
		"uid": "0", "cap_eff": "00000000000004cf", "no_new_privs": "1", "seccomp_mode": "2",
		"setuid_agent": "denied:EPERM", "setresuid_agent": "denied:EPERM",
		"mount": "denied:EPERM", "unshare_user": "denied:EPERM", "unshare_ns": "denied:EPERM", "setns": "denied:EPERM",
		"chroot": "denied:EPERM", "pivot_root": "denied:EPERM", "ptrace_attach_1": "denied:EPERM", "bpf": "denied:EPERM",
		"open_by_handle_at": "denied:EPERM", "fsopen": "denied:ENOSYS", "kcmp": "denied:EPERM", "pidfd_getfd": "denied:EPERM",
	} {
		if got[k] != v {
			t.Errorf("probe as root: %s = %q, want %q", k, got[k], v)
		}
	}
	// setgroups takes any group for a root workload (apt's switch to
	// _apt needs it) and seccomp cannot read its list: the agent holds no
	// group the workload does not hold already, so there is none of its
	// to take.
	if got["setgroups_nogroup"] != "allowed" {
		t.Errorf("probe as root: setgroups([65534]) (apt's) = %q, want allowed", got["setgroups_nogroup"])
	}
	for _, g := range append(strings.Fields(got["init_gid"]), strings.Fields(got["init_groups"])...) {
		if g != got["gid"] {
			t.Errorf("the agent holds group %s, which the root workload (gid %s) could add with setgroups: agent Gid %q Groups %q",
				g, got["gid"], got["init_gid"], got["init_groups"])
		}
	}
	if got["init_gid"] == "" {
		t.Errorf("probe: no Gid of PID 1: %v", got)
	}
	// Signals to the agent (PID 1) from root: no CAP_KILL, another uid.
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "kill -9 1; kill -SEGV 1; kill -STOP 1; echo sent"}})
	if err != nil || !strings.Contains(res.Stdout, "sent") {
		t.Fatalf("kill: %+v %v", res, err)
	}
	res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo agent-alive"}})
	if err != nil || res.Stdout != "agent-alive\n" {
		t.Fatalf("the agent did not survive root's signals: %+v %v", res, err)
	}
	// Host side: the upper directory's files are in the sandbox's range.
	upper := filepath.Join(state, "sandboxes", sb.ID, "root", "disk", "upper")
	for _, rel := range []string{"opt/pkg", "opt/pkg/f", "tmp"} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(upper, rel), &st); err != nil {
			if rel == "tmp" {
				continue // /tmp is a tmpfs of the sandbox, not the upper directory
			}
			t.Fatal(err)
		}
		if st.Uid == 0 || st.Gid == 0 {
			t.Errorf("host: %s owned by %d:%d (host root)", rel, st.Uid, st.Gid)
		}
	}
	for _, id := range []string{sb.ID, plain.ID} {
		if err := c.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}
