package cgroups

import (
	"os"
	"strings"
)

// AttachAdvice says how a sandbox's init joins its cgroup on this host and
// whether every sandbox start waits for an RCU grace period there (slow),
// with what an operator can change to avoid it. On cgroup v1 the init
// moves itself in (OpenTasks), which never waits. On cgroup v2 the
// launcher writes the pid to cgroup.procs, which takes the kernel's global
// threadgroup lock: its first writer after a quiet spell waits for a grace
// period (8-20 ms measured on cgroup v1, the same lock) unless the
// hierarchy is mounted with favordynmods or RCU grace periods are
// expedited.
func AttachAdvice() (detail string, slow bool) {
	h := current()
	if h.info.Version != 2 {
		return attachAdvice(h.info.Version, "", "")
	}
	m, err := readMounts("/proc/self/mountinfo")
	if err != nil {
		return attachAdvice(2, "", "")
	}
	exp, _ := os.ReadFile("/sys/kernel/rcu_expedited")
	return attachAdvice(2, m.v2Opts, strings.TrimSpace(string(exp)))
}

// attachAdvice is AttachAdvice for a cgroup version, the cgroup2 mount's
// super options and the content of /sys/kernel/rcu_expedited.
func attachAdvice(version int, v2Opts, rcuExpedited string) (string, bool) {
	switch version {
	case 0:
		return "no cgroups", false
	case 1:
		return "cgroup v1: a sandbox's init moves itself into its groups (tasks files), no RCU grace-period wait", false
	}
	for _, o := range strings.Split(v2Opts, ",") {
		if o == "favordynmods" {
			return "cgroup v2 mounted with favordynmods: joining a sandbox's cgroup does not wait for an RCU grace period", false
		}
	}
	if rcuExpedited != "" && rcuExpedited != "0" {
		return "cgroup v2 without favordynmods, RCU grace periods expedited (rcu_expedited=1): joining a cgroup waits for an expedited grace period", false
	}
	return "cgroup v2 without favordynmods: every sandbox start waits for an RCU grace period (~10 ms) when joining its cgroup; " +
		"remount with `mount -o remount,favordynmods /sys/fs/cgroup` (kernel >= 6.0; a little cost on every fork and exit), " +
		"or expedite grace periods (`echo 1 > /sys/kernel/rcu_expedited`, boot: rcupdate.rcu_expedited=1)", true
}
