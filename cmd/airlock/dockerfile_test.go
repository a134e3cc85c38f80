package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	it "github.com/airlock-dev/airlock/imagestore/imagetest"
	"github.com/airlock-dev/airlock/internal/testserver"
)

// TestTemplateAsDocker: a template built from a Dockerfile behaves as
// Docker's: ENV with several pairs and quotes sets each variable, WORKDIR
// creates its directory, `airlock run --image` without a command runs the
// image's ENTRYPOINT and CMD (exec and shell forms; a command given
// replaces both), `image ls` lists the named image and not its build
// steps (`-a` does), a COPY into /tmp (a tmpfs in every sandbox) is
// refused naming the path, a RUN writing under /tmp is warned about, and a
// mistyped name says it is not in the local store instead of asking a
// registry.
func TestTemplateAsDocker(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	ref := it.Push(t, it.Registry(t), "cli/asdocker:1", it.Busybox(t))
	state, ctxDir := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(ctxDir, "hello.txt"), []byte("copied\n"), 0o644)
	dockerfile := func(body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM "+ref+"\n"+body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	build := func(name string) (string, string, int) {
		return runCLI(t, nil, "template", "build", "--state-dir", state, "-t", name, ctxDir)
	}
	run := func(args ...string) (string, string, int) {
		return runCLI(t, nil, append([]string{"run", "--state-dir", state}, args...)...)
	}

	dockerfile(`ARG GREETING=hello
ENV A=1 B="two words" C=3
ENV OLD form with spaces
LABEL org.example.team="a team" tier=1
WORKDIR /srv/app
COPY hello.txt ./
RUN echo "$GREETING $B" > made.txt
ENTRYPOINT ["/bin/sh", "-c", "echo \"A=$A B=$B C=$C OLD=$OLD args=$0 $1\"; cat hello.txt made.txt; pwd", "entry"]
CMD ["from-cmd"]
`)
	if out, errOut, code := build("entry:1"); code != 0 {
		t.Fatalf("build: %d %q %q", code, out, errOut)
	}
	out, errOut, code := run("--image", "entry:1")
	if want := "A=1 B=two words C=3 OLD=form with spaces args=entry from-cmd\ncopied\nhello two words\n/srv/app\n"; code != 0 || out != want {
		t.Fatalf("run --image without a command (ENTRYPOINT + CMD): %d %q %q\nwant %q", code, out, errOut, want)
	}
	if out, errOut, code := run("--image", "entry:1", "--", "/bin/sh", "-c", "env | grep -c '^=' ; echo $B"); code != 0 || out != "0\ntwo words\n" {
		t.Fatalf("run --image with a command: %d %q %q", code, out, errOut)
	}

	dockerfile("ENV A=1\nCMD echo shell form $A \"$0\"\n")
	if out, errOut, code := build("shellcmd:1"); code != 0 {
		t.Fatalf("build: %d %q %q", code, out, errOut)
	}
	if out, errOut, code := run("--image", "shellcmd:1"); code != 0 || out != "shell form 1 /bin/sh\n" {
		t.Fatalf("run --image with a shell-form CMD: %d %q %q", code, out, errOut)
	}

	out, errOut, code = runCLI(t, nil, "image", "ls", "--state-dir", state)
	if code != 0 || strings.Contains(out, "<none>") || !strings.Contains(out, "library/entry:1") || !strings.Contains(out, "library/shellcmd:1") ||
		!strings.Contains(out, ref) || strings.Count(out, "\n") != 4 {
		t.Fatalf("image ls: want the header and the three named images, no build steps: %d %q %q", code, out, errOut)
	}
	out, errOut, code = runCLI(t, nil, "image", "ls", "-a", "--state-dir", state)
	if code != 0 || strings.Count(out, "<none>") < 8 || !strings.Contains(out, "library/entry:1") {
		t.Fatalf("image ls -a: want the build steps too: %d %q %q", code, out, errOut)
	}

	for _, dest := range []string{"/tmp/", "/tmp/x/y.txt", "/workspace/", "/dev/shm/h"} {
		dockerfile("COPY hello.txt " + dest + "\n")
		out, errOut, code := build("tmp:1")
		if code != 1 || !strings.Contains(errOut, "COPY into "+strings.TrimSuffix(dest, "/")) || !strings.Contains(errOut, "would never be seen") {
			t.Fatalf("COPY into %s: want a refusal naming it: %d %q %q", dest, code, out, errOut)
		}
	}
	dockerfile("WORKDIR /tmp\nCOPY hello.txt ./\n")
	if out, errOut, code := build("tmp:1"); code != 1 || !strings.Contains(errOut, "COPY into /tmp") {
		t.Fatalf("COPY ./ under WORKDIR /tmp: %d %q %q", code, out, errOut)
	}
	dockerfile("RUN echo x > /tmp/lost\n")
	if out, errOut, code := build("tmprun:1"); code != 0 || !strings.Contains(errOut, "warning: RUN uses /tmp") {
		t.Fatalf("RUN writing /tmp: want a warning in the build log: %d %q %q", code, out, errOut)
	}

	out, errOut, code = run("--image", "mistyped")
	if code != exitSetup || !strings.Contains(errOut, `"mistyped" is not in the local store`) || !strings.Contains(errOut, "airlock image pull mistyped") ||
		strings.Contains(errOut, "lookup") || strings.Contains(errOut, "registry") {
		t.Fatalf("mistyped image name: %d %q %q", code, out, errOut)
	}
	dockerfile("CMD []\n") // the base image's CMD is /bin/sh
	if out, errOut, code := build("nocmd:1"); code != 0 {
		t.Fatalf("build: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := run("--image", "nocmd:1"); code != exitSetup || !strings.Contains(errOut, "no ENTRYPOINT or CMD") {
		t.Fatalf("image without a default command: %d %q", code, errOut)
	}
	// A command the image lacks, or a WORKDIR over a file, is an error,
	// never a hang (an image root's failed child used to block forever).
	if _, errOut, code := run("--image", "entry:1", "--", "/no/such/program"); code != exitNotFound || !strings.Contains(errOut, "not found") {
		t.Fatalf("missing command in the image: %d %q", code, errOut)
	}
	dockerfile("RUN /no/such/program\n")
	if _, errOut, code := build("badrun:1"); code != 1 || !strings.Contains(errOut, "/no/such/program") {
		t.Fatalf("RUN of a missing program: %d %q", code, errOut)
	}
	dockerfile("WORKDIR /etc/image-marker/sub\n")
	if _, errOut, code := build("badwd:1"); code != 1 || !strings.Contains(errOut, "/etc/image-marker is not a directory") {
		t.Fatalf("WORKDIR under a file: %d %q", code, errOut)
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "roots")); len(ents) != 0 {
		t.Fatalf("per-sandbox roots left: %v", ents)
	}
}

// TestTemplateBuildSignal: SIGTERM during a RUN step stops the build with
// exit 143 and a message; the step's sandbox and its root are gone.
func TestTemplateBuildSignal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	ref := it.Push(t, it.Registry(t), "cli/buildsig:1", it.Busybox(t))
	state, ctxDir := t.TempDir(), t.TempDir()
	marker := "6172." + strconv.Itoa(os.Getpid())
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM "+ref+"\nRUN echo step-started; sleep "+marker+"\n"), 0o644)
	cmd := exec.Command(airlockBin(t), "template", "build", "--state-dir", state, "-t", "sig:1", ctxDir)
	var errOut testserver.Output
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	errOut.WaitFor(t, 0, "step-started")
	for deadline := time.Now().Add(30 * time.Second); testserver.HostProcesses(marker) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the RUN step's sleep never started")
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 143 || !strings.Contains(errOut.String(), "interrupted by SIGTERM") {
		t.Fatalf("build after SIGTERM: exit %d, stderr %q", code, errOut.String())
	}
	if n := testserver.HostProcesses(marker); n != 0 {
		t.Fatalf("%d RUN step processes left", n)
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "roots")); len(ents) != 0 {
		t.Fatalf("RUN step roots left: %v", ents)
	}
}
