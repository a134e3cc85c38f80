package template

import (
	"reflect"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
)

// evaluate runs a Dockerfile's FROM, ARG and config instructions on base
// as Build does, without a store: it returns the config, the FROM image
// name after expansion and the build's state.
func evaluate(t *testing.T, df string, base v1.Config, buildArgs map[string]string) (v1.Config, string, *buildState) {
	t.Helper()
	ast, steps, err := parseDockerfile(strings.NewReader(df))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	st := newBuildState(ast.EscapeToken, buildArgs)
	c, from := base, ""
	for _, s := range steps {
		switch cmd := s.cmd.(type) {
		case *instructions.Stage:
			var meta []string
			for _, k := range sortedKeys(st.meta) {
				meta = append(meta, k+"="+st.meta[k])
			}
			if from, err = st.expander(meta)(cmd.BaseName); err != nil {
				t.Fatal(err)
			}
		case *instructions.ArgCommand:
			if err := st.arg(cmd, c.Env, from == ""); err != nil {
				t.Fatal(err)
			}
		case instructions.Command:
			if err := st.configure(&c, cmd); err != nil {
				t.Fatalf("%s: %v", s.node.Original, err)
			}
		}
	}
	return c, from, st
}

// TestDockerfileSemantics: ENV, LABEL, ARG, CMD, ENTRYPOINT, SHELL, WORKDIR
// and EXPOSE give the image config BuildKit documents
// (https://docs.docker.com/reference/dockerfile/): several pairs in one
// instruction, quotes, the old "ENV key value" form, substitution with
// the values before the instruction, ENV over ARG, ARG defaults and
// --build-arg, ARGs before FROM.
func TestDockerfileSemantics(t *testing.T) {
	cases := []struct {
		name, df  string
		base      v1.Config
		args      map[string]string
		env       []string
		labels    map[string]string
		cmd, entr []string
		workdir   string
		from      string
	}{
		{name: "env pairs and quotes", df: `ENV A=1 B="two words" C=3`, env: []string{"A=1", "B=two words", "C=3"}},
		{name: "env old form", df: "ENV key value with  spaces", env: []string{"key=value with  spaces"}},
		{name: "env escaped space and single quotes", df: `ENV A=x\ y B='$A' C="$A"`, base: v1.Config{Env: []string{"A=old"}},
			env: []string{"A=x y", "B=$A", "C=old"}},
		{name: "env sees values before the instruction", df: "ENV A=1\nENV A=2 B=$A", env: []string{"A=2", "B=1"}},
		{name: "env defaults", df: `ENV C=${UNSET:-dflt} D=${A:+set} E=${UNSET:+set}`, base: v1.Config{Env: []string{"A=a"}},
			env: []string{"A=a", "C=dflt", "D=set", "E="}},
		{name: "env replaces", df: "ENV PATH=/opt/bin:$PATH", base: v1.Config{Env: []string{"PATH=/usr/bin"}}, env: []string{"PATH=/opt/bin:/usr/bin"}},
		{name: "label pairs", df: `LABEL a=1 "b c"="d e" f=g` + "\nLABEL version 1.0", labels: map[string]string{"a": "1", "b c": "d e", "f": "g", "version": "1.0"}},
		{name: "arg default and substitution", df: "ARG V=1\nARG W=${V}.2\nENV X=$W", env: []string{"X=1.2"}},
		{name: "build-arg wins", df: "ARG V=1\nARG W=${V}.2\nENV X=$W", args: map[string]string{"V": "9"}, env: []string{"X=9.2"}},
		{name: "build-arg taken as it is", df: "ARG V\nENV X=$V", args: map[string]string{"V": "$HOME"}, env: []string{"X=$HOME"}},
		{name: "arg without value is unset", df: "ARG V\nENV X=${V:-none}", env: []string{"X=none"}},
		{name: "env wins over arg", df: "ARG A=arg\nENV A=env\nENV B=$A", env: []string{"A=env", "B=env"}},
		{name: "meta arg in FROM only", df: "ARG BASE=img:1\nFROM $BASE\nENV X=${BASE:-unset}", from: "img:1", env: []string{"X=unset"}},
		{name: "meta arg redeclared", df: "ARG BASE=img:1\nFROM $BASE\nARG BASE\nENV X=$BASE", args: map[string]string{"BASE": "img:2"},
			from: "img:2", env: []string{"X=img:2"}},
		{name: "cmd exec form", df: `CMD ["a", "b c"]`, cmd: []string{"a", "b c"}},
		{name: "cmd shell form not expanded", df: "CMD echo $HOME  x", cmd: []string{"/bin/sh", "-c", "echo $HOME  x"}},
		{name: "entrypoint resets inherited cmd", df: `ENTRYPOINT ["e"]`, base: v1.Config{Cmd: []string{"old"}}, entr: []string{"e"}},
		{name: "entrypoint keeps this file's cmd", df: "CMD [\"c\"]\nENTRYPOINT e -x", base: v1.Config{Cmd: []string{"old"}},
			cmd: []string{"c"}, entr: []string{"/bin/sh", "-c", "e -x"}},
		{name: "shell", df: "SHELL [\"/bin/bash\", \"-eo\", \"pipefail\", \"-c\"]\nCMD echo hi", cmd: []string{"/bin/bash", "-eo", "pipefail", "-c", "echo hi"}},
		{name: "workdir relative", df: "ENV D=lib\nWORKDIR /opt\nWORKDIR app/$D", env: []string{"D=lib"}, workdir: "/opt/app/lib"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			df := tc.df
			if !strings.Contains(df, "FROM") {
				df = "FROM base\n" + df
			}
			c, from, _ := evaluate(t, df, tc.base, tc.args)
			if !reflect.DeepEqual(c.Env, tc.env) && (len(c.Env) != 0 || len(tc.env) != 0) {
				t.Errorf("env %q, want %q", c.Env, tc.env)
			}
			if tc.labels != nil && !reflect.DeepEqual(c.Labels, tc.labels) {
				t.Errorf("labels %q, want %q", c.Labels, tc.labels)
			}
			if !reflect.DeepEqual(c.Cmd, tc.cmd) {
				t.Errorf("cmd %q, want %q", c.Cmd, tc.cmd)
			}
			if !reflect.DeepEqual(c.Entrypoint, tc.entr) {
				t.Errorf("entrypoint %q, want %q", c.Entrypoint, tc.entr)
			}
			if c.WorkingDir != tc.workdir {
				t.Errorf("workdir %q, want %q", c.WorkingDir, tc.workdir)
			}
			if tc.from != "" && from != tc.from {
				t.Errorf("FROM %q, want %q", from, tc.from)
			}
		})
	}
}

// TestRunEnv: a RUN step gets the ARGs declared in scope (not ENV-shadowed
// ones, not undeclared --build-args, which the build reports unused).
func TestRunEnv(t *testing.T) {
	_, _, st := evaluate(t, "ARG M=meta\nFROM base\nARG A\nARG B=b\nARG C=c\nENV C=env", v1.Config{},
		map[string]string{"A": "1", "UNDECLARED": "2"})
	if got, want := st.runEnv([]string{"C=env"}), map[string]string{"A": "1", "B": "b"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("run env %v, want %v", got, want)
	}
	if got := st.unusedArgs(); !reflect.DeepEqual(got, []string{"UNDECLARED"}) {
		t.Fatalf("unused %v", got)
	}
}

// TestMasked: paths a sandbox mounts over, and RUN lines that write there.
func TestMasked(t *testing.T) {
	for p, want := range map[string]string{"/tmp": "/tmp", "/tmp/x/": "/tmp", "/workspace/a": "/workspace", "/dev/shm/x": "/dev",
		"/tmpfoo": "", "/opt/tmp": "", "/var/tmp/x": "", "tmp/x": "/tmp"} {
		if got := MaskedBy(p); got != want {
			t.Errorf("MaskedBy(%q) = %q, want %q", p, got, want)
		}
	}
	for line, want := range map[string]string{"echo x > /tmp/a": "/tmp", "cd /workspace && make": "/workspace", "pip install --cache-dir=/tmp x": "/tmp",
		"cp a /var/tmp/b": "", "echo /tmpx": "", "ls /opt/tmp": "", "echo ok >/dev/shm/f": "/dev/shm", "make >/dev/null 2>&1": ""} {
		if got := mentionsMasked(line, "/"); got != want {
			t.Errorf("mentionsMasked(%q) = %q, want %q", line, got, want)
		}
	}
	if got := mentionsMasked("echo x > f", "/workspace/app"); got != "/workspace" {
		t.Errorf("cwd in /workspace: %q", got)
	}
}
