package runcli

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/policy"
)

// SizeFlag is a byte-size flag that takes the same forms as --memory
// ("512M", "1G", "64k" or plain bytes).
type SizeFlag int64

func (s *SizeFlag) String() string { return FormatSize(int64(*s)) }

// Set parses a size with policy.ParseSize.
func (s *SizeFlag) Set(v string) error {
	n, err := policy.ParseSize(v)
	if err != nil {
		return err
	}
	*s = SizeFlag(n)
	return nil
}

// FormatSize prints n in the largest binary unit that divides it.
func FormatSize(n int64) string {
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

// ListFlag collects a repeated flag.
type ListFlag []string

func (l *ListFlag) String() string { return strings.Join(*l, ",") }

// Set appends v.
func (l *ListFlag) Set(v string) error { *l = append(*l, v); return nil }

// TTYFlag is -t (and -it, -ti, which Go's flag package reads as one
// name): the program runs on a fresh pseudo-terminal (airlock run's
// runTerminal), with the caller's input typed into it.
type TTYFlag bool

func (t *TTYFlag) String() string { return "false" }

// IsBoolFlag makes -t take no value.
func (t *TTYFlag) IsBoolFlag() bool { return true }

// Set records the flag.
func (t *TTYFlag) Set(v string) error {
	b, err := strconv.ParseBool(v)
	*t = TTYFlag(b)
	return err
}

// OptFloat is a float flag that remembers whether it was given, so that an
// explicit 0 is refused rather than read as "the profile's default".
type OptFloat struct {
	v   float64
	set bool
}

func (o *OptFloat) String() string {
	if o == nil || !o.set {
		return ""
	}
	return strconv.FormatFloat(o.v, 'g', -1, 64)
}

// Set parses the number.
func (o *OptFloat) Set(s string) error {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return fmt.Errorf("want a number, e.g. 0.5")
	}
	o.v, o.set = v, true
	return nil
}

// OptInt is OptFloat for integers.
type OptInt struct {
	v   int64
	set bool
}

func (o *OptInt) String() string {
	if o == nil || !o.set {
		return ""
	}
	return strconv.FormatInt(o.v, 10)
}

// Set parses the integer.
func (o *OptInt) Set(s string) error {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("want an integer")
	}
	o.v, o.set = v, true
	return nil
}

// registerDockerFlags adds the Docker/bwrap spellings a user is likely
// to type: -e, -v, -w (short for --env, --mount, --workdir), --rm (the
// default anyway) and -t/-it/-ti (a terminal: runTerminal).
func (f *PolicyFlags) registerDockerFlags(fs *flag.FlagSet) {
	fs.Var(&f.env, "e", "short for --env KEY=VALUE")
	fs.Var(&f.mounts, "v", "short for --mount SRC:DST[:ro|rw]")
	fs.StringVar(&f.workdir, "w", "", "short for --workdir DIR")
	fs.Bool("rm", true, "accepted for Docker users: every sandbox is removed when its command ends")
	for _, name := range []string{"t", "it", "ti"} {
		fs.Var(&f.TTY, name, "a terminal: the program runs on a fresh pseudo-terminal of its own (never this terminal, which goes raw meanwhile) with your input typed into it; native runtime")
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

// DurationText prints d without trailing zero units ("1m", not "1m0s").
func DurationText(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// LimitDefault is "(default: the profile's, strict X, standard Y, light Z)"
// for a limit flag's help: memory, disk, output, cpus, pids or timeout.
func LimitDefault(limit string) string {
	f := map[string]func(policy.Limits) string{
		"memory":  func(l policy.Limits) string { return FormatSize(l.MemoryBytes) },
		"disk":    func(l policy.Limits) string { return FormatSize(l.DiskBytes) },
		"output":  func(l policy.Limits) string { return FormatSize(l.OutputBytes) },
		"cpus":    func(l policy.Limits) string { return strconv.FormatFloat(l.CPUs, 'g', -1, 64) },
		"pids":    func(l policy.Limits) string { return strconv.FormatInt(l.Pids, 10) },
		"timeout": func(l policy.Limits) string { return DurationText(l.WallTime) },
	}[limit]
	return "(" + profileDefaults(f) + ")"
}
