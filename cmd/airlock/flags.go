package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/policy"
)

// sizeFlag is a byte-size flag that takes the same forms as --memory
// ("512M", "1G", "64k" or plain bytes).
type sizeFlag int64

func (s *sizeFlag) String() string { return formatSize(int64(*s)) }

// Set parses a size with policy.ParseSize.
func (s *sizeFlag) Set(v string) error {
	n, err := policy.ParseSize(v)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

// formatSize prints n in the largest binary unit that divides it.
func formatSize(n int64) string {
	for _, u := range []struct {
		s string
		n int64
	}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}} {
		if n >= u.n && n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}

// ttyFlag is -t (and -it, -ti, which Go's flag package reads as one
// name): the program runs on a fresh pseudo-terminal (runTerminal), with
// the caller's input typed into it.
type ttyFlag bool

func (t *ttyFlag) String() string   { return "false" }
func (t *ttyFlag) IsBoolFlag() bool { return true }

// Set records the flag.
func (t *ttyFlag) Set(v string) error {
	b, err := strconv.ParseBool(v)
	*t = ttyFlag(b)
	return err
}

// registerDockerFlags adds the Docker/bwrap spellings a user is likely
// to type: -e, -v, -w (short for --env, --mount, --workdir), --rm (the
// default anyway) and -t/-it/-ti (a terminal: runTerminal).
func (f *policyFlags) registerDockerFlags(fs *flag.FlagSet) {
	fs.Var(&f.env, "e", "short for --env KEY=VALUE")
	fs.Var(&f.mounts, "v", "short for --mount SRC:DST[:ro|rw]")
	fs.StringVar(&f.workdir, "w", "", "short for --workdir DIR")
	fs.Bool("rm", true, "accepted for Docker users: every sandbox is removed when its command ends")
	for _, name := range []string{"t", "it", "ti"} {
		fs.Var(&f.tty, name, "a terminal: the program runs on a fresh pseudo-terminal of its own (never this terminal, which goes raw meanwhile) with your input typed into it; native runtime")
	}
}

// profileDefaults describes a limit's default in each profile, for --help.
func profileDefaults(f func(policy.Limits) string) string {
	s := "default: the profile's,"
	for i, name := range []policy.Profile{policy.Strict, policy.Standard, policy.Light} {
		p, err := policy.Preset(name)
		if err != nil {
			continue
		}
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf(" %s %s", name, f(p.Limits))
	}
	return s
}

// durationText prints d without trailing zero units ("1m", not "1m0s").
func durationText(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// limitDefault is "(default: the profile's, strict X, standard Y, light Z)"
// for a limit flag's help: memory, disk, output, cpus, pids or timeout.
func limitDefault(limit string) string {
	f := map[string]func(policy.Limits) string{
		"memory":  func(l policy.Limits) string { return formatSize(l.MemoryBytes) },
		"disk":    func(l policy.Limits) string { return formatSize(l.DiskBytes) },
		"output":  func(l policy.Limits) string { return formatSize(l.OutputBytes) },
		"cpus":    func(l policy.Limits) string { return strconv.FormatFloat(l.CPUs, 'g', -1, 64) },
		"pids":    func(l policy.Limits) string { return strconv.FormatInt(l.Pids, 10) },
		"timeout": func(l policy.Limits) string { return durationText(l.WallTime) },
	}[limit]
	return "(" + profileDefaults(f) + ")"
}
