package policy

import (
	"strings"
	"testing"
)

func TestPresetsValidate(t *testing.T) {
	for _, name := range []Profile{"", Strict, Standard, Light} {
		p, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Validate(); err != nil {
			t.Errorf("preset %q invalid: %v", name, err)
		}
		if p.Network.Mode != NetNone {
			t.Errorf("preset %q: network %q, want none by default", name, p.Network.Mode)
		}
	}
	s, _ := Preset(Strict)
	l, _ := Preset(Light)
	if s.Limits.MemoryBytes >= l.Limits.MemoryBytes || s.Limits.Pids >= l.Limits.Pids {
		t.Error("strict should be tighter than light")
	}
	if _, err := Preset("yolo"); err == nil {
		t.Error("unknown preset accepted")
	}
}

func TestValidateRejects(t *testing.T) {
	cases := map[string]func(*Policy){
		"memory":     func(p *Policy) { p.Limits.MemoryBytes = 1 },
		"cpus":       func(p *Policy) { p.Limits.CPUs = -1 },
		"pids":       func(p *Policy) { p.Limits.Pids = 0 },
		"wall_time":  func(p *Policy) { p.Limits.WallTime = 0 },
		"network":    func(p *Policy) { p.Network.Mode = "internet" },
		"mount":      func(p *Policy) { p.Filesystem.Mounts = []Mount{{Source: "rel", Target: "/x"}} },
		"reserved":   func(p *Policy) { p.Filesystem.Mounts = []Mount{{Source: "/x", Target: "/proc"}} },
		"unclean":    func(p *Policy) { p.Filesystem.Mounts = []Mount{{Source: "/x", Target: "/a/../etc"}} },
		"under dev":  func(p *Policy) { p.Filesystem.Mounts = []Mount{{Source: "/x", Target: "/dev/sda"}} },
		"workdir":    func(p *Policy) { p.Filesystem.Workdir = "relative" },
		"env":        func(p *Policy) { p.Env = append(p.Env, "NOEQUALS") },
		"env nul":    func(p *Policy) { p.Env = append(p.Env, "A=b\x00c") },
		"user range": func(p *Policy) { p.User.UID = 70000 },
		"output":     func(p *Policy) { p.Limits.OutputBytes = 0 },
		"nul path":   func(p *Policy) { p.Filesystem.Mounts = []Mount{{Source: "/x\x00y", Target: "/data"}} },
		"nul etc":    func(p *Policy) { p.Filesystem.EtcFiles = append(p.Filesystem.EtcFiles, "/etc/a\x00") },
	}
	for name, mod := range cases {
		p, _ := Preset(Strict)
		mod(&p)
		if err := p.Validate(); err == nil {
			t.Errorf("%s: invalid policy accepted", name)
		}
	}
	// Every problem is reported, not only the first.
	p, _ := Preset(Strict)
	p.Limits.MemoryBytes, p.Limits.Pids = 1, 0
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "memory") || !strings.Contains(err.Error(), "pids") {
		t.Errorf("want both problems, got %v", err)
	}
}

func TestParseSize(t *testing.T) {
	good := map[string]int64{"512": 512, "64k": 64 << 10, "512M": 512 << 20, "1G": 1 << 30, "1.5GiB": 3 << 29, "2g": 2 << 30, "10MB": 10 << 20}
	for in, want := range good {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "abc", "-1M", "12xb", "1e30G", "M"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
}

func TestSetEnv(t *testing.T) {
	p, _ := Preset(Strict)
	n := len(p.Env)
	p.SetEnv("HOME", "/tmp")
	p.SetEnv("NEW", "1")
	if len(p.Env) != n+1 || p.Env[1] != "HOME=/tmp" {
		t.Errorf("env %v", p.Env)
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"1", "1k", "1.5G", "", "9999999999999999999T"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err == nil && n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
	})
}

func TestNames(t *testing.T) {
	for k, want := range map[string]bool{"PATH": true, "_x1": true, "1A": false, "": false, "A-B": false, "é": false, string(make([]byte, 129)): false} {
		if ValidEnvKey(k) != want {
			t.Errorf("ValidEnvKey(%q) = %v", k, !want)
		}
	}
	for k, want := range map[string]bool{"task": true, "a.b-c_1": true, "": false, "a b": false, "x/y": false} {
		if ValidLabel(k) != want {
			t.Errorf("ValidLabel(%q) = %v", k, !want)
		}
	}
}
