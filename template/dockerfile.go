package template

import (
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
)

// Masked are the directories every sandbox mounts a file system of its own
// over (tmpfs on /tmp, /workspace and /dev/shm; its own /dev and /proc):
// what an image holds there is never seen by a sandbox.
var Masked = []string{"/tmp", "/workspace", "/dev", "/proc"}

// MaskedBy returns the directory of Masked that absolute path p is in or
// is, or "".
func MaskedBy(p string) string {
	p = path.Clean("/" + p)
	for _, m := range Masked {
		if p == m || strings.HasPrefix(p, m+"/") {
			return m
		}
	}
	return ""
}

// step is one instruction of a Dockerfile: its AST node and what BuildKit's
// instructions package made of it (*instructions.Stage for FROM).
type step struct {
	node *parser.Node
	cmd  any
}

// parseDockerfile reads a Dockerfile with BuildKit's parser and turns
// every instruction into its typed form with BuildKit's instructions
// package (quoting, key=value pairs, the old "ENV key value" form, exec
// and shell forms are theirs, not airlock's).
func parseDockerfile(r io.Reader) (*parser.Result, []step, error) {
	res, err := parser.Parse(r)
	if err != nil {
		return nil, nil, err
	}
	var steps []step
	for _, n := range res.AST.Children {
		cmd, err := instructions.ParseInstruction(n)
		if err != nil {
			return nil, nil, fmt.Errorf("line %d: %w", n.StartLine, err)
		}
		steps = append(steps, step{node: n, cmd: cmd})
	}
	return res, steps, nil
}

// buildState is what a build carries from step to step besides the image:
// the ARGs in scope, the SHELL, whether CMD was set by this Dockerfile.
type buildState struct {
	lex *shell.Lex
	// buildArgs are the --build-arg values; used records those an ARG
	// declared.
	buildArgs map[string]string
	used      map[string]bool
	// meta are the ARGs declared before FROM (usable in FROM, and by an
	// ARG of the same name without a value after it); args those of the
	// stage. A declared ARG with no value and no --build-arg is unset.
	meta, args map[string]string
	// shell is SHELL's value; cmdSet says this Dockerfile set CMD (an
	// ENTRYPOINT resets an inherited CMD, as in BuildKit).
	shell  []string
	cmdSet bool
}

func newBuildState(escape rune, buildArgs map[string]string) *buildState {
	if buildArgs == nil {
		buildArgs = map[string]string{}
	}
	return &buildState{lex: shell.NewLex(escape), buildArgs: buildArgs, used: map[string]bool{},
		meta: map[string]string{}, args: map[string]string{}, shell: []string{"/bin/sh", "-c"}}
}

// env is what words are expanded with: the stage's ARGs, then the image's
// ENV (an ENV wins over an ARG of the same name, as BuildKit documents).
func (s *buildState) env(imageEnv []string) []string {
	out := make([]string, 0, len(s.args)+len(imageEnv))
	for _, k := range sortedKeys(s.args) {
		out = append(out, k+"="+s.args[k])
	}
	return append(out, imageEnv...)
}

// expander expands $VAR, ${VAR:-default} and quotes in one word.
func (s *buildState) expander(env []string) instructions.SingleWordExpander {
	getter := shell.EnvsFromSlice(env)
	return func(word string) (string, error) {
		r, err := s.lex.ProcessWordWithMatches(word, getter)
		return r.Result, err
	}
}

// runEnv are the environment variables of a RUN step besides the image's:
// the ARGs in scope that no ENV overrides.
func (s *buildState) runEnv(imageEnv []string) map[string]string {
	out := map[string]string{}
	for k, v := range s.args {
		out[k] = v
	}
	for _, kv := range imageEnv {
		k, _, _ := strings.Cut(kv, "=")
		delete(out, k)
	}
	return out
}

// arg declares the ARGs of c: before FROM (meta) or in the stage. A
// --build-arg value wins over the default and is taken as it is; a
// default is expanded with what was declared before.
func (s *buildState) arg(c *instructions.ArgCommand, imageEnv []string, beforeFrom bool) error {
	scope := s.args
	env := s.env(imageEnv)
	if beforeFrom {
		scope = s.meta
		env = nil
		for _, k := range sortedKeys(s.meta) {
			env = append(env, k+"="+s.meta[k])
		}
	}
	x := s.expander(env)
	for _, kv := range c.Args {
		k, err := x(kv.Key)
		if err != nil {
			return err
		}
		if v, ok := s.buildArgs[k]; ok {
			s.used[k] = true
			scope[k] = v
		} else if kv.Value != nil {
			if scope[k], err = x(*kv.Value); err != nil {
				return err
			}
		} else if v, ok := s.meta[k]; ok && !beforeFrom {
			scope[k] = v
		}
		env = append(env, k+"="+scope[k])
		x = s.expander(env)
	}
	return nil
}

// unusedArgs are the --build-arg names no ARG declared.
func (s *buildState) unusedArgs() []string {
	var out []string
	for _, k := range sortedKeys(s.buildArgs) {
		if !s.used[k] {
			out = append(out, k)
		}
	}
	return out
}

// replay applies what a step taken from the cache changes in the
// build's own state (SHELL, CMD set) besides its image.
func (s *buildState) replay(cmd any) {
	switch c := cmd.(type) {
	case *instructions.ShellCommand:
		s.shell = c.Shell
	case *instructions.CmdCommand:
		s.cmdSet = true
	}
}

// argv is the program of a RUN, CMD or ENTRYPOINT: the exec form as
// written, the shell form as SHELL (default /bin/sh -c) and the line.
func (s *buildState) argv(c instructions.ShellDependantCmdLine) ([]string, error) {
	if len(c.Files) > 0 {
		return nil, errors.New("heredocs are not supported")
	}
	if !c.PrependShell {
		return c.CmdLine, nil
	}
	if len(c.CmdLine) == 0 {
		return nil, nil
	}
	return append(append([]string{}, s.shell...), strings.Join(c.CmdLine, " ")), nil
}

// configure applies a config-only instruction (ENV, LABEL, WORKDIR, USER,
// CMD, ENTRYPOINT, EXPOSE, SHELL, STOPSIGNAL, VOLUME is refused) to c, its
// words expanded as BuildKit expands them (CMD and ENTRYPOINT never are).
func (s *buildState) configure(c *v1.Config, cmd instructions.Command) error {
	if e, ok := cmd.(instructions.SupportsSingleWordExpansion); ok {
		if err := e.Expand(s.expander(s.env(c.Env))); err != nil {
			return err
		}
	}
	switch cmd := cmd.(type) {
	case *instructions.EnvCommand:
		for _, kv := range cmd.Env {
			setEnv(c, kv.Key, kv.Value)
		}
	case *instructions.LabelCommand:
		if c.Labels == nil {
			c.Labels = map[string]string{}
		}
		for _, kv := range cmd.Labels {
			c.Labels[kv.Key] = kv.Value
		}
	case *instructions.WorkdirCommand:
		c.WorkingDir = workdir(c.WorkingDir, cmd.Path)
	case *instructions.UserCommand:
		c.User = cmd.User
	case *instructions.CmdCommand:
		argv, err := s.argv(cmd.ShellDependantCmdLine)
		if err != nil {
			return err
		}
		c.Cmd, s.cmdSet = argv, true
	case *instructions.EntrypointCommand:
		argv, err := s.argv(cmd.ShellDependantCmdLine)
		if err != nil {
			return err
		}
		c.Entrypoint = argv
		if !s.cmdSet {
			c.Cmd = nil
		}
	case *instructions.ExposeCommand:
		if c.ExposedPorts == nil {
			c.ExposedPorts = map[string]struct{}{}
		}
		for _, p := range cmd.Ports {
			if !strings.Contains(p, "/") {
				p += "/tcp"
			}
			c.ExposedPorts[p] = struct{}{}
		}
	case *instructions.ShellCommand:
		if len(cmd.Shell) == 0 {
			return errors.New("SHELL needs a program")
		}
		s.shell = cmd.Shell
		c.Shell = cmd.Shell
	case *instructions.StopSignalCommand:
		c.StopSignal = cmd.Signal
	default:
		return fmt.Errorf("%s is not supported", strings.ToUpper(cmd.Name()))
	}
	return nil
}

// workdir is WORKDIR p after WORKDIR cur: relative paths are relative to
// the previous one.
func workdir(cur, p string) string {
	if !path.IsAbs(p) {
		p = path.Join("/", cur, p)
	}
	return path.Clean(p)
}

func setEnv(c *v1.Config, k, v string) {
	for i, kv := range c.Env {
		if strings.HasPrefix(kv, k+"=") {
			c.Env[i] = k + "=" + v
			return
		}
	}
	c.Env = append(c.Env, k+"="+v)
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// mentionsMasked returns the first tmpfs directory a RUN line names,
// or the working directory's when it is in one: what the step writes
// there is not kept.
func mentionsMasked(line, cwd string) string {
	if m := MaskedBy(cwd); m != "" && cwd != "" {
		return m
	}
	for _, m := range []string{"/tmp", "/workspace", "/dev/shm"} { // not /dev/null
		for i := strings.Index(line, m); i >= 0; {
			end := i + len(m)
			before := i == 0 || strings.ContainsRune(" \t\"'=;:&|(<>", rune(line[i-1]))
			after := end == len(line) || strings.ContainsRune("/ \t\"';&|)<>", rune(line[end]))
			if before && after {
				return m
			}
			j := strings.Index(line[end:], m)
			if j < 0 {
				break
			}
			i = end + j
		}
	}
	return ""
}
