package server_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/client"
)

// modifyLDTPy calls modify_ldt(0, buf, 16) (x86-64 syscall 154) and prints
// its result and errno.
const modifyLDTPy = `import ctypes
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(16)
r = libc.syscall(154, 0, buf, 16)
print(r, ctypes.get_errno())`

// TestLiveSandboxProcMasked (issue 20, finding 7) for live sandboxes:
// modify_ldt is denied, the host-revealing /proc entries read as empty and
// /proc/sys is mounted read-only (checked from the host), in every profile.
func TestLiveSandboxProcMasked(t *testing.T) {
	needRoot(t)
	var present []string
	for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/config.gz", "/proc/interrupts", "/proc/sched_debug"} {
		if _, err := os.Stat(p); err == nil {
			present = append(present, p)
		}
	}
	state := stateDir(t)
	key := newKey(t, state, "procmask")
	s := startServer(t, state)
	c := client.New(s.URL, key)
	ctx := ctxT(t)
	for _, prof := range []string{"strict", "standard", "light"} {
		t.Run(prof, func(t *testing.T) {
			sb, err := c.Create(ctx, client.CreateRequest{Profile: prof, Timeout: 120})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Kill(ctx, sb.ID)
			res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", modifyLDTPy}})
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(res.Stdout) != "-1 1" {
				t.Errorf("modify_ldt: %q %q, want -1 EPERM (1)", res.Stdout, res.Stderr)
			}
			for _, p := range present {
				res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "head -c 4096 " + p + " 2>/dev/null | wc -c"})
				if err != nil {
					t.Fatal(err)
				}
				if n := strings.TrimSpace(res.Stdout); n != "0" {
					t.Errorf("%s: read %s bytes of the host's %s", prof, n, p)
				}
			}
			mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", initPid(t, state, sb.ID)))
			if err != nil {
				t.Fatal(err)
			}
			ro := false
			for _, l := range strings.Split(string(mi), "\n") {
				if f := strings.Fields(l); len(f) > 5 && f[4] == "/proc/sys" {
					ro = strings.HasPrefix(f[5], "ro")
				}
			}
			if !ro {
				t.Errorf("%s: /proc/sys is not a read-only mount in the sandbox", prof)
			}
		})
	}
}
