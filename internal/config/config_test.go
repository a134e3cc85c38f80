package config

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

type flags struct {
	fs      *flag.FlagSet
	listen  *string
	noAuth  *bool
	max     *int
	timeout *time.Duration
	ratio   *float64
	keys    list
}

func newFlags() *flags {
	f := &flags{fs: flag.NewFlagSet("serve", flag.ContinueOnError)}
	f.listen = f.fs.String("listen", "127.0.0.1:7070", "")
	f.noAuth = f.fs.Bool("no-auth", false, "")
	f.max = f.fs.Int("max-sandboxes", 100, "")
	f.timeout = f.fs.Duration("default-timeout", 15*time.Minute, "")
	f.ratio = f.fs.Float64("ratio", 1, "")
	f.fs.Var(&f.keys, "approver-key", "")
	f.fs.String("config", "", "")
	return f
}

func (f *flags) opts() Options {
	return Options{Reserved: []string{"config"}, Repeatable: func(fl *flag.Flag) bool { return fl.Name == "approver-key" }}
}

func write(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every kind of flag takes its value from the file; the command line
// overrides the file key by key.
func TestApplySetsFlagsAndCommandLineWins(t *testing.T) {
	f := newFlags()
	if err := f.fs.Parse([]string{"--max-sandboxes", "7"}); err != nil {
		t.Fatal(err)
	}
	p := write(t, `
listen = "0.0.0.0:8443"
no-auth = true
max-sandboxes = 50
default-timeout = "1h30m"
ratio = 0.25
approver-key = ["k1", "k2"]
`)
	applied, err := Apply(f.fs, p, f.opts())
	if err != nil {
		t.Fatal(err)
	}
	if *f.listen != "0.0.0.0:8443" || !*f.noAuth || *f.timeout != 90*time.Minute || *f.ratio != 0.25 ||
		!slices.Equal(f.keys, list{"k1", "k2"}) {
		t.Fatalf("file not applied: listen %q no-auth %v timeout %v ratio %v keys %v", *f.listen, *f.noAuth, *f.timeout, *f.ratio, f.keys)
	}
	if *f.max != 7 {
		t.Fatalf("max-sandboxes = %d: the command line's 7 must win over the file's 50", *f.max)
	}
	if want := []string{"approver-key", "default-timeout", "listen", "no-auth", "ratio"}; !slices.Equal(applied, want) {
		t.Fatalf("applied %v, want %v", applied, want)
	}
}

// Mistaken or hostile files are refused with the key named: a typo never
// passes as a default.
func TestApplyRefusesBadKeys(t *testing.T) {
	cases := []struct{ name, text, want string }{
		{"unknown", "listen = \"x\"\nno-auht = true\n", `unknown key "no-auht"`},
		{"table", "[tls]\ncert = \"/c\"\n", `key "tls"`},
		{"reserved", "config = \"/etc/other.toml\"\n", `key "config" cannot be set`},
		{"array for a scalar", "listen = [\"a:1\", \"b:2\"]\n", `key "listen" takes one value`},
		{"bad value", "max-sandboxes = \"many\"\n", `key "max-sandboxes"`},
		{"bad duration", "default-timeout = 15\n", `key "default-timeout"`},
		{"date", "default-timeout = 1979-05-27\n", `key "default-timeout": a date`},
		{"empty array", "approver-key = []\n", `key "approver-key": an empty array`},
		{"syntax", "listen = \n", "config "},
		{"duplicate", "listen = \"a:1\"\nlisten = \"b:2\"\n", "listen"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFlags()
			f.fs.Parse(nil)
			_, err := Apply(f.fs, write(t, c.text), f.opts())
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one containing %q", err, c.want)
			}
		})
	}
}

func TestApplyMissingFile(t *testing.T) {
	f := newFlags()
	f.fs.Parse(nil)
	_, err := Apply(f.fs, filepath.Join(t.TempDir(), "none.toml"), f.opts())
	if err == nil || !strings.Contains(err.Error(), "none.toml") {
		t.Fatalf("err = %v, want the missing file named", err)
	}
}
