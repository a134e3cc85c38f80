package gvisor

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CheckpointHolding is Checkpoint with hold: files that `runsc checkpoint`
// inherits and keeps open until it exits. Passing the host's end of the
// agent's connection keeps a crash of the caller from reaching the agent
// as an end of file before runsc has stopped the sandbox: runsc, which
// outlives the caller, then finishes the checkpoint (FinishCheckpoint).
func (s *Sandbox) CheckpointHolding(image string, hold ...*os.File) error {
	if err := os.MkdirAll(image, 0o700); err != nil {
		return fmt.Errorf("gvisor: checkpoint: %w", err)
	}
	cmd := exec.Command(s.runsc.Path, append(append(s.globalFlags(), "checkpoint"), checkpointFlags(image, s.ID)...)...)
	cmd.ExtraFiles = hold
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("gvisor: runsc checkpoint: %v: %s", err, strings.TrimSpace(string(out)))
	}
	s.Wait()
	// The stopped container's state goes, so that restore can reuse the id.
	_ = exec.Command(s.runsc.Path, append(s.globalFlags(), "delete", "--force", s.ID)...).Run()
	// The image went through the page cache, charged to the sandbox's
	// cgroup: write it out (it is durable once this returns) and drop it,
	// so that the memory is really free.
	return dropCache(image)
}

// checkpointOf lists the pids of the `runsc checkpoint` processes of
// sandbox id (those a crashed server left run on).
func checkpointOf(id string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 2 && filepath.Base(args[0]) == "runsc" && slices.Contains(args, "checkpoint") && args[len(args)-1] == id {
			pids = append(pids, pid)
		}
	}
	return pids
}

// FinishCheckpoint settles a checkpoint of sandbox id into directory image
// that a process killed mid pause (SIGKILL) left behind: it waits, up to
// wait, for the `runsc checkpoint` still running to end, then reports
// whether the image is whole. A whole image is synced to disk and the
// stopped container's runsc state removed, for Restore after Adopt.
//
// `runsc checkpoint` returns once the sentry has written the image, and the
// sentry then kills the sandbox (a save that began ends the sandbox whether
// or not it succeeded): its process may still be exiting, which under load
// takes seconds, so a sandbox whose image was begun (a non-empty state
// file) is waited for, up to wait, and counts as stopped, not as running.
// One whose image was never begun (the checkpoint never reached the
// sentry) runs on: the image is not whole and the sandbox is the caller's
// to take over running.
func FinishCheckpoint(id, image string, wait time.Duration) (bool, error) {
	if !validID(id) {
		return false, fmt.Errorf("gvisor: bad sandbox id %q", id)
	}
	rs, err := Available()
	if err != nil {
		return false, err
	}
	deadline := time.Now().Add(wait)
	for ; len(checkpointOf(id)) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false, fmt.Errorf("gvisor: the interrupted checkpoint of %s is still running after %v", id, wait)
		}
	}
	fi, err := os.Stat(filepath.Join(image, "checkpoint.img"))
	if err != nil || fi.Size() == 0 {
		return false, nil // the sentry never began the image: it runs on
	}
	for ; running(rs.Path, id); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false, fmt.Errorf("gvisor: %s still runs %v after its interrupted checkpoint wrote its image", id, wait)
		}
	}
	if err := dropCache(image); err != nil {
		return false, err
	}
	_ = exec.Command(rs.Path, append(runscFlags(), "delete", "--force", id)...).Run()
	return true, nil
}

// running reports whether runsc runs container id: its state says so
// and its sandbox process is alive.
func running(runsc, id string) bool {
	st, pid := containerStatus(runsc, id)
	return st == "running" && pid > 0 && unix.Kill(pid, 0) == nil
}

// containerStatus returns runsc's status of container id ("running",
// "paused"...) and its sandbox's pid; "" if runsc has no state for it.
func containerStatus(runsc, id string) (string, int) {
	out, err := exec.Command(runsc, append(runscFlags(), "state", id)...).Output()
	if err != nil {
		return "", 0
	}
	var st struct {
		Status string `json:"status"`
		Pid    int    `json:"pid"`
	}
	if json.Unmarshal(out, &st) != nil {
		return "", 0
	}
	return st.Status, st.Pid
}
