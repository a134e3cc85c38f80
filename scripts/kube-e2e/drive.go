// The client side of kube-e2e: airlock's Go client against `airlock serve
// --backend kubernetes` replicas (see main.go).

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// driveState is what the create step leaves for the later steps.
type driveState struct {
	ID      string `json:"id"`
	Context string `json:"context"`
	File    string `json:"file"`
	Content string `json:"content"`
}

// cmdDrive is "kube-e2e drive STEP": create (a sandbox, exec, a file, a
// Python cell; leaves -state), after (through another replica: the same
// sandbox, file and Python variable), pause, resume (exec works again),
// kill (the sandbox ends) or egress (egress.go; no -state).
func cmdDrive(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: kube-e2e drive create|after|pause|resume|kill -url URL [-key KEY] -state FILE, or egress -url URL [-key KEY]")
	}
	step := args[0]
	fs := flag.NewFlagSet("drive", flag.ContinueOnError)
	url := fs.String("url", "", "airlock server URL")
	key := fs.String("key", "", "API key (none with serve --no-auth)")
	statePath := fs.String("state", "", "file the create step writes and later steps read")
	dir := fs.String("dir", "/workspace", "writable directory in the sandbox for the file test")
	timeout := fs.Duration("timeout", 4*time.Minute, "time the step may take")
	runtime := fs.String("runtime", "", "create: the sandbox's runtime (tier); \"\" is the server's default")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *url == "" || (*statePath == "" && step != "egress") {
		return errors.New("drive: -url and -state are required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c := client.New(*url, *key)
	switch step {
	case "create":
		return driveCreate(ctx, c, *statePath, *dir, *runtime)
	case "egress":
		return driveEgress(ctx, c)
	case "after", "pause", "resume", "kill":
		b, err := os.ReadFile(*statePath)
		if err != nil {
			return fmt.Errorf("state: %w", err)
		}
		var st driveState
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("state %s: %w", *statePath, err)
		}
		switch step {
		case "after":
			return driveAfter(ctx, c, st)
		case "pause":
			return drivePause(ctx, c, st)
		case "resume":
			return driveResume(ctx, c, st)
		}
		return driveKill(ctx, c, st)
	}
	return fmt.Errorf("drive: unknown step %q (create, after, pause, resume, kill, egress)", step)
}

func step(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "kube-e2e drive: "+format+"\n", a...)
}

func driveCreate(ctx context.Context, c *client.Client, statePath, dir, runtime string) error {
	t0 := time.Now()
	sb, err := c.Create(ctx, client.CreateRequest{Runtime: runtime, Metadata: map[string]string{"test": "kubernetes-e2e"}, Timeout: 900})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	step("created sandbox %s (state %s) in %v", sb.ID, sb.State, time.Since(t0).Round(time.Millisecond))
	st := driveState{ID: sb.ID, File: dir + "/e2e.txt", Content: "written through airlock's API at " + time.Now().UTC().Format(time.RFC3339Nano) + "\n"}
	// Written before any check, so a failing check still leaves the id
	// for the script to look at and clean up.
	if err := writeState(statePath, st); err != nil {
		return err
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo hello-from-pod; id -u; cat /proc/1/cmdline | tr '\\0' ' '"}})
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if res.ExitCode != 0 || len(lines) < 3 || lines[0] != "hello-from-pod" {
		return fmt.Errorf("exec: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	step("exec: %q (uid %s; pid 1 of the container: %s)", lines[0], lines[1], lines[2])
	if lines[1] == "0" {
		return errors.New("exec: the sandbox's process runs as uid 0; the pod must run non-root")
	}
	if _, err := c.WriteFile(ctx, sb.ID, st.File, strings.NewReader(st.Content), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", st.File, err)
	}
	got, err := c.ReadFile(ctx, sb.ID, st.File)
	if err != nil {
		return fmt.Errorf("read %s: %w", st.File, err)
	}
	if string(got) != st.Content {
		return fmt.Errorf("read %s: got %q, wrote %q", st.File, got, st.Content)
	}
	step("file %s written and read back (%d bytes)", st.File, len(got))
	cc, err := c.CreateContext(ctx, sb.ID, client.ContextRequest{Language: "python"})
	if err != nil {
		return fmt.Errorf("python context: %w", err)
	}
	st.Context = cc.ID
	if err := writeState(statePath, st); err != nil {
		return err
	}
	r, err := c.RunCode(ctx, sb.ID, client.CodeRequest{ContextID: cc.ID, Code: "import sys\nx = 6 * 7\nprint(x, sys.version_info[0])"})
	if err != nil {
		return fmt.Errorf("python cell: %w", err)
	}
	if r.Error != nil || strings.TrimSpace(r.Stdout) != "42 3" {
		return fmt.Errorf("python cell: stdout %q, stderr %q, error %+v", r.Stdout, r.Stderr, r.Error)
	}
	step("python cell in context %s: %q", cc.ID, strings.TrimSpace(r.Stdout))
	fmt.Println(sb.ID)
	return nil
}

func writeState(path string, st driveState) error {
	b, _ := json.Marshal(st)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	return nil
}

// driveAfter runs through a replica that did not create the sandbox, after
// the one that did was killed: nothing may be lost.
func driveAfter(ctx context.Context, c *client.Client, st driveState) error {
	sb, err := c.Get(ctx, st.ID)
	if err != nil {
		return fmt.Errorf("get %s: %w", st.ID, err)
	}
	if sb.State != "running" {
		return fmt.Errorf("get %s: state %q, want running", st.ID, sb.State)
	}
	list, err := c.List(ctx, map[string]string{"test": "kubernetes-e2e"})
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	found := false
	for _, s := range list {
		found = found || s.ID == st.ID
	}
	if !found {
		return fmt.Errorf("list: %s missing from %d sandboxes", st.ID, len(list))
	}
	res, err := c.Exec(ctx, st.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo still-here"}})
	if err != nil || strings.TrimSpace(res.Stdout) != "still-here" {
		return fmt.Errorf("exec through the surviving replica: %v (%+v)", err, res)
	}
	got, err := c.ReadFile(ctx, st.ID, st.File)
	if err != nil || string(got) != st.Content {
		return fmt.Errorf("read %s through the surviving replica: %v (got %q)", st.File, err, got)
	}
	r, err := c.RunCode(ctx, st.ID, client.CodeRequest{ContextID: st.Context, Code: "print(x + 1)"})
	if err != nil {
		return fmt.Errorf("python cell through the surviving replica: %w", err)
	}
	if r.Error != nil || strings.TrimSpace(r.Stdout) != "43" {
		return fmt.Errorf("python cell through the surviving replica: stdout %q, error %+v (the kernel's x should be 42)", r.Stdout, r.Error)
	}
	step("surviving replica: sandbox %s listed and running, exec, file and the Python variable intact", st.ID)
	return nil
}

// drivePause pauses the sandbox: the API reports it paused and refuses
// exec with 409 (the script checks that its pod is gone).
func drivePause(ctx context.Context, c *client.Client, st driveState) error {
	if _, err := c.Pause(ctx, st.ID); err != nil {
		return fmt.Errorf("pause %s: %w", st.ID, err)
	}
	sb, err := c.Get(ctx, st.ID)
	if err != nil || !sb.Paused {
		return fmt.Errorf("pause %s: get says paused=%v (%v)", st.ID, sb != nil && sb.Paused, err)
	}
	_, err = c.Exec(ctx, st.ID, client.ExecRequest{Argv: []string{"/bin/true"}})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict {
		return fmt.Errorf("exec in paused %s: %v, want 409", st.ID, err)
	}
	step("paused %s: exec refused (%d %s)", st.ID, apiErr.Status, apiErr.Code)
	return nil
}

// driveResume resumes the sandbox (a new pod) and runs a command in it.
func driveResume(ctx context.Context, c *client.Client, st driveState) error {
	t0 := time.Now()
	if _, err := c.Resume(ctx, st.ID); err != nil {
		return fmt.Errorf("resume %s: %w", st.ID, err)
	}
	res, err := c.Exec(ctx, st.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo resumed; id -u"}})
	if err != nil {
		return fmt.Errorf("exec after resume: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if res.ExitCode != 0 || len(lines) != 2 || lines[0] != "resumed" || lines[1] == "0" {
		return fmt.Errorf("exec after resume: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	step("resumed %s: exec in the new pod (uid %s) %v after the resume call", st.ID, lines[1], time.Since(t0).Round(time.Millisecond))
	return nil
}

// driveKill kills the sandbox and waits until the API no longer reports it
// running.
func driveKill(ctx context.Context, c *client.Client, st driveState) error {
	if err := c.Kill(ctx, st.ID); err != nil {
		return fmt.Errorf("kill %s: %w", st.ID, err)
	}
	for {
		sb, err := c.Get(ctx, st.ID)
		var apiErr *client.Error
		if errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound {
			step("killed %s: 404", st.ID)
			return nil
		}
		if err == nil && sb.State != "running" {
			step("killed %s: state %s", st.ID, sb.State)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kill %s: still %v %v", st.ID, sb, err)
		case <-time.After(time.Second):
		}
	}
}
