package native_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// procSecrets are host-revealing /proc entries a sandbox must read as empty
// (or not at all), when the host kernel has them.
var procSecrets = []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/config.gz",
	"/proc/interrupts", "/proc/sched_debug", "/proc/latency_stats", "/proc/timer_stats"}

// procCheckScript prints, for each entry, how many bytes a read gets
// ("err" if it cannot be opened), then tries a write to a sysctl of the
// sandbox's own network namespace, which its uid 0 owns.
const procCheckScript = `for f in $0 "$@"; do
  if n=$(head -c 4096 "$f" 2>/dev/null | wc -c) && [ -r "$f" ]; then echo "$f $n"; else echo "$f err"; fi
done
if echo 4096 2>/dev/null > /proc/sys/net/core/somaxconn; then echo "sysctl written"; else echo "sysctl refused"; fi`

// TestProcMasked (issue 20, finding 7): the /proc entries runc and Docker
// mask read as empty and /proc/sys cannot be written, even by the
// sandbox's uid 0, in every profile; checked inside and, through the
// sandbox init's mountinfo, from the host.
func TestProcMasked(t *testing.T) {
	var present []string
	for _, p := range procSecrets {
		if _, err := os.Stat(p); err == nil {
			present = append(present, p)
		}
	}
	if len(present) == 0 {
		t.Fatal("the host has none of the entries to check")
	}
	for _, prof := range []policy.Profile{policy.Strict, policy.Standard, policy.Light} {
		t.Run(string(prof), func(t *testing.T) {
			res := run(t, func(p *policy.Policy) {
				*p = mustPreset(t, prof)
				p.User.UID, p.User.GID = 0, 0
			}, append([]string{"/bin/sh", "-c", procCheckScript}, present...)...)
			for _, l := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
				f := strings.Fields(l)
				if len(f) == 2 && strings.HasPrefix(f[0], "/proc/") && f[1] != "0" && f[1] != "err" {
					t.Errorf("%s: read %s bytes of the host's %s", prof, f[1], f[0])
				}
			}
			if !strings.Contains(res.Stdout, "sysctl refused") {
				t.Errorf("%s: sandbox uid 0 wrote /proc/sys/net/core/somaxconn: %q %q", prof, res.Stdout, res.Stderr)
			}

			// From the host: the init's mount table has the masks.
			sb, err := native.Start(native.Config{Policy: mustPreset(t, prof), Args: []string{"sleep", "30"}})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Destroy()
			mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", sb.Pid))
			if err != nil {
				t.Fatal(err)
			}
			mounts := map[string]string{} // mount point -> options
			for _, l := range strings.Split(string(mi), "\n") {
				if f := strings.Fields(l); len(f) > 5 {
					mounts[f[4]] = f[5]
				}
			}
			for _, p := range present {
				if _, ok := mounts[p]; !ok {
					t.Errorf("%s: nothing mounted over %s", prof, p)
				}
			}
			if o := mounts["/proc/sys"]; !strings.HasPrefix(o, "ro") {
				t.Errorf("%s: /proc/sys mount options %q, want read-only", prof, o)
			}
		})
	}
}

func mustPreset(t *testing.T, prof policy.Profile) policy.Policy {
	t.Helper()
	p, err := policy.Preset(prof)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestModifyLDTDenied (issue 20, finding 7): modify_ldt is denied in every
// profile, as in Docker's default profile.
func TestModifyLDTDenied(t *testing.T) {
	for _, prof := range []policy.Profile{policy.Strict, policy.Standard, policy.Light} {
		got, _ := probeIn(t, prof)
		if got["modify_ldt"] != "denied:EPERM" {
			t.Errorf("%s: modify_ldt %q, want denied:EPERM", prof, got["modify_ldt"])
		}
	}
}
