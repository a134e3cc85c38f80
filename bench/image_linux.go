package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/gvisor"
	"github.com/airlock-dev/airlock/runtime/native"
)

// ImageDefaultPeer is the peer of the image create figure that starts
// the same program from the default (host-derived) root.
const ImageDefaultPeer = "default root"

// busyboxPath is the static busybox the image create figure puts in its
// one-layer image (Debian: busybox-static).
var busyboxPath = "/bin/busybox"

// ImageCreateFigure measures creating a sandbox from an image against
// creating one from the default root, in the bench process: the time
// native.Start takes until the program runs (what an API create waits
// for), for busybox true with the strict preset. The reference ("airlock")
// starts from a one-layer image holding a static busybox, with its capped
// upper disk taken ready from a DiskPool (as `airlock serve` does; the
// pool refills after each take, and every round of either peer waits,
// untimed, until it has); the peer "default root" starts
// the host's busybox. Waiting for the program and removing the root are
// not timed. scratch holds the layer, the pool and the roots (a disk
// filesystem: not tmpfs).
func ImageCreateFigure(scratch string, runs int) Figure {
	return imageCreateFigure(scratch, runs, false)
}

// GVisorImageCreateFigure is ImageCreateFigure under gVisor: the image
// root is the same overlay, mounted on the host and served by runsc's
// gofer (runtime/gvisor image_linux.go). gvisor.Start returns before the
// program runs, so each round is timed until `busybox true` has ended
// (runsc started, the sentry booted, the program run and gone), for both
// peers alike.
func GVisorImageCreateFigure(scratch string, runs int) Figure {
	if _, err := gvisor.Available(); err != nil {
		return Unavailable("gvisor create from an image (in-process)", err.Error())
	}
	return imageCreateFigure(scratch, runs, true)
}

func imageCreateFigure(scratch string, runs int, gv bool) Figure {
	name := "create from an image (in-process)"
	if gv {
		name = "gvisor create from an image (in-process)"
	}
	if _, err := os.Stat(busyboxPath); err != nil {
		return Unavailable(name, "needs a static busybox at "+busyboxPath+" (Debian: busybox-static)")
	}
	if os.Geteuid() != 0 {
		return Unavailable(name, "image roots need root")
	}
	pol, err := policy.Preset(policy.Strict)
	if err != nil {
		return Unavailable(name, "strict preset: "+err.Error())
	}
	pol.Env = []string{"PATH=/bin"}
	dir, err := os.MkdirTemp(scratch, "airlock-bench-image-")
	if err != nil {
		return Unavailable(name, err.Error())
	}
	defer os.RemoveAll(dir)
	layer := filepath.Join(dir, "layer")
	if err := busyboxLayer(layer); err != nil {
		return Unavailable(name, "busybox layer: "+err.Error())
	}
	pool, err := native.OpenDiskPool(filepath.Join(dir, "pool"), 1)
	if err != nil {
		return Unavailable(name, err.Error())
	}
	defer pool.Close()
	argv := []string{"/bin/busybox", "true"}
	seq := 0
	start := func(image bool) (float64, error) {
		// The pool refills after each take, once that sandbox runs; wait
		// for it (untimed) before either peer's round, so that neither
		// create shares the machine with the refill's mkfs.
		deadline := time.Now().Add(time.Minute)
		for pool.Ready(pol.Limits.DiskBytes, pol.Limits.Inodes) == 0 && seq > 0 {
			if time.Now().After(deadline) {
				return 0, errors.New("the disk pool made no disk within a minute")
			}
			time.Sleep(time.Millisecond)
		}
		var img *native.ImageRoot
		if image {
			seq++
			img = &native.ImageRoot{Layers: []string{layer}, Dir: filepath.Join(dir, "root"+strconv.Itoa(seq)), Disks: pool}
		}
		if gv {
			return gvisorRound(pol, argv, img)
		}
		t0 := time.Now()
		sb, err := native.Start(native.Config{Policy: pol, Args: argv, Image: img})
		d := time.Since(t0)
		if err != nil {
			if img != nil {
				_ = native.RemoveImageRoot(img.Dir)
			}
			return 0, err
		}
		st, werr := sb.Wait()
		sb.Destroy()
		if img != nil {
			if err := native.RemoveImageRoot(img.Dir); err != nil {
				return 0, err
			}
		}
		if werr != nil {
			return 0, werr
		}
		if !st.Status.Exited() || st.Status.ExitStatus() != 0 {
			return 0, fmt.Errorf("busybox true ended with wait status %#x", uint32(st.Status))
		}
		return float64(d) / float64(time.Millisecond), nil
	}
	peers := []Peer{
		{Name: Reference, Note: "native.Start(strict) from a one-layer busybox image: ID-mapped layer, overlayfs, a pooled capped upper disk; until the program runs"},
		{Name: ImageDefaultPeer, Note: "native.Start(strict) of the host's busybox from the default root; until the program runs"},
	}
	if gv {
		pol.Runtime = policy.RuntimeGVisor
		peers = []Peer{
			{Name: Reference, Note: "gvisor.Start(strict) from a one-layer busybox image: overlayfs on the host with a pooled capped upper disk, served by the gofer; until the program has ended"},
			{Name: ImageDefaultPeer, Note: "gvisor.Start(strict) of the host's busybox from the default root; until the program has ended"},
		}
	}
	fig := Sample(peers, UnitMS, runs, func(p Peer) (float64, error) { return start(p.Name == Reference) })
	fig.Name = name
	fig.Command = argv
	return fig
}

// gvisorRound times one gvisor create of argv (img nil: the default
// root) until the program has ended, and removes the root untimed.
func gvisorRound(pol policy.Policy, argv []string, img *native.ImageRoot) (float64, error) {
	if img != nil {
		if err := os.MkdirAll(img.Dir, 0o700); err != nil {
			return 0, err
		}
		defer native.RemoveImageRoot(img.Dir)
	}
	t0 := time.Now()
	sb, err := gvisor.Start(native.Config{Policy: pol, Args: argv, Image: img})
	if err != nil {
		return 0, err
	}
	st, werr := sb.Wait()
	d := time.Since(t0)
	sb.Destroy()
	if werr != nil {
		return 0, werr
	}
	if !st.Exited() || st.ExitCode() != 0 {
		return 0, fmt.Errorf("busybox true under gvisor: %v", st)
	}
	return float64(d) / float64(time.Millisecond), nil
}

// busyboxLayer makes dir an unpacked image layer: bin/busybox (a copy of
// the host's static busybox) with sh and true linked to it.
func busyboxLayer(dir string) error {
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	b, err := os.ReadFile(busyboxPath)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(bin, "busybox"), b, 0o755); err != nil {
		return err
	}
	for _, l := range []string{"sh", "true"} {
		if err := os.Symlink("busybox", filepath.Join(bin, l)); err != nil {
			return err
		}
	}
	return nil
}
