package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/airlock-dev/airlock/internal/hostcheck"
	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/gvisor"
	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
)

const doctorUsage = `usage: airlock doctor [--json]

Starts a strict sandbox and reports which isolation layers this host
enforces; exits 1 when the strict profile cannot be honoured.
`

// cmdDoctor reports every isolation layer by starting a real strict sandbox
// and reading back what it enforced.
func cmdDoctor(args []string) int {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "print JSON")
	applyMicroVM := microvmFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fmt.Print(doctorUsage)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(os.Stderr, "airlock doctor: %v\n%s", suggestFlag(fs, err), doctorUsage)
		return exitUsage
	}
	if err := applyMicroVM(); err != nil {
		fmt.Fprintf(os.Stderr, "airlock doctor: %s\n", oneLine(err))
		return exitUsage
	}
	layers, ok := doctor()
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(map[string]any{"strict_ok": ok, "layers": layers})
	} else {
		for _, l := range layers {
			fmt.Printf("%-13s %-9s %s\n", l.Name, l.State, l.Detail)
		}
		if ok {
			fmt.Println("strict profile: can be honoured on this host")
		} else {
			fmt.Println("strict profile: CANNOT be honoured on this host (see the lines above)")
		}
	}
	if !ok {
		return exitDoctorFail
	}
	return 0
}

// doctor returns the layers and whether the strict profile holds.
func doctor() (rt.Enforced, bool) {
	var out rt.Enforced
	ok := true
	info := cgroups.Detect()
	cg := rt.Layer{Name: "cgroup", State: rt.StateOK, Detail: info.Describe()}
	if info.Version == 0 || info.Reason != "" {
		cg.State, cg.Detail, ok = rt.StateMissing, info.Reason+"; fix: "+hostcheck.CgroupFix(), false
	}
	out = append(out, cg)
	// Start-up speed, not isolation: a slow join never fails the doctor.
	join := rt.Layer{Name: "cgroup-join", State: rt.StateOK}
	if detail, slow := cgroups.AttachAdvice(); slow {
		join.State, join.Detail = rt.StateDegraded, detail
	} else {
		join.Detail = detail
	}
	out = append(out, join)

	p, _ := policy.Preset(policy.Strict)
	res, err := native.Run(context.Background(), native.Config{Policy: p, Args: []string{"/bin/true"}, AllowDegraded: true}, native.RunOptions{})
	if err != nil {
		ok = false
		out = append(out, rt.Layer{Name: "sandbox", State: rt.StateMissing, Detail: "cannot start a strict sandbox: " + oneLine(err)})
	} else {
		for _, l := range res.Enforced {
			if l.Name == "cgroup" {
				// What the sandbox got decides, not what Detect saw: as
				// non-root the hierarchy is there but cannot be written.
				if l.State != rt.StateOK && cg.State == rt.StateOK {
					cg.State, cg.Detail, ok = l.State, l.Detail+"; fix: "+hostcheck.CgroupFix(), false
					out[0] = cg
				}
				continue
			}
			if l.State != rt.StateOK {
				ok = false
			}
			out = append(out, l)
		}
		out = append(out, rt.Layer{Name: "sandbox", State: rt.StateOK, Detail: fmt.Sprintf("strict sandbox ran /bin/true in %.1f ms", res.WallMS)})
	}
	out = append(out, doctorGVisor(p), doctorWasm(p), doctorMicroVM())
	// What on this host forbids sandboxes, with fixes: a failure above
	// then says why; a host with none gets one line saying so.
	findings := hostcheck.Diagnose()
	for _, f := range findings {
		out = append(out, rt.Layer{Name: "host", State: rt.StateMissing, Detail: f.Problem + "; fix: " + f.Fix})
	}
	if len(findings) == 0 {
		where := "not in a container"
		if kind := hostcheck.ContainerKind(); kind != "" {
			where = "in a " + kind + " container"
		}
		out = append(out, rt.Layer{Name: "host", State: rt.StateOK, Detail: where + "; no seccomp filter or AppArmor profile on airlock, user namespaces allowed"})
	} else if ok {
		// Sandboxes started all the same: the findings are for other modes.
		for i := len(out) - len(findings); i < len(out); i++ {
			out[i].State = rt.StateDegraded
		}
	}
	return out, ok
}

// doctorGVisor reports whether the gvisor tier (--runtime gvisor) works
// here by running /bin/true under it. The tier is optional: its absence
// does not fail the doctor.
func doctorGVisor(p policy.Policy) rt.Layer {
	rs, err := gvisor.Available()
	if err != nil {
		return rt.Layer{Name: "gvisor", State: rt.StateMissing, Detail: "--runtime gvisor unavailable (optional): " + oneLine(err)}
	}
	p.Runtime = policy.RuntimeGVisor
	res, err := gvisor.Run(context.Background(), native.Config{Policy: p, Args: []string{"/bin/true"}}, native.RunOptions{})
	if err == nil && res.Status != native.StatusOK {
		err = fmt.Errorf("/bin/true ended %s: %s", res.Status, res.Error)
	}
	if err != nil {
		return rt.Layer{Name: "gvisor", State: rt.StateMissing, Detail: fmt.Sprintf("runsc %s at %s cannot run a sandbox: %s", rs.Version, rs.Path, oneLine(err))}
	}
	note := ""
	if rs.Version != gvisor.Version {
		note = fmt.Sprintf(" (airlock is tested with %s; scripts/setup.sh installs it)", gvisor.Version)
	}
	return rt.Layer{Name: "gvisor", State: rt.StateOK, Detail: fmt.Sprintf("runsc %s at %s%s, platform %s: ran /bin/true in %.1f ms", rs.Version, rs.Path, note, gvisor.Platform, res.WallMS)}
}
