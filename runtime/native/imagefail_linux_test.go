package native_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/runtime/native"
)

// TestImageRootChildFails: a sandbox with an image root whose child fails
// before its program runs (command not in the image, working directory a
// file) returns the error, and leaves no root mounted behind. Before, Start
// waited for the host-side unmount, which only began after Start returned:
// it hung forever (and `airlock run --image X -- typo` with it).
func TestImageRootChildFails(t *testing.T) {
	_, img := busyboxImage(t)
	for _, tc := range []struct {
		name, workdir string
		args          []string
		want          error
	}{
		{"command not found", "", []string{"/no/such/program"}, native.ErrNotFound},
		{"workdir a file", "/etc/image-marker", []string{"/bin/sh", "-c", "true"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := strict(t)
			p.User.UID, p.User.GID, p.User.Name = 0, 0, "root"
			p.Env = []string{"PATH=/bin"}
			if tc.workdir != "" {
				p.Filesystem.Workdir = tc.workdir
			}
			rootDir := filepath.Join(t.TempDir(), "sb-root")
			type result struct {
				res *native.Result
				err error
			}
			done := make(chan result, 1)
			go func() {
				res, err := native.Run(context.Background(), native.Config{Policy: p, Args: tc.args,
					Image: &native.ImageRoot{Layers: img.LayerDirs(), Dir: rootDir}}, native.RunOptions{Capture: true})
				done <- result{res, err}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(2 * time.Minute):
				t.Fatal("native.Run of a failing child with an image root never returned")
			}
			if r.err == nil || (tc.want != nil && !errors.Is(r.err, tc.want)) {
				t.Fatalf("want an error (%v), got %+v %v", tc.want, r.res, r.err)
			}
			if err := native.RemoveImageRoot(rootDir); err != nil {
				t.Fatalf("remove the root: %v", err)
			}
			if _, err := os.Stat(rootDir); !os.IsNotExist(err) {
				t.Fatalf("root left: %v", err)
			}
		})
	}
}
