// kube-e2e escape: the syscall probe (internal/probe, the one the native
// and gVisor hostile tests run) inside a sandbox's pod, through airlock's
// API, and a host-side search for the sandbox's processes (see main.go).

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// privileged are the probe's checks that only a process holding a
// capability (CAP_SYS_ADMIN, CAP_SETUID, CAP_SYS_TIME, ...) may get past the
// permission check of, whatever the kernel: the sandbox's workload runs as
// uid 1000 with none, so each must be refused (EPERM, or ENOSYS from a
// kernel without the call). Any other answer means the call got further
// than the workload's privileges allow: an escape. The probe's paths and
// arguments are invalid after the permission check, so even a call that
// got past it changes nothing.
var privileged = []string{
	"mount", "umount2", "pivot_root", "chroot", "setns", "unshare_ns", "clone_newns",
	"open_by_handle_at", "settimeofday", "clock_settime", "kexec_load", "init_module",
	"acct", "swapon", "reboot", "iopl", "bpf", "fsopen", "fspick", "open_tree",
	"setuid_agent", "setresuid_agent", "setgroups_nogroup",
}

// refused reports whether a probe verdict is a refusal by permission.
func refused(v string) bool {
	return v == "denied:EPERM" || v == "denied:ENOSYS" || v == "EACCES"
}

// cmdEscape is "kube-e2e escape": it uploads the probe into sandbox -id,
// runs it as the sandbox's user, counts escapes (a privileged call not
// refused; a capability, uid 0 or privileges to gain; the host file
// -secret readable; a process of the sandbox found among this host's
// processes) and prints "escapes: N". It fails if N > 0 or the probe
// could not run.
func cmdEscape(args []string) error {
	fs := flag.NewFlagSet("escape", flag.ContinueOnError)
	url := fs.String("url", "", "airlock server URL")
	key := fs.String("key", "", "API key")
	id := fs.String("id", "", "sandbox id")
	probe := fs.String("probe", "", "the static probe binary (go build ./internal/probe)")
	secret := fs.String("secret", "", "a file on this host the sandbox must not see")
	hostProcs := fs.Bool("host-procs", true, "fail if a process of the sandbox is one of this host's (gVisor: the sentry runs them)")
	timeout := fs.Duration("timeout", 4*time.Minute, "time the step may take")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" || *id == "" || *probe == "" {
		return errors.New("escape: -url, -id and -probe are required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c := client.New(*url, *key)
	bin, err := os.ReadFile(*probe)
	if err != nil {
		return fmt.Errorf("escape: %w", err)
	}
	const dst = "/workspace/airlock-probe"
	if _, err := c.WriteFile(ctx, *id, dst, bytes.NewReader(bin), 0o755); err != nil {
		return fmt.Errorf("escape: upload the probe: %w", err)
	}
	// ptrace goes to a throwaway child: the pod's agent shares the
	// workload's uid by design (docs/kubernetes.md, "identity degraded"),
	// so attaching to it is within the sandbox, not out of it.
	res, err := c.Exec(ctx, *id, client.ExecRequest{Argv: []string{dst}, Env: map[string]string{"AIRLOCK_PROBE_PTRACE_PID": "0"}, Timeout: 120})
	if err != nil {
		return fmt.Errorf("escape: run the probe: %w", err)
	}
	got := map[string]string{}
	if res.ExitCode != 0 || json.Unmarshal([]byte(res.Stdout), &got) != nil || len(got) == 0 {
		return fmt.Errorf("escape: the probe did not run: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	var escapes []string
	for _, k := range privileged {
		v, ok := got[k]
		switch {
		case !ok || strings.HasPrefix(v, "error"):
			return fmt.Errorf("escape: the probe could not check %s: %q", k, v)
		case !refused(v):
			escapes = append(escapes, k+"="+v)
		}
	}
	for k, want := range map[string]string{"cap_eff": "0000000000000000", "cap_amb": "0000000000000000", "no_new_privs": "1"} {
		if got[k] != want {
			escapes = append(escapes, fmt.Sprintf("%s=%q (want %q)", k, got[k], want))
		}
	}
	if got["uid"] == "0" || got["uid"] == "" {
		escapes = append(escapes, fmt.Sprintf("uid=%q", got["uid"]))
	}
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var all []string
	for _, k := range keys {
		all = append(all, k+"="+got[k])
	}
	step("probe verdicts: %s", strings.Join(all, " "))
	if *secret != "" {
		r, err := c.Exec(ctx, *id, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat " + *secret + " 2>/dev/null; ls -d " + filepath.Dir(*secret) + " 2>/dev/null; true"}, Timeout: 60})
		if err != nil {
			return fmt.Errorf("escape: host file check: %w", err)
		}
		if strings.TrimSpace(r.Stdout) != "" {
			escapes = append(escapes, "host file "+*secret+" seen: "+strings.TrimSpace(r.Stdout))
		}
	}
	if *hostProcs {
		found, err := hostProcesses(ctx, c, *id)
		if err != nil {
			return err
		}
		escapes = append(escapes, found...)
	}
	fmt.Printf("escapes: %d\n", len(escapes))
	if len(escapes) > 0 {
		return fmt.Errorf("escape: %d escapes from sandbox %s: %s", len(escapes), *id, strings.Join(escapes, "; "))
	}
	return nil
}

// hostProcesses starts a background process in sandbox id whose argv holds
// a marker, checks through the API that it runs, and lists this host's
// processes whose command line holds the marker: under gVisor there must be
// none (the sentry runs the sandbox's processes; the host sees runsc only).
func hostProcesses(ctx context.Context, c *client.Client, id string) ([]string, error) {
	marker := fmt.Sprintf("airlock-e2e-marker-%d", time.Now().UnixNano())
	if _, err := c.Start(ctx, id, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "sleep 600; :", marker}, Tag: marker}); err != nil {
		return nil, fmt.Errorf("escape: start the marker process: %w", err)
	}
	running := false
	for end := time.Now().Add(time.Minute); !running && time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		ps, err := c.Processes(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("escape: processes: %w", err)
		}
		for _, p := range ps {
			running = running || (p.Tag == marker && p.Running)
		}
	}
	if !running {
		return nil, errors.New("escape: the marker process does not run in the sandbox")
	}
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return nil, err
	}
	var found []string
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err == nil && bytes.Contains(b, []byte(marker)) {
			found = append(found, "host process "+filepath.Base(filepath.Dir(f))+" runs the sandbox's "+strings.ReplaceAll(string(bytes.TrimRight(b, "\x00")), "\x00", " "))
		}
	}
	step("marker process running in sandbox %s; host processes with its marker: %d of %d", id, len(found), len(procs))
	return found, nil
}
