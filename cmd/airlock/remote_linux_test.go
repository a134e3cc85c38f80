package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
	"github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// remoteCLI runs the CLI against a server: env adds to a bare
// environment, stdin feeds it.
type remoteCLI struct {
	t   *testing.T
	env []string
	dir string
}

func (r remoteCLI) run(stdin string, args ...string) (stdout, stderr string, code int) {
	r.t.Helper()
	cmd := exec.Command(airlockBin(r.t), args...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=/tmp"}, r.env...)
	cmd.Dir = r.dir
	cmd.Stdin = strings.NewReader(stdin)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		r.t.Fatal(err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// must runs args and fails the test unless they exit 0.
func (r remoteCLI) must(stdin string, args ...string) string {
	r.t.Helper()
	out, errOut, code := r.run(stdin, args...)
	if code != 0 {
		r.t.Fatalf("airlock %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
	}
	return out
}

// startRemote starts a server with auth and returns a CLI set up for it
// through $AIRLOCK_URL and $AIRLOCK_API_KEY, and a Go client.
func startRemote(t *testing.T) (remoteCLI, *client.Client, *testserver.Server) {
	testserver.NeedRoot(t)
	state := testserver.StateDir(t)
	key := testserver.NewKey(t, state, "cli")
	srv := testserver.Start(t, state)
	return remoteCLI{t: t, env: []string{"AIRLOCK_URL=" + srv.URL, "AIRLOCK_API_KEY=" + key}, dir: t.TempDir()},
		client.New(srv.URL, key), srv
}

// TestRemoteVerbs drives a real server with every verb: create, ls/ps,
// exec (output, exit codes, stdin, env, workdir, timeout), logs, pause,
// resume, images, volumes, kill; and the errors of a wrong key and of no
// URL.
func TestRemoteVerbs(t *testing.T) {
	cli, c, srv := startRemote(t)
	id := strings.TrimSpace(cli.must("", "create", "--label", "who=cli", "--timeout", "20m"))
	if !strings.HasPrefix(id, "sb-") {
		t.Fatalf("create printed %q, want an id", id)
	}
	if out := cli.must("", "ls"); !strings.Contains(out, id) || !strings.Contains(out, "who=cli") || !strings.Contains(out, "running") {
		t.Errorf("ls: %q", out)
	}
	if out := cli.must("", "ps", "-q", "--label", "who=cli"); out != id+"\n" {
		t.Errorf("ps -q --label: %q", out)
	}
	if out := cli.must("", "ls", "-q", "--label", "who=other"); out != "" {
		t.Errorf("ls --label who=other: %q", out)
	}
	var listed []client.Sandbox
	if err := json.Unmarshal([]byte(cli.must("", "ls", "--json")), &listed); err != nil || len(listed) != 1 || listed[0].ID != id {
		t.Errorf("ls --json: %v %+v", err, listed)
	} else if left := time.Until(*listed[0].ExpiresAt); left < 15*time.Minute || left > 21*time.Minute {
		t.Errorf("create --timeout 20m: expires in %v", left)
	}

	for _, tc := range []struct {
		stdin      string
		args       []string
		out, err   string
		code       int
		errMessage string
	}{
		{"", []string{id, "sh", "-c", "echo out; echo err >&2; exit 7"}, "out\n", "err\n", 7, ""},
		{"", []string{"-e", "A=1", "-w", "/tmp", id, "sh", "-c", `echo "$A $(pwd)"`}, "1 /tmp\n", "", 0, ""},
		{"fed in\n", []string{"-i", id, "cat"}, "fed in\n", "", 0, ""},
		{"not read\n", []string{id, "cat"}, "", "", 0, ""}, // no -i: no stdin
		// -i streams: more than a request body holds, characters split
		// between chunks, a reader that stops early, input it cannot carry.
		{strings.Repeat("a", 3<<20), []string{"-i", id, "wc", "-c"}, "3145728\n", "", 0, ""},
		{strings.Repeat("é", 40000), []string{"-i", id, "sh", "-c", "wc -c; echo done"}, "80000\ndone\n", "", 0, ""},
		{strings.Repeat("line\n", 200000), []string{"-i", id, "head", "-1"}, "line\n", "", 0, ""},
		{"\xff\xfe", []string{"-i", id, "cat"}, "", "", exitRemote, "not UTF-8"},
		{"x", []string{"-i", "--timeout", "1s", id, "sleep", "60"}, "", "", exitTimeout, "--timeout 1s"},
		{"", []string{id, "sh", "-c", "kill -9 $$"}, "", "", 137, ""},
		{"", []string{id, "no-such-command"}, "", "", exitNotFound, "not found"},
		{"", []string{id, "/etc/passwd"}, "", "", exitNotExec, ""},
		{"", []string{"--timeout", "1s", id, "sleep", "60"}, "", "", exitTimeout, "--timeout 1s"},
		{"", []string{"sb-nonexistent", "true"}, "", "", exitRemote, "not_found"},
		// After CMD every word is CMD's, flags and -- included.
		{"", []string{id, "printf", "%s|", "-e", "--timeout", "--", "x"}, "-e|--timeout|--|x|", "", 0, ""},
	} {
		out, errOut, code := cli.run(tc.stdin, append([]string{"exec"}, tc.args...)...)
		if code != tc.code || out != tc.out || (tc.err != "" && errOut != tc.err) || !strings.Contains(errOut, tc.errMessage) {
			t.Errorf("exec %v: exit %d stdout %q stderr %q; want %d %q %q (%q)", tc.args, code, out, errOut, tc.code, tc.out, tc.err, tc.errMessage)
		}
	}

	// logs: a background process's output, by pid and by default (the
	// latest), and followed to its end.
	ctx := context.Background()
	pid, err := c.Start(ctx, id, client.ExecRequest{Shell: "echo one; echo two >&2; sleep 2; echo three"})
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code := cli.run("", "logs", "-f", id)
	if code != 0 || out != "one\nthree\n" || errOut != "two\n" {
		t.Errorf("logs -f: exit %d stdout %q stderr %q", code, out, errOut)
	}
	if out := cli.must("", "logs", id, strconv.Itoa(pid)); out != "one\nthree\n" {
		t.Errorf("logs ID PID: %q", out)
	}

	if out := cli.must("", "pause", id); out != id+"\n" {
		t.Errorf("pause: %q", out)
	}
	if out := cli.must("", "ls"); !strings.Contains(out, "paused") {
		t.Errorf("ls after pause: %q", out)
	}
	if _, errOut, code := cli.run("", "exec", id, "true"); code != exitRemote || !strings.Contains(errOut, "paused") {
		t.Errorf("exec in a paused sandbox: exit %d, stderr %q", code, errOut)
	}
	cli.must("", "resume", id)
	if out := cli.must("", "exec", id, "echo", "back"); out != "back\n" {
		t.Errorf("exec after resume: %q", out)
	}

	if out := cli.must("", "images"); !strings.HasPrefix(out, "NAME") {
		t.Errorf("images: %q", out)
	}
	cli.must("", "volumes", "create", "cli-vol", "--size", "8M") // flags may follow arguments
	var vols []client.Volume
	if err := json.Unmarshal([]byte(cli.must("", "volumes", "ls", "--json")), &vols); err != nil || len(vols) != 1 || vols[0].Name != "cli-vol" || vols[0].SizeBytes != 8<<20 {
		t.Errorf("volumes ls --json: %v %+v", err, vols)
	}
	cli.must("", "volumes", "rm", "cli-vol")
	if out := cli.must("", "volumes"); strings.Contains(out, "cli-vol") {
		t.Errorf("volume left after rm: %q", out)
	}

	// kill: one unknown id fails the command, the known one is killed.
	out, errOut, code = cli.run("", "kill", id, "sb-nonexistent")
	if code != exitRemote || out != id+"\n" || !strings.Contains(errOut, "sb-nonexistent") {
		t.Errorf("kill: exit %d stdout %q stderr %q", code, out, errOut)
	}
	if out := cli.must("", "ls", "-q"); out != "" {
		t.Errorf("ls after kill: %q", out)
	}
	if out := cli.must("", "ls", "-a"); !strings.Contains(out, id) || !strings.Contains(out, "killed") {
		t.Errorf("ls -a after kill: %q", out)
	}

	// A wrong key is the server's 401; no URL is a usage error; flags win
	// over the environment.
	bad := remoteCLI{t: t, env: []string{"AIRLOCK_URL=" + srv.URL, "AIRLOCK_API_KEY=al_wrong"}}
	if _, errOut, code := bad.run("", "ls"); code != exitRemote || !strings.Contains(errOut, "401") {
		t.Errorf("wrong key: exit %d, stderr %q", code, errOut)
	}
	goodKey := strings.TrimPrefix(cli.env[1], "AIRLOCK_API_KEY=")
	if _, errOut, code := bad.run("", "ls", "--api-key", goodKey); code != 0 {
		t.Errorf("--api-key over $AIRLOCK_API_KEY: exit %d, stderr %q", code, errOut)
	}
	none := remoteCLI{t: t}
	if _, errOut, code := none.run("", "ls"); code != exitUsage || !strings.Contains(errOut, "--url URL or $AIRLOCK_URL") {
		t.Errorf("no URL: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := none.run("", "ls", "--url", "http://127.0.0.1:1"); code != exitRemote || !strings.Contains(errOut, "airlock serve") {
		t.Errorf("nothing listening: exit %d, stderr %q", code, errOut)
	}
}

// TestRemoteCp copies files and trees in and out. Copying out treats the
// sandbox as hostile: a symlink it planted pointing at a host file is
// recreated as a link and never written through, set-id bits are dropped,
// and a failed copy leaves the previous destination untouched and no
// temporary file.
func TestRemoteCp(t *testing.T) {
	cli, _, _ := startRemote(t)
	id := strings.TrimSpace(cli.must("", "create"))
	local := cli.dir
	src := filepath.Join(local, "src")
	for p, content := range map[string]string{"a.txt": "alpha\n", "sub/b.txt": "beta\n"} {
		os.MkdirAll(filepath.Join(src, filepath.Dir(p)), 0o755)
		if err := os.WriteFile(filepath.Join(src, p), []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink("/etc/passwd", filepath.Join(src, "link"))
	_, errOut, code := cli.run("", "cp", src, id+":/workspace/")
	if code != 0 || !strings.Contains(errOut, "skipped") {
		t.Fatalf("cp in: exit %d, stderr %q (want a warning for the symlink)", code, errOut)
	}
	if out := cli.must("", "exec", id, "sh", "-c", "cat /workspace/src/a.txt src/sub/b.txt; stat -c %a src/a.txt; test -e src/link || echo no-link"); out != "alpha\nbeta\n640\nno-link\n" {
		t.Errorf("after cp in: %q", out)
	}
	cli.must("stdin bytes", "cp", "-", id+":in.txt")
	if out := cli.must("", "exec", id, "cat", "in.txt"); out != "stdin bytes" {
		t.Errorf("cp - : %q", out)
	}
	if out := cli.must("", "cp", id+":src/sub/b.txt", "-"); out != "beta\n" {
		t.Errorf("cp to stdout: %q", out)
	}

	// The hostile tree.
	victim := filepath.Join(t.TempDir(), "host-file")
	if err := os.WriteFile(victim, []byte("host data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cli.must("", "exec", id, "sh", "-c", "mkdir -p out/d && echo payload > out/d/x && chmod 4755 out/d/x && "+
		"ln -s "+victim+" out/evil && ln -s "+filepath.Dir(victim)+" out/evildir && ln -s ../../etc out/d/up && ln -s d/x out/ok")
	_, errOut, code = cli.run("", "cp", id+":out", local)
	if code != 0 || strings.Count(errOut, "outside what is copied") != 3 {
		t.Errorf("cp out: exit %d, stderr %q; want 3 symlinks skipped", code, errOut)
	}
	for _, name := range []string{"evil", "evildir", "d/up"} {
		if _, err := os.Lstat(filepath.Join(local, "out", name)); !os.IsNotExist(err) {
			t.Errorf("out/%s, a symlink out of the tree, was made: %v", name, err)
		}
	}
	// The next copy the user makes to out/evildir (a directory there, as
	// far as they know) must not land in the host directory it named.
	cli.must("", "exec", id, "sh", "-c", "echo overwritten > /workspace/host-file")
	cli.must("", "cp", id+":host-file", filepath.Join(local, "out", "evildir"))
	if target, err := os.Readlink(filepath.Join(local, "out", "ok")); err != nil || target != "d/x" {
		t.Errorf("out/ok, a symlink inside the tree: %q %v", target, err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "host data\n" {
		t.Errorf("the host file changed: %q", b)
	}
	fi, err := os.Stat(filepath.Join(local, "out", "d", "x"))
	if err != nil || fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("out/d/x: %v %v, want 0755 without set-id", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(local, "out", "d", "x")); string(b) != "payload\n" {
		t.Errorf("out/d/x: %q", b)
	}
	// Copying the tree again would merge into it: refused, the first copy stays.
	if _, errOut, code := cli.run("", "cp", id+":out", local); code != exitRemote || !strings.Contains(errOut, "exists") {
		t.Errorf("cp over an existing tree: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := cli.run("", "cp", id+":out/evil", local); code != exitRemote || !strings.Contains(errOut, "symlink") {
		t.Errorf("cp of a lone symlink: exit %d, stderr %q", code, errOut)
	}

	// A failed copy out: the old file stays, nothing temporary is left.
	keep := filepath.Join(local, "keep.txt")
	os.WriteFile(keep, []byte("old\n"), 0o644)
	if _, errOut, code := cli.run("", "cp", id+":/workspace/no-such-file", keep); code != exitRemote || !strings.Contains(errOut, "404") {
		t.Errorf("cp of a missing file: exit %d, stderr %q", code, errOut)
	}
	cli.must("", "cp", id+":in.txt", keep)
	if b, _ := os.ReadFile(keep); string(b) != "stdin bytes" {
		t.Errorf("cp over a file: %q", b)
	}
	cli.must("", "kill", id)
	if _, _, code := cli.run("", "cp", id+":in.txt", keep); code != exitRemote {
		t.Errorf("cp from a killed sandbox: exit %d", code)
	}
	if b, _ := os.ReadFile(keep); string(b) != "stdin bytes" {
		t.Errorf("a failed cp changed the destination: %q", b)
	}
	if left, _ := filepath.Glob(filepath.Join(local, ".airlock-cp-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	if _, errOut, code := cli.run("", "cp", "a", "b"); code != exitUsage || !strings.Contains(errOut, "SANDBOX:PATH") {
		t.Errorf("cp between two local paths: exit %d, stderr %q", code, errOut)
	}
}

// TestRemoteExecSignals: SIGINT and SIGTERM of `airlock exec` (and of
// `exec -i`, whose command runs in the background) kill the command in
// the sandbox (its process is gone from the host) and exit 130
// and 143 with a message; the sandbox lives on.
func TestRemoteExecSignals(t *testing.T) {
	cli, c, _ := startRemote(t)
	id := strings.TrimSpace(cli.must("", "create"))
	for i, tc := range []struct {
		sig   syscall.Signal
		name  string
		code  int
		flags []string
	}{{syscall.SIGINT, "SIGINT", 130, nil}, {syscall.SIGTERM, "SIGTERM", 143, nil}, {syscall.SIGINT, "SIGINT", 130, []string{"-i"}}} {
		marker := "7171." + strconv.Itoa(i) + strconv.Itoa(os.Getpid())
		args := append(append([]string{"exec"}, tc.flags...), id, "sh", "-c", "echo ready; exec sleep "+marker)
		cmd := exec.Command(airlockBin(t), args...)
		cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, cli.env...)
		stdin, err := cmd.StdinPipe() // open until the end: -i reads it
		if err != nil {
			t.Fatal(err)
		}
		defer stdin.Close()
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var errOut strings.Builder
		cmd.Stderr = &errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
			cmd.Process.Kill()
			t.Fatalf("exec did not start: %q %v %q", line, err, errOut.String())
		}
		for deadline := time.Now().Add(60 * time.Second); testserver.HostProcesses(marker) < 1; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatal("the sandbox's sleep never showed on the host")
			}
		}
		cmd.Process.Signal(tc.sig)
		cmd.Wait()
		if code := cmd.ProcessState.ExitCode(); code != tc.code || !strings.Contains(errOut.String(), "interrupted by "+tc.name) {
			t.Fatalf("after %s: exit %d, stderr %q; want %d and a message", tc.name, code, errOut.String(), tc.code)
		}
		for deadline := time.Now().Add(60 * time.Second); testserver.HostProcesses(marker) != 0; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the command still runs in the sandbox after %s", tc.name)
			}
		}
	}
	if sb, err := c.Get(context.Background(), id); err != nil || sb.State != "running" {
		t.Fatalf("the sandbox after the signals: %+v %v", sb, err)
	}
}

// TestRemoteExecTTY runs `airlock exec -it SANDBOX bash` through
// terminalSession (raw mode, resize, Ctrl-C to the sandbox, exit status).
func TestRemoteExecTTY(t *testing.T) {
	testserver.NeedRoot(t)
	s := testserver.Start(t, testserver.StateDir(t), "--no-auth")
	sb, err := client.New(s.URL, "").Create(context.Background(), client.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	terminalSession(t, "exec", "--url", s.URL, "-it", sb.ID, "bash", "--norc", "-i")
}

// TestRemoteDidYouMean: the remote verbs' unknown flags and subcommands,
// and verbs close to them, get a suggestion and exit 125.
func TestRemoteDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"exce", "x", "true"}, `did you mean "exec"?`},
		{[]string{"volums"}, `did you mean "volumes"?`},
		{[]string{"ls", "--jsno"}, "did you mean --json?"},
		{[]string{"create", "--imag", "x"}, "did you mean --image?"},
		{[]string{"exec", "--api-kye", "k", "sb", "true"}, "did you mean --api-key?"},
		{[]string{"images", "pul", "x"}, `did you mean "pull"?`},
		{[]string{"completion", "fihs"}, `did you mean "fish"?`},
	} {
		_, errOut, code := runCLI(t, nil, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("airlock %s: exit %d, stderr %q; want %d and %q", strings.Join(tc.args, " "), code, errOut, exitUsage, tc.want)
		}
	}
}

// TestRemoteImages: images pull/ls/inspect/rm, templates build from a
// local Dockerfile and context (a symlink in it is not sent), and create
// --image and --volume, against a server with a local registry.
func TestRemoteImages(t *testing.T) {
	testserver.NeedRoot(t)
	reg := imagetest.Registry(t)
	ref := imagetest.Push(t, reg, "cli/busybox:1", imagetest.Busybox(t))
	state := testserver.StateDir(t)
	key := testserver.NewKey(t, state, "cli-images")
	srv := testserver.Start(t, state, "--image-registry", reg)
	cli := remoteCLI{t: t, env: []string{"AIRLOCK_URL=" + srv.URL, "AIRLOCK_API_KEY=" + key}, dir: t.TempDir()}

	if out := cli.must("", "images", "pull", ref); !strings.Contains(out, "sha256:") {
		t.Errorf("images pull: %q", out)
	}
	if out := cli.must("", "images", "-q"); !strings.Contains(out, ref) {
		t.Errorf("images -q: %q", out)
	}
	var img client.Image
	if err := json.Unmarshal([]byte(cli.must("", "images", "inspect", ref)), &img); err != nil || !strings.HasPrefix(img.Digest, "sha256:") {
		t.Errorf("images inspect: %v %+v", err, img)
	}

	ctxDir := filepath.Join(cli.dir, "ctx")
	os.MkdirAll(ctxDir, 0o755)
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM "+ref+"\nCOPY app.txt /app/\nRUN cat /app/app.txt > /app/copy.txt\n"), 0o644)
	os.WriteFile(filepath.Join(ctxDir, "app.txt"), []byte("built remotely\n"), 0o644)
	os.Symlink("/etc/shadow", filepath.Join(ctxDir, "secret"))
	out, errOut, code := cli.run("", "templates", "build", "-t", "cli-tmpl:1", ctxDir)
	if code != 0 || !strings.Contains(out, "cli-tmpl:1 sha256:") || !strings.Contains(errOut, "3 steps") {
		t.Fatalf("templates build: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	cli.must("", "volumes", "create", "--size", "8M", "cli-data")
	id := strings.TrimSpace(cli.must("", "create", "--image", "cli-tmpl:1", "--volume", "cli-data:/data"))
	if out := cli.must("", "exec", id, "/bin/sh", "-c", "cat /app/copy.txt; echo kept > /data/f; ls /app"); out != "built remotely\napp.txt\ncopy.txt\n" {
		t.Errorf("a sandbox of the built image: %q", out)
	}
	if _, errOut, code := cli.run("", "templates", "build", "-t", "cli-bad:1", "-f", filepath.Join(ctxDir, "nope")); code != exitUsage || !strings.Contains(errOut, "nope") {
		t.Errorf("templates build of a missing Dockerfile: exit %d, stderr %q", code, errOut)
	}
	bad := filepath.Join(cli.dir, "bad")
	os.MkdirAll(bad, 0o755)
	os.WriteFile(filepath.Join(bad, "Dockerfile"), []byte("FROM "+ref+"\nRUN exit 9\n"), 0o644)
	if _, errOut, code := cli.run("", "templates", "build", "-t", "cli-bad:1", bad); code != exitRemote || !strings.Contains(errOut, "build_failed") {
		t.Errorf("a failing build: exit %d, stderr %q", code, errOut)
	}
	// The context's symlink to a host secret was not sent.
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile.secret"), []byte("FROM "+ref+"\nCOPY secret /s\n"), 0o644)
	if _, errOut, code := cli.run("", "templates", "build", "-t", "cli-secret:1", "-f", filepath.Join(ctxDir, "Dockerfile.secret"), ctxDir); code == 0 || strings.Contains(errOut, "root:") {
		t.Errorf("COPY of a context symlink to /etc/shadow: exit %d, stderr %q", code, errOut)
	}
	cli.must("", "kill", id)
	cli.must("", "images", "rm", "cli-tmpl:1")
	if out := cli.must("", "images", "-q"); strings.Contains(out, "cli-tmpl") {
		t.Errorf("images after rm: %q", out)
	}
	cli.must("", "volumes", "rm", "cli-data")
}
