package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

func init() { hidden["completion"] = cmdCompletion }

const completionUsage = `usage: airlock completion bash|zsh|fish

Prints a completion script for the shell: verbs, their subcommands and
flags, and the ids of your running sandboxes after exec, logs, kill, pause
and resume (from 'airlock ls -q' with $AIRLOCK_URL, at most 2 seconds).

  bash:  source <(airlock completion bash)      (or save it to /etc/bash_completion.d/airlock)
  zsh:   source <(airlock completion zsh)       (uses bashcompinit)
  fish:  airlock completion fish > ~/.config/fish/completions/airlock.fish
`

// verbSummaries describe the verbs of 'airlock help' for fish's menu.
var verbSummaries = map[string]string{
	"run": "run one command in a fresh sandbox", "serve": "serve the HTTP API", "shell": "code session or terminal against a server",
	"keys": "manage the server's API keys", "image": "manage a local image store", "template": "build an image from a Dockerfile locally",
	"audit": "print the server's audit log", "mcp": "serve sandboxes as MCP tools", "doctor": "report the isolation this host enforces",
	"bench": "measure airlock against peers", "version": "print the version", "help": "print the usage",
	"ls": "list the server's sandboxes", "ps": "list the server's sandboxes", "create": "create a sandbox on the server",
	"exec": "run a command in a sandbox", "logs": "print a process's output", "cp": "copy files into or out of a sandbox",
	"kill": "kill sandboxes", "pause": "pause sandboxes", "resume": "resume sandboxes",
	"images": "the server's images", "volumes": "the server's volumes", "templates": "build an image on the server",
	"completion": "print a shell completion script",
}

// verbSubcommands are the verbs that take a subcommand first.
var verbSubcommands = map[string][]string{
	"keys":       {"create", "list", "revoke", "limits"},
	"image":      {"pull", "import", "ls", "inspect", "rm", "publish", "unpublish"},
	"template":   {"build"},
	"images":     {"ls", "pull", "inspect", "rm"},
	"volumes":    {"ls", "create", "rm"},
	"templates":  {"build"},
	"completion": {"bash", "zsh", "fish"},
}

// sandboxVerbs complete a sandbox id as their first argument.
var sandboxVerbs = []string{"exec", "logs", "kill", "pause", "resume"}

// cmdCompletion is airlock completion.
func cmdCompletion(args []string) int {
	if len(args) != 1 {
		fmt.Fprint(os.Stderr, completionUsage)
		return exitUsage
	}
	var gen func(table []verbFlags) string
	switch args[0] {
	case "bash":
		gen = bashCompletion
	case "zsh":
		gen = func(t []verbFlags) string {
			return "#compdef airlock\n# zsh completion for airlock (airlock completion zsh), through bash's\nautoload -U +X bashcompinit && bashcompinit\n" + bashCompletion(t)
		}
	case "fish":
		gen = fishCompletion
	default:
		return unknownSub("completion", args[0], verbSubcommands["completion"], completionUsage)
	}
	table, err := commandTable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock completion: %v\n", err)
		return 1
	}
	fmt.Print(gen(table))
	return 0
}

// verbFlags is one verb (or "verb sub") and its flags as typed.
type verbFlags struct {
	verb, sub string
	flags     []string
}

// flagInHelp finds flags in a --help text: the flag package's defaults
// ("  -name value") and the usage lines' --names.
var (
	defaultsFlag = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][A-Za-z0-9-]*)`)
	usageFlag    = regexp.MustCompile(`(?:^|[\s\[|(])(--?[a-zA-Z][a-zA-Z0-9-]*)`)
)

// commandTable is the CLI's command table (commands, verbSubcommands)
// with each verb's flags as its own --help lists them: one source, so a
// flag added to a verb is completed without touching this file.
func commandTable() ([]verbFlags, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("locate own binary: %w", err)
	}
	var table []verbFlags
	for _, v := range commands {
		if v == "help" || v == "version" {
			table = append(table, verbFlags{verb: v})
			continue
		}
		table = append(table, verbFlags{verb: v})
		for _, s := range verbSubcommands[v] {
			if v != "completion" {
				table = append(table, verbFlags{verb: v, sub: s})
			}
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := range table {
		if table[i].verb == "help" || table[i].verb == "version" || table[i].verb == "completion" {
			continue
		}
		wg.Add(1)
		go func(vf *verbFlags) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			vf.flags = helpFlags(self, vf.verb, vf.sub)
		}(&table[i])
	}
	wg.Wait()
	return table, nil
}

// helpFlags runs `airlock VERB [SUB] --help` and returns the flags it names.
func helpFlags(self, verb, sub string) []string {
	args := []string{verb}
	if sub != "" {
		args = append(args, sub)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, append(args, "--help")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	out, _ := cmd.Output() // --help's text is what counts, whatever its code
	seen := map[string]bool{}
	var flags []string
	add := func(f string) {
		if !seen[f] {
			seen[f] = true
			flags = append(flags, f)
		}
	}
	for _, m := range defaultsFlag.FindAllStringSubmatch(string(out), -1) {
		if m[1] == "it" || m[1] == "ti" {
			add("-" + m[1]) // docker's spelling
		} else {
			add(dashed(m[1]))
		}
	}
	// Usage lines and their continuations ("   [--max-pids N] ...").
	for _, line := range strings.Split(string(out), "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "usage:") || strings.HasPrefix(t, "airlock ") || strings.HasPrefix(t, "[") || strings.HasPrefix(t, "--") {
			for _, m := range usageFlag.FindAllStringSubmatch(line, -1) {
				add(m[1])
			}
		}
	}
	if len(flags) > 0 {
		add("--help")
	}
	slices.Sort(flags)
	return flags
}

func bashCompletion(table []verbFlags) string {
	var verbs []string
	var flagCases, subCases strings.Builder
	for _, vf := range table {
		key := vf.verb
		if vf.sub == "" {
			verbs = append(verbs, vf.verb)
		} else {
			key += " " + vf.sub
		}
		if len(vf.flags) > 0 {
			fmt.Fprintf(&flagCases, "    %q) echo %q ;;\n", key, strings.Join(vf.flags, " "))
		}
	}
	for _, v := range verbs {
		if subs := verbSubcommands[v]; len(subs) > 0 {
			fmt.Fprintf(&subCases, "    %s) echo %q ;;\n", v, strings.Join(subs, " "))
		}
	}
	return fmt.Sprintf(`# bash completion for airlock (airlock completion bash)
_airlock_flags() {
  case "$1" in
%s  esac
}
_airlock_subs() {
  case "$1" in
%s  esac
}
_airlock() {
  local cur="${COMP_WORDS[COMP_CWORD]}" verb="" sub="" npos=0 i w
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="${COMP_WORDS[i]}"
    [[ $w == -* ]] && continue
    if [[ -z $verb ]]; then verb=$w
    elif [[ -z $sub && -n $(_airlock_subs "$verb") ]]; then sub=$w
    else npos=$((npos + 1)); fi
  done
  if [[ -z $verb ]]; then
    COMPREPLY=($(compgen -W %q -- "$cur"))
    return
  fi
  if [[ $cur == -* ]]; then
    local f
    f=$(_airlock_flags "$verb $sub")
    [[ -z $f ]] && f=$(_airlock_flags "$verb")
    COMPREPLY=($(compgen -W "$f" -- "$cur"))
    return
  fi
  local subs
  subs=$(_airlock_subs "$verb")
  if [[ -n $subs && -z $sub ]]; then
    COMPREPLY=($(compgen -W "$subs" -- "$cur"))
    return
  fi
  case " %s " in
    *" $verb "*)
      if [[ $npos -eq 0 && -n $AIRLOCK_URL ]]; then
        COMPREPLY=($(compgen -W "$(AIRLOCK_TIMEOUT=2s "${COMP_WORDS[0]}" ls -q 2>/dev/null)" -- "$cur"))
        return
      fi ;;
  esac
  COMPREPLY=()
}
complete -o default -F _airlock airlock
`, flagCases.String(), subCases.String(), strings.Join(verbs, " "), strings.Join(sandboxVerbs, " "))
}

func fishCompletion(table []verbFlags) string {
	var b strings.Builder
	b.WriteString("# fish completion for airlock (airlock completion fish)\ncomplete -c airlock -f\n")
	var verbs []string
	for _, vf := range table {
		if vf.sub == "" {
			verbs = append(verbs, vf.verb)
		}
	}
	for _, v := range verbs {
		fmt.Fprintf(&b, "complete -c airlock -n '__fish_use_subcommand' -a %s -d %q\n", v, verbSummaries[v])
		if subs := verbSubcommands[v]; len(subs) > 0 {
			fmt.Fprintf(&b, "complete -c airlock -n '__fish_seen_subcommand_from %s; and not __fish_seen_subcommand_from %s' -a %q\n",
				v, strings.Join(subs, " "), strings.Join(subs, " "))
		}
	}
	for _, vf := range table {
		cond := "__fish_seen_subcommand_from " + vf.verb
		if vf.sub != "" {
			cond += "; and __fish_seen_subcommand_from " + vf.sub
		}
		for _, f := range vf.flags {
			opt := "-o " + strings.TrimLeft(f, "-") // -it, -e: old-style
			if strings.HasPrefix(f, "--") {
				opt = "-l " + f[2:]
			}
			fmt.Fprintf(&b, "complete -c airlock -n '%s' %s\n", cond, opt)
		}
	}
	fmt.Fprintf(&b, "complete -c airlock -n '__fish_seen_subcommand_from %s; and set -q AIRLOCK_URL' -a '(env AIRLOCK_TIMEOUT=2s airlock ls -q 2>/dev/null)'\n",
		strings.Join(sandboxVerbs, " "))
	b.WriteString("complete -c airlock -n '__fish_seen_subcommand_from cp run template templates image' -F\n")
	return b.String()
}
