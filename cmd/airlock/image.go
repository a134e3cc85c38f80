package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/airlock-dev/airlock/imagestore"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

const imageUsage = `usage:
  airlock image pull [--platform OS/ARCH] [--quiet] REF   fetch an image from an OCI/Docker registry
  airlock image import [--name REF] FILE                  store a 'docker save' or OCI archive
  airlock image ls [-a] [--json]                          list named images (-a: also unnamed ones, such as build steps)
  airlock image inspect REF|DIGEST                        print an image as JSON
  airlock image rm [--key ID] REF|DIGEST                  remove an image (and layers no other image uses)
  airlock image publish [--key ID] REF|DIGEST             let every API key use an image (read-only)
  airlock image unpublish [--key ID] REF|DIGEST           make a published image private again

Image names belong to an owner: an API key's images (pulled, built or
snapshotted through the API) are named in that key's own namespace, which
no other key sees; images made here, or before owners existed, are the
operator's (OWNER "-"). A key uses its own images and the public ones;
publish shares one read-only with every key (docs/images.md, "Owners").
--key ID acts in that key's namespace instead of the operator's (any
subcommand: e.g. pull an image for one key only).

Every subcommand takes --state-dir DIR (default $AIRLOCK_STATE_DIR, else
/var/lib/airlock); images live in DIR/images, shared with 'airlock serve
--state-dir DIR'. Registry credentials come from ~/.docker/config.json
($DOCKER_CONFIG) and its credential helpers; 127.0.0.1 and localhost
registries are reached over plain HTTP.
`

func init() { hidden["image"] = cmdImage }

// defaultStateDir is where the CLI keeps state when --state-dir is not given.
func defaultStateDir() string {
	if d := os.Getenv("AIRLOCK_STATE_DIR"); d != "" {
		return d
	}
	return "/var/lib/airlock"
}

// openImages opens the image store of state directory dir.
func openImages(dir string) (*imagestore.Store, error) {
	return imagestore.Open(filepath.Join(dir, "images"), imagestore.Limits{})
}

// cmdImage manages the image store.
func cmdImage(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, imageUsage)
		return exitUsage
	}
	sub, args := args[0], args[1:]
	if sub == "-h" || sub == "-help" || sub == "--help" || sub == "help" {
		fmt.Print(imageUsage)
		return 0
	}
	fs := flag.NewFlagSet("image "+sub, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	stateDir := fs.String("state-dir", defaultStateDir(), "state directory; images are in DIR/images")
	platform := fs.String("platform", "", "os/arch[/variant] to pull from a multi-platform image (default linux/"+goruntime.GOARCH+") (pull)")
	quiet := fs.Bool("quiet", false, "no progress (pull, import)")
	asName := fs.String("name", "", "name the imported image REF (import)")
	asJSON := fs.Bool("json", false, "print JSON (ls)")
	keyID := fs.String("key", "", "act in the namespace of API key ID instead of the operator's (every subcommand)")
	all := fs.Bool("a", false, "list unnamed images too: template build steps, images imported or pulled by digest only (ls)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Print(imageUsage)
			return 0
		}
		fmt.Fprintf(os.Stderr, "airlock image %s: %v\n%s", sub, suggestFlag(fs, err), imageUsage)
		return exitUsage
	}
	want := map[string]int{"pull": 1, "import": 1, "ls": 0, "inspect": 1, "rm": 1, "publish": 1, "unpublish": 1}
	n, ok := want[sub]
	if !ok {
		hint := ""
		if c := closest(sub, []string{"pull", "import", "ls", "inspect", "rm", "publish", "unpublish"}); c != "" {
			hint = fmt.Sprintf("; did you mean %q?", c)
		}
		fmt.Fprintf(os.Stderr, "airlock image: unknown subcommand %q%s\n%s", sub, hint, imageUsage)
		return exitUsage
	}
	if fs.NArg() != n {
		fmt.Fprintf(os.Stderr, "airlock image %s: takes %d argument(s), got %d\n%s", sub, n, fs.NArg(), imageUsage)
		return exitUsage
	}
	st, err := openImages(*stateDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock image %s: %v\n", sub, err)
		return 1
	}
	if *keyID != "" {
		st = st.As(*keyID)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var progress func(imagestore.Progress)
	if !*quiet {
		progress = progressPrinter(os.Stderr, sub+"ing")
	}
	switch sub {
	case "pull":
		img, err := st.Pull(ctx, fs.Arg(0), imagestore.PullOptions{Platform: *platform, Progress: progress})
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock image pull: %v\n", err)
			return 1
		}
		fmt.Printf("%s %s\n", img.Name, img.Digest)
	case "import":
		imgs, err := st.Import(ctx, fs.Arg(0), *asName, progress)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock image import: %v\n", err)
			return 1
		}
		for _, img := range imgs {
			fmt.Printf("%s %s\n", orNone(img.Name), img.Digest)
		}
	case "ls":
		imgs, err := st.List()
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock image ls: %v\n", err)
			return 1
		}
		if !*all {
			imgs = slices.DeleteFunc(imgs, func(img imagestore.Image) bool { return img.Name == "" })
		}
		if *asJSON {
			return printJSON(imgs)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tDIGEST\tSIZE\tLAYERS\tCREATED\tOWNER\tPUBLIC")
		for _, img := range imgs {
			created := "-"
			if !img.Created.IsZero() {
				created = humanize.Time(img.Created)
			}
			owner, pub := img.Owner, "no"
			if owner == "" {
				owner = "-"
			}
			if img.Public {
				pub = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", orNone(img.Name), shortDigest(img.Digest), humanize.IBytes(uint64(img.Size)), len(img.Layers), created, owner, pub)
		}
		tw.Flush()
	case "inspect":
		img, err := st.Get(fs.Arg(0))
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock image inspect: %v\n", err)
			return 1
		}
		return printJSON(img)
	case "rm":
		img, err := st.Remove(fs.Arg(0))
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock image rm: %v\n", err)
			return 1
		}
		fmt.Printf("removed %s %s\n", orNone(img.Name), img.Digest)
	case "publish", "unpublish":
		img, err := st.Publish(fs.Arg(0), sub == "publish")
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock image %s: %v\n", sub, err)
			return 1
		}
		fmt.Printf("%sed %s %s\n", sub, orNone(img.Name), img.Digest)
	}
	return 0
}

func printJSON(v any) int {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(os.Stderr, "airlock image: %v\n", err)
		return 1
	}
	return 0
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

func shortDigest(d string) string {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) > 12 {
		return d[:12]
	}
	return d
}

// progressPrinter prints pull or import progress to w, each line starting
// with verb: at most a line every half second, and the last one.
func progressPrinter(w io.Writer, verb string) func(imagestore.Progress) {
	var last time.Time
	return func(p imagestore.Progress) {
		done := p.Done >= p.Total
		if !done && time.Since(last) < 500*time.Millisecond {
			return
		}
		last = time.Now()
		fmt.Fprintf(w, "%s %s: %s / %s\n", verb, shortDigest(p.Layer), humanize.IBytes(uint64(p.Done)), humanize.IBytes(uint64(p.Total)))
	}
}

// imageServeFlags are the image store flags of 'airlock serve'.
type imageServeFlags struct {
	registries listFlag
}

func (f *imageServeFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.registries, "image-registry", "registry host[:port] that POST /v1/images may pull from (repeatable; \"*\" allows any; none by default: the server fetches what clients name)")
}

// open opens the image store of state directory dir.
func (f *imageServeFlags) open(dir string) (*imagestore.Store, []string, error) {
	st, err := openImages(dir)
	if err != nil {
		return nil, nil, err
	}
	return st, f.registries, nil
}

// runImageFlags are the image flags of 'airlock run'.
type runImageFlags struct {
	ref, stateDir, user string
	// defaultCommand: no command was given; the image's ENTRYPOINT and
	// CMD are the command.
	defaultCommand bool
}

func (f *runImageFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.ref, "image", "", "run in a root made from this OCI image (root only; docs/images.md): the image's files, writable, on disk; runs as the image's root unless the image names a numeric user; without a command, the image's ENTRYPOINT and CMD. A missing image is pulled when its name has a registry (127.0.0.1:5000/py:3.12); one without ('python:3.12') must be in the store: airlock image pull NAME")
	fs.StringVar(&f.stateDir, "state-dir", defaultStateDir(), "state directory whose image store --image uses")
	fs.StringVar(&f.user, "user", "", "with --image: root runs as uid 0 of the sandbox's own user namespace with the capabilities package managers need there (chown, dac_override, fowner, setuid, setgid...; never host root)")
}

// apply makes cfg's root the image (explicit --env values stay over the
// image's) and returns what removes the sandbox's root after the run.
func (f *runImageFlags) apply(ctx context.Context, cfg *native.Config, explicitEnv []string) (func(), error) {
	if f.user != "" && f.user != "root" {
		return nil, fmt.Errorf("--user %q: the only user to ask for is root (default: the image's user)", f.user)
	}
	if f.ref == "" {
		if f.user != "" {
			return nil, errors.New("--user root needs --image: the default root is the host's read-only /usr")
		}
		return func() {}, nil
	}
	if cfg.Policy.Runtime != "" && cfg.Policy.Runtime != policy.RuntimeNative {
		return nil, errors.New("--image works with the native runtime only")
	}
	st, err := openImages(f.stateDir)
	if err != nil {
		return nil, err
	}
	img, err := localOrPull(ctx, st, f.ref)
	if err != nil {
		return nil, err
	}
	if f.defaultCommand {
		cfg.Args = append(append([]string{}, img.Config.Entrypoint...), img.Config.Cmd...)
		if len(cfg.Args) == 0 {
			return nil, fmt.Errorf("image %s has no ENTRYPOINT or CMD: give a command (airlock run --image %s -- CMD [ARGS...])", f.ref, f.ref)
		}
	}
	if err := img.ApplyTo(&cfg.Policy); err != nil {
		return nil, err
	}
	if f.user == "root" {
		cfg.Policy.User.UID, cfg.Policy.User.GID, cfg.Policy.User.Name, cfg.Policy.User.Root = 0, 0, "root", true
	}
	for _, kv := range explicitEnv {
		k, v, _ := strings.Cut(kv, "=")
		cfg.Policy.SetEnv(k, v)
	}
	if cfg.ID == "" {
		cfg.ID = native.NewRunID()
	}
	native.SweepRoots(filepath.Join(f.stateDir, "roots"))
	dir := filepath.Join(f.stateDir, "roots", cfg.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := st.Lease(cfg.ID, img, dir); err != nil {
		native.RemoveImageRoot(dir)
		return nil, err
	}
	cfg.Image = &native.ImageRoot{Layers: img.LayerDirs(), Dir: dir}
	return func() {
		if err := native.RemoveImageRoot(dir); err != nil {
			fmt.Fprintf(os.Stderr, "airlock: %v\n", err)
		}
		_ = st.Release(cfg.ID)
	}, nil
}

// localOrPull finds ref in the store, or pulls it when ref names its
// registry. A name without one (which would mean Docker Hub) is never
// looked up remotely here: a typo must say it is not in the local store,
// not fail on the network; 'airlock image pull' fetches such names.
func localOrPull(ctx context.Context, st *imagestore.Store, ref string) (*imagestore.Image, error) {
	img, err := st.Get(ref)
	if !errors.Is(err, imagestore.ErrNotFound) {
		return img, err
	}
	if !imagestore.HasRegistry(ref) {
		return nil, fmt.Errorf("image %q is not in the local store ('airlock image ls' lists the store); to fetch it from Docker Hub: airlock image pull %s", ref, ref)
	}
	return st.Pull(ctx, ref, imagestore.PullOptions{Progress: progressPrinter(os.Stderr, "pulling")})
}
