package e2b

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/gvisor"
)

// TestCommandsStartInHome: an E2B command without a cwd, and one with a
// relative cwd, start in /home/user where the sandbox has it as a
// directory (native and gvisor roots: getcwd(2) says /home/user), and in
// the workspace where it does not (the microVM tier's root); in either
// case they run.
func TestCommandsStartInHome(t *testing.T) {
	for _, c := range []struct {
		runtime policy.Runtime
		want    string
	}{{policy.RuntimeNative, "/home/user"}, {policy.RuntimeGVisor, "/home/user"}, {policy.RuntimeMicroVM, "/workspace"}} {
		t.Run(string(c.runtime), func(t *testing.T) {
			if c.runtime == policy.RuntimeGVisor {
				if _, err := gvisor.Available(); err != nil {
					t.Skipf("gvisor tier unavailable: %v", err)
				}
			}
			e := newEnvSetup(t, true, envSetup{runtime: c.runtime})
			var created sandboxCreated
			r := e.api(t, "POST", "/v2/sandboxes", e.key, `{"templateID":"base","timeout":600}`)
			if r.status == 400 && c.runtime == policy.RuntimeMicroVM {
				t.Skipf("microvm: %s", r.body)
			}
			if r.status != 201 {
				t.Fatalf("create: %d %q", r.status, r.body)
			}
			r.json(t, &created)
			id := created.SandboxID
			out := func(body string) string {
				t.Helper()
				msgs, err := e.stream(t, id, "process.Process/Start", body, nil)
				if err != nil {
					t.Fatalf("%s: %+v", body, err)
				}
				var sb strings.Builder
				for _, m := range msgs {
					const pre = `{"event":{"data":{"stdout":"`
					if s, ok := strings.CutPrefix(m, pre); ok {
						b, _ := base64.StdEncoding.DecodeString(strings.TrimSuffix(s, `"}}}`))
						sb.Write(b)
					}
				}
				return sb.String()
			}
			if got := out(`{"process":{"cmd":"/bin/sh","args":["-c","pwd -P; mkdir -p sub"]},"stdin":false}`); got != c.want+"\n" {
				t.Fatalf("a command without cwd is in %q, want %s", got, c.want)
			}
			if got := out(`{"process":{"cmd":"/bin/sh","args":["-c","pwd -P"],"cwd":"sub"},"stdin":false}`); got != c.want+"/sub\n" {
				t.Fatalf("a command with cwd sub is in %q, want %s/sub", got, c.want)
			}
		})
	}
}
