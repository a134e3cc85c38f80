package statelock

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestAcquireHeldRelease(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	// flock is per open file: a second Acquire conflicts even in this process.
	_, err = Acquire(dir)
	var held *HeldError
	if !errors.As(err, &held) || held.Pid != os.Getpid() || held.Dir != dir {
		t.Fatalf("second Acquire: %v", err)
	}
	if !strings.Contains(err.Error(), "in use by process "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("message %q does not name the holder", err)
	}
	l.Release()
	l.Release() // idempotent
	l2, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	l2.Release()
	if _, err := Acquire(dir + "/missing"); err == nil || errors.As(err, &held) {
		t.Fatalf("Acquire of a missing dir: %v", err)
	}
}
