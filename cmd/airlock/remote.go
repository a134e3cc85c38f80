package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/airlock-dev/airlock/client"
)

// Verbs that drive a running server (docs/cli.md): they find it through
// --url/--api-key or $AIRLOCK_URL/$AIRLOCK_API_KEY and talk to it with the
// Go client.
func init() {
	for name, f := range map[string]func([]string) int{
		"ls": cmdLs, "ps": cmdLs, "create": cmdCreate, "exec": cmdExec, "logs": cmdLogs, "cp": cmdCp,
		"kill": cmdKill, "pause": cmdPause, "resume": cmdResume,
		"images": cmdImages, "volumes": cmdVolumes, "templates": cmdTemplates,
	} {
		hidden[name] = f
	}
	commands = append(commands, "ls", "ps", "create", "exec", "logs", "cp", "kill", "pause", "resume",
		"images", "volumes", "templates", "completion")
}

// exitRemote is a remote verb's code for an error of the server or of
// reaching it (a sandboxed command's own code passes through exec).
const exitRemote = 1

// remote is what every remote verb shares: its name, usage, flag set and
// the server's address and key.
type remote struct {
	name, usage string
	fs          *flag.FlagSet
	url, key    string
	// pos are the positional arguments. Flags may follow them (kill ID
	// --url U), except where the rest is a command (exec: cmdStart).
	pos []string
	// cmdStart ends flag parsing at the Nth positional argument (0: never).
	cmdStart int
}

// arg is the i-th positional argument, or "".
func (r *remote) arg(i int) string {
	if i < len(r.pos) {
		return r.pos[i]
	}
	return ""
}

// newRemote starts a remote verb's flag set with --url and --api-key.
func newRemote(name, usage string) *remote {
	r := &remote{name: name, usage: usage, fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	r.fs.SetOutput(io.Discard)
	r.fs.StringVar(&r.url, "url", "", "server URL, e.g. http://127.0.0.1:7070 (default $AIRLOCK_URL)")
	r.fs.StringVar(&r.key, "api-key", "", "API key, al_... (default $AIRLOCK_API_KEY)")
	return r
}

// parse parses args and connects; when it returns a nil client, the verb
// exits with code (0 after --help).
func (r *remote) parse(args []string) (*client.Client, int) {
	for {
		if err := r.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Print(r.usage)
				r.fs.SetOutput(os.Stdout)
				r.fs.PrintDefaults()
				return nil, 0
			}
			return nil, r.usageError(suggestFlag(r.fs, err).Error())
		}
		rest := r.fs.Args()
		afterDashes := len(args) > len(rest) && args[len(args)-len(rest)-1] == "--"
		if len(rest) == 0 || afterDashes || (r.cmdStart > 0 && len(r.pos)+1 >= r.cmdStart) {
			r.pos = append(r.pos, rest...)
			break
		}
		r.pos = append(r.pos, rest[0])
		args = rest[1:]
	}
	c, err := client.Config{URL: r.url, APIKey: r.key}.WithEnv().New()
	if errors.Is(err, client.ErrNoURL) {
		return nil, r.usageError("the server's URL is required: --url URL or $AIRLOCK_URL")
	}
	if err != nil {
		return nil, r.usageError(strings.TrimPrefix(err.Error(), "airlock: "))
	}
	return c, 0
}

// usageError prints msg and the verb's usage and returns exitUsage.
func (r *remote) usageError(msg string) int {
	fmt.Fprintf(os.Stderr, "airlock %s: %s\n%s", r.name, msg, r.usage)
	return exitUsage
}

// args checks the count of positional arguments (max -1: any).
func (r *remote) args(min, max int) bool {
	n := len(r.pos)
	return n >= min && (max < 0 || n <= max)
}

// fail prints an error of the server (or of reaching it) and returns
// exitRemote; after a signal it says so and returns 130 or 143.
func (r *remote) fail(err error, caught func() os.Signal) int {
	if caught != nil {
		if s := caught(); s != nil {
			return interrupted("airlock "+r.name, "stopped waiting for the server", s)
		}
	}
	msg := strings.TrimPrefix(err.Error(), "airlock: ")
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		msg += " (is `airlock serve` running there? --url or $AIRLOCK_URL names it)"
	}
	fmt.Fprintf(os.Stderr, "airlock %s: %s\n", r.name, msg)
	return exitRemote
}

// allStates are the states `ls -a` lists.
var allStates = []string{"running", "exited", "killed", "expired", "lost"}

const lsUsage = `usage: airlock ls [-a] [-q] [--json] [--label KEY=VALUE]...   (also: airlock ps)

Lists your sandboxes on the server: running ones, or with -a ended ones
too; paused ones show as "paused".
`

// cmdLs is airlock ls / ps.
func cmdLs(args []string) int {
	r := newRemote("ls", lsUsage)
	all := r.fs.Bool("a", false, "ended sandboxes too")
	quiet := r.fs.Bool("q", false, "ids only")
	asJSON := r.fs.Bool("json", false, "print JSON")
	var labels listFlag
	r.fs.Var(&labels, "label", "only sandboxes with metadata KEY=VALUE (repeatable)")
	c, code := r.parse(args)
	if c == nil {
		return code
	}
	if !r.args(0, 0) {
		return r.usageError("takes no arguments")
	}
	meta, err := keyValues("--label", labels)
	if err != nil {
		return r.usageError(err.Error())
	}
	var states []string
	if *all {
		states = allStates
	}
	ctx, stop, caught := interruptContext()
	defer stop()
	sbs, err := c.List(ctx, meta, states...)
	if err != nil {
		return r.fail(err, caught)
	}
	printList(sbs, *asJSON, *quiet, func(sb client.Sandbox) string { return sb.ID },
		"ID\tSTATE\tRUNTIME\tPROFILE\tCREATED\tEXPIRES\tLABELS", func(sb client.Sandbox) []string {
			state := sb.State
			if sb.Paused {
				state = "paused"
			} else if sb.EndReason != "" && sb.State != "running" && !strings.HasPrefix(sb.EndReason, sb.State) {
				state += " (" + sb.EndReason + ")"
			}
			expires := "-"
			if sb.ExpiresAt != nil && sb.State == "running" {
				expires = humanize.Time(*sb.ExpiresAt)
			}
			return []string{sb.ID, state, orDash(sb.Runtime), orDash(sb.Profile), humanize.Time(sb.CreatedAt), expires, labelText(sb.Metadata)}
		})
	return 0
}

// printList prints items as JSON (an empty list, never null), as ids
// one a line, or as a table under header.
func printList[T any](items []T, asJSON, quiet bool, id func(T) string, header string, row func(T) []string) {
	switch {
	case asJSON:
		if items == nil {
			items = []T{}
		}
		printJSON(items)
	case quiet:
		for _, it := range items {
			fmt.Println(id(it))
		}
	default:
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, header)
		for _, it := range items {
			fmt.Fprintln(tw, strings.Join(row(it), "\t"))
		}
		tw.Flush()
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// labelText is metadata as sorted k=v pairs.
func labelText(m map[string]string) string {
	var kv []string
	for k, v := range m {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return orDash(strings.Join(kv, ","))
}

// keyValues parses KEY=VALUE flags into a map.
func keyValues(flagName string, l []string) (map[string]string, error) {
	m := map[string]string{}
	for _, kv := range l {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE", flagName, kv)
		}
		m[k] = v
	}
	return m, nil
}

const createUsage = `usage: airlock create [flags]

Creates a sandbox on the server and prints its id. It lives until
--timeout (the TTL) passes or 'airlock kill ID'.
`

// cmdCreate is airlock create.
func cmdCreate(args []string) int {
	r := newRemote("create", createUsage)
	image := r.fs.String("image", "", "root from this image of the server's store (airlock images)")
	profile := r.fs.String("profile", "", "strict, standard or light (default the server's)")
	runtimeName := r.fs.String("runtime", "", "native, gvisor, wasm or microvm (default the server's)")
	ttl := r.fs.Duration("timeout", 0, "the sandbox's TTL, e.g. 30m (default the server's)")
	user := r.fs.String("user", "", `"root": uid 0 of the sandbox's own user namespace (image roots)`)
	snapshot := r.fs.String("snapshot", "", "fork a gvisor sandbox from this memory snapshot")
	var memory, disk sizeFlag
	r.fs.Var(&memory, "memory", "memory limit, e.g. 1G (default the profile's)")
	r.fs.Var(&disk, "disk", "disk limit, e.g. 2G (default the profile's)")
	cpus := r.fs.Float64("cpus", 0, "CPU limit (default the profile's)")
	pids := r.fs.Int64("pids", 0, "process limit (default the profile's)")
	var env, labels, volumes, allow listFlag
	r.fs.Var(&env, "env", "KEY=VALUE in the sandbox's environment (repeatable)")
	r.fs.Var(&env, "e", "short for --env")
	r.fs.Var(&labels, "label", "metadata KEY=VALUE (repeatable)")
	r.fs.Var(&volumes, "volume", "NAME:PATH mounts a volume of yours (airlock volumes) read-write (repeatable)")
	r.fs.Var(&allow, "allow", "let the sandbox reach HOST[:PORT] through the egress proxy (repeatable; default no network)")
	netOpen := r.fs.Bool("net-open", false, "let the sandbox reach any address the server's egress policy permits")
	quiet := r.fs.Bool("q", false, "print the id only (the default when stdout is not a terminal)")
	c, code := r.parse(args)
	if c == nil {
		return code
	}
	if !r.args(0, 0) {
		return r.usageError("takes no arguments (flags only)")
	}
	req := client.CreateRequest{Image: *image, Profile: *profile, Runtime: *runtimeName, TTL: *ttl, User: *user, Snapshot: *snapshot}
	var err error
	if req.Env, err = keyValues("--env", env); err != nil {
		return r.usageError(err.Error())
	}
	if req.Metadata, err = keyValues("--label", labels); err != nil {
		return r.usageError(err.Error())
	}
	if *ttl < 0 {
		return r.usageError("--timeout must be positive")
	}
	if memory != 0 || disk != 0 || *cpus != 0 || *pids != 0 {
		req.Limits = &client.Limits{MemoryBytes: int64(memory), DiskBytes: int64(disk), CPUs: *cpus, Pids: *pids}
	}
	for _, v := range volumes {
		name, path, ok := strings.Cut(v, ":")
		if !ok || name == "" || !strings.HasPrefix(path, "/") {
			return r.usageError(fmt.Sprintf("--volume %q: want NAME:/PATH", v))
		}
		req.Volumes = append(req.Volumes, client.VolumeRef{Name: name, Path: path})
	}
	switch {
	case *netOpen && len(allow) > 0:
		return r.usageError("--net-open and --allow: give one")
	case *netOpen:
		req.Network = &client.Network{Mode: "open"}
	case len(allow) > 0:
		req.Network = &client.Network{Mode: "allowlist", Allow: allow}
	}
	ctx, stop, caught := interruptContext()
	defer stop()
	sb, err := c.Create(ctx, req)
	if err != nil {
		if s := caught(); s != nil {
			// The server may have made it as we left: say how to find it.
			return interrupted("airlock create", "the sandbox may still have been created: see 'airlock ls'", s)
		}
		return r.fail(err, nil)
	}
	fmt.Println(sb.ID)
	if !*quiet && isTerminal(os.Stdout) {
		exp := ""
		if sb.ExpiresAt != nil {
			exp = ", expires " + humanize.Time(*sb.ExpiresAt)
		}
		fmt.Fprintf(os.Stderr, "runtime %s, profile %s%s\n", orDash(sb.Runtime), sb.Profile, exp)
	}
	return 0
}

// sandboxesVerb runs do on each sandbox id in args: kill, pause, resume.
func sandboxesVerb(name, usage string, args []string, do func(context.Context, *client.Client, string) error) int {
	r := newRemote(name, usage)
	c, code := r.parse(args)
	if c == nil {
		return code
	}
	if !r.args(1, -1) {
		return r.usageError("name at least one sandbox")
	}
	ctx, stop, caught := interruptContext()
	defer stop()
	return r.each(caught, func(id string) error { return do(ctx, c, id) })
}

// each runs do on every argument, printing those done on stdout and
// those failed on stderr; any failure makes the result exitRemote.
func (r *remote) each(caught func() os.Signal, do func(arg string) error) int {
	status := 0
	for _, arg := range r.pos {
		if err := do(arg); err != nil {
			if s := caught(); s != nil {
				return interrupted("airlock "+r.name, "stopped before every one was done", s)
			}
			fmt.Fprintf(os.Stderr, "airlock %s: %s: %s\n", r.name, arg, strings.TrimPrefix(err.Error(), "airlock: "))
			status = exitRemote
			continue
		}
		fmt.Println(arg)
	}
	return status
}

func cmdKill(args []string) int {
	return sandboxesVerb("kill", "usage: airlock kill SANDBOX...\n\nKills sandboxes (their files go with them).\n", args,
		func(ctx context.Context, c *client.Client, id string) error { return c.Kill(ctx, id) })
}

func cmdPause(args []string) int {
	return sandboxesVerb("pause", "usage: airlock pause SANDBOX...\n\nStops every process of the sandboxes until 'airlock resume' (the TTL counts on).\n", args,
		func(ctx context.Context, c *client.Client, id string) error { _, err := c.Pause(ctx, id); return err })
}

func cmdResume(args []string) int {
	return sandboxesVerb("resume", "usage: airlock resume SANDBOX...\n\nResumes paused sandboxes.\n", args,
		func(ctx context.Context, c *client.Client, id string) error { _, err := c.Resume(ctx, id); return err })
}

const logsUsage = `usage: airlock logs [-f] SANDBOX [PID]

Prints a process's output so far (stdout to stdout, stderr to stderr): the
process PID, or the sandbox's most recently started one. -f follows it
until it exits (Ctrl-C only stops following).
`

// cmdLogs is airlock logs.
func cmdLogs(args []string) int {
	r := newRemote("logs", logsUsage)
	follow := r.fs.Bool("f", false, "follow the output until the process exits")
	r.fs.BoolVar(follow, "follow", false, "same as -f")
	c, code := r.parse(args)
	if c == nil {
		return code
	}
	if !r.args(1, 2) {
		return r.usageError("name a sandbox and at most one PID")
	}
	id := r.arg(0)
	ctx, stop, caught := interruptContext()
	defer stop()
	pid := 0
	if len(r.pos) == 2 {
		if _, err := fmt.Sscanf(r.arg(1), "%d", &pid); err != nil || pid <= 0 || fmt.Sprint(pid) != r.arg(1) {
			return r.usageError(fmt.Sprintf("PID %q: want a number", r.arg(1)))
		}
	} else {
		procs, err := c.Processes(ctx, id)
		if err != nil {
			return r.fail(err, caught)
		}
		var latest *client.Process
		for i := range procs {
			if latest == nil || procs[i].StartedAt.After(latest.StartedAt) {
				latest = &procs[i]
			}
		}
		if latest == nil {
			fmt.Fprintf(os.Stderr, "airlock logs: sandbox %s has no process\n", id)
			return exitRemote
		}
		pid = latest.Pid
	}
	if !*follow {
		l, err := c.Logs(ctx, id, pid, 16<<20)
		if err != nil {
			return r.fail(err, caught)
		}
		os.Stdout.Write(l.Stdout)
		os.Stderr.Write(l.Stderr)
		if l.Truncated {
			fmt.Fprintln(os.Stderr, "airlock logs: [only the last part of the output is kept]")
		}
		return 0
	}
	st, err := c.Attach(ctx, id, pid)
	if err != nil {
		return r.fail(err, caught)
	}
	defer st.Close()
	ev, err := relay(st)
	switch {
	case errors.Is(err, io.EOF) || err == nil && ev.Type == "exit":
		return 0
	case err != nil:
		if s := caught(); s != nil {
			return interrupted("airlock logs", "stopped following; the process runs on", s)
		}
		return r.fail(err, nil)
	}
	fmt.Fprintf(os.Stderr, "airlock logs: %s\n", ev.Data)
	return exitRemote
}

// relay writes a process stream's stdout and stderr here until its exit
// or error event, which it returns, or a read error (io.EOF when the
// stream ends without either).
func relay(st *client.Stream) (client.Event, error) {
	for {
		ev, err := st.Next()
		if err != nil {
			return ev, err
		}
		switch ev.Type {
		case "stdout":
			os.Stdout.Write(ev.Data)
		case "stderr":
			os.Stderr.Write(ev.Data)
		case "exit", "error":
			return ev, nil
		}
	}
}

const imagesUsage = `usage:
  airlock images [ls] [-q] [--json]     list the images your key may use (yours and the public ones)
  airlock images pull [--platform P] REF  pull REF from a registry on the server's allowlist
  airlock images inspect REF             print an image as JSON
  airlock images rm REF...               remove images of yours

These act on the server's store ($AIRLOCK_URL); 'airlock image' (singular)
manages a local state directory's store instead.
`

// cmdImages is airlock images.
func cmdImages(args []string) int {
	sub := "ls"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	r := newRemote("images "+sub, imagesUsage)
	quiet := r.fs.Bool("q", false, "names (or digests) only (ls)")
	asJSON := r.fs.Bool("json", false, "print JSON (ls)")
	platform := r.fs.String("platform", "", "os/arch[/variant] (pull)")
	switch sub {
	case "ls", "pull", "inspect", "rm":
	default:
		return unknownSub("images", sub, []string{"ls", "pull", "inspect", "rm"}, imagesUsage)
	}
	c, code := r.parse(args)
	if c == nil {
		return code
	}
	ctx, stop, caught := interruptContext()
	defer stop()
	switch sub {
	case "ls":
		if !r.args(0, 0) {
			return r.usageError("ls takes no arguments")
		}
		imgs, err := c.Images(ctx)
		if err != nil {
			return r.fail(err, caught)
		}
		printList(imgs, *asJSON, *quiet, func(img client.Image) string { return cmpOr(img.Name, img.Digest) },
			"NAME\tDIGEST\tSIZE\tCREATED\tPUBLIC", func(img client.Image) []string {
				created := "-"
				if !img.Created.IsZero() {
					created = humanize.Time(img.Created)
				}
				return []string{orNone(img.Name), shortDigest(img.Digest), humanize.IBytes(uint64(img.Size)), created, fmt.Sprint(img.Public)}
			})
	case "pull", "inspect":
		if !r.args(1, 1) {
			return r.usageError(sub + " takes one REF")
		}
		var img *client.Image
		var err error
		if sub == "pull" {
			img, err = c.PullImage(ctx, r.arg(0), *platform)
		} else {
			img, err = c.Image(ctx, r.arg(0))
		}
		if err != nil {
			return r.fail(err, caught)
		}
		if sub == "pull" {
			fmt.Printf("%s %s\n", orNone(img.Name), img.Digest)
		} else {
			printJSON(img)
		}
	case "rm":
		if !r.args(1, -1) {
			return r.usageError("rm takes one or more REFs")
		}
		return r.each(caught, func(ref string) error { _, err := c.RemoveImage(ctx, ref); return err })
	}
	return 0
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// unknownSub answers an unknown subcommand of verb.
func unknownSub(verb, sub string, subs []string, usage string) int {
	if sub == "help" || sub == "-h" || sub == "--help" {
		fmt.Print(usage)
		return 0
	}
	hint := ""
	if c := closest(sub, subs); c != "" {
		hint = fmt.Sprintf("; did you mean %q?", c)
	}
	fmt.Fprintf(os.Stderr, "airlock %s: unknown subcommand %q%s\n%s", verb, sub, hint, usage)
	return exitUsage
}

const volumesUsage = `usage:
  airlock volumes [ls] [--json]          list your volumes
  airlock volumes create --size SIZE NAME  create a volume (4M to 1T; it outlives sandboxes)
  airlock volumes rm NAME...             delete volumes and their data

Mount one with 'airlock create --volume NAME:/PATH'.
`

// cmdVolumes is airlock volumes.
func cmdVolumes(args []string) int {
	sub := "ls"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "ls", "create", "rm":
	default:
		return unknownSub("volumes", sub, []string{"ls", "create", "rm"}, volumesUsage)
	}
	r := newRemote("volumes "+sub, volumesUsage)
	asJSON := r.fs.Bool("json", false, "print JSON (ls)")
	var size sizeFlag
	r.fs.Var(&size, "size", "the volume's size, e.g. 1G (create)")
	c, code := r.parse(args)
	if c == nil {
		return code
	}
	ctx, stop, caught := interruptContext()
	defer stop()
	switch sub {
	case "ls":
		vols, err := c.Volumes(ctx)
		if err != nil {
			return r.fail(err, caught)
		}
		printList(vols, *asJSON, false, nil, "NAME\tSIZE\tCREATED", func(v client.Volume) []string {
			return []string{v.Name, humanize.IBytes(uint64(v.SizeBytes)), humanize.Time(v.CreatedAt)}
		})
	case "create":
		if !r.args(1, 1) || size == 0 {
			return r.usageError("create takes --size SIZE and one NAME")
		}
		v, err := c.CreateVolume(ctx, r.arg(0), int64(size))
		if err != nil {
			return r.fail(err, caught)
		}
		fmt.Println(v.Name)
	case "rm":
		if !r.args(1, -1) {
			return r.usageError("rm takes one or more NAMEs")
		}
		return r.each(caught, func(name string) error { _, err := c.DeleteVolume(ctx, name); return err })
	}
	return 0
}

const templatesUsage = `usage: airlock templates build -t NAME [-f DOCKERFILE] [--build-arg K=V]... [--no-cache] [--runtime R] [CONTEXT]

Builds an image from a Dockerfile on the server (POST /v1/templates): the
Dockerfile and the regular files of CONTEXT (default the Dockerfile's
directory; symlinks and .git are left out) travel in the request, at most
about 750 KiB together. The log goes to stderr, the image's name and digest
to stdout. 'airlock images' lists what was built; 'airlock create --image
NAME' runs it. 'airlock template build' (singular) builds into a local
state directory instead.
`

// maxTemplateContext bounds a context's raw bytes: base64 of it must fit
// the server's 1 MiB JSON body.
const maxTemplateContext = 750 << 10

// cmdTemplates is airlock templates build.
func cmdTemplates(args []string) int {
	if len(args) == 0 || args[0] != "build" {
		sub := ""
		if len(args) > 0 {
			sub = args[0]
		}
		if sub == "" {
			fmt.Fprint(os.Stderr, templatesUsage)
			return exitUsage
		}
		return unknownSub("templates", sub, []string{"build"}, templatesUsage)
	}
	r := newRemote("templates build", templatesUsage)
	file := r.fs.String("f", "", "the Dockerfile (default CONTEXT/Dockerfile)")
	name := r.fs.String("t", "", "name of the image to build (required)")
	noCache := r.fs.Bool("no-cache", false, "run every step again")
	runtimeName := r.fs.String("runtime", "", "the tier RUN steps run under: native or gvisor (default the server's)")
	var buildArgs listFlag
	r.fs.Var(&buildArgs, "build-arg", "KEY=VALUE for an ARG (repeatable)")
	c, code := r.parse(args[1:])
	if c == nil {
		return code
	}
	if *name == "" || !r.args(0, 1) {
		return r.usageError("-t NAME and at most one CONTEXT")
	}
	bargs, err := keyValues("--build-arg", buildArgs)
	if err != nil {
		return r.usageError(err.Error())
	}
	ctxDir := r.arg(0)
	if ctxDir == "" {
		ctxDir = "."
		if *file != "" {
			ctxDir = dirOf(*file)
		}
	}
	if *file == "" {
		*file = ctxDir + "/Dockerfile"
	}
	df, err := os.ReadFile(*file)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock templates build: %v\n", err)
		return exitUsage
	}
	files, err := contextFiles(ctxDir, maxTemplateContext-len(df))
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock templates build: context %s: %v\n", ctxDir, err)
		return exitUsage
	}
	ctx, stop, caught := interruptContext()
	defer stop()
	start := time.Now()
	res, err := c.BuildTemplate(ctx, client.TemplateRequest{Name: *name, Dockerfile: string(df), Files: files,
		BuildArgs: bargs, NoCache: *noCache, Runtime: *runtimeName})
	if err != nil {
		if s := caught(); s != nil {
			return interrupted("airlock templates build", "stopped waiting; the server may finish the build", s)
		}
		return r.fail(err, nil)
	}
	os.Stderr.WriteString(res.Log)
	fmt.Fprintf(os.Stderr, "built in %s: %d steps, %d cached\n", time.Since(start).Round(time.Millisecond), res.Steps, res.Cached)
	if res.Image != nil {
		fmt.Printf("%s %s\n", orNone(res.Image.Name), res.Image.Digest)
	}
	return 0
}

// dirOf is path's directory ("." for a bare name).
func dirOf(path string) string {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[:max(i, 1)]
	}
	return "."
}
