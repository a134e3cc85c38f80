package bench

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// benchImage is the name of the one-layer busybox image importBusybox puts
// in a bench server's store.
const benchImage = "bench/busybox:1"

// gvisorImagePeer is gvisorPeer with live sandboxes created from the
// one-layer busybox image (importBusybox) instead of the default root, so
// that the exec figure shows what an image root costs an exec under gVisor.
func (s *apiServer) gvisorImagePeer(exe string) Peer {
	p := s.gvisorPeer()
	p.Name = GVisorImagePeer
	p.Note = "airlock serve (loopback, no auth): POST /v1/sandboxes {\"runtime\":\"gvisor\",\"image\":\"" + benchImage + "\"} (a one-layer busybox image: overlay on the host, upper disk, served by the gofer), then POST /v1/sandboxes/{id}/exec"
	p.IdleNote = "a live gvisor sandbox of airlock serve from an image root: the agent is its init under runsc"
	if err := s.importBusybox(exe); err != nil {
		return Peer{Name: GVisorImagePeer, Missing: "importing the busybox image: " + err.Error()}
	}
	p.StartIdle = func(argv []string) (*Idle, error) { return s.startLiveImage("gvisor", benchImage) }
	return p
}

// ImagePeer is the name of the airlock peer whose live sandboxes are
// native ones from the one-layer busybox image.
const ImagePeer = Reference + " image"

// nativeImagePeer is peer with live sandboxes created from the busybox
// image (importBusybox) on the native tier.
func (s *apiServer) nativeImagePeer(exe string) Peer {
	p := s.peer()
	p.Name = ImagePeer
	p.Note = "airlock serve (loopback, no auth): POST /v1/sandboxes {\"image\":\"" + benchImage + "\"} (a one-layer busybox image: an overlay with an upper dir), then POST /v1/sandboxes/{id}/exec"
	p.IdleNote = "a live native sandbox of airlock serve from an image root"
	if err := s.importBusybox(exe); err != nil {
		return Peer{Name: ImagePeer, Missing: "importing the busybox image: " + err.Error()}
	}
	p.StartIdle = func(argv []string) (*Idle, error) { return s.startLiveImage("", benchImage) }
	return p
}

// importBusybox makes a one-layer image of the host's static busybox
// (busyboxLayer) as a docker archive and imports it into the server's
// image store as benchImage with the airlock CLI: the operator's
// namespace, which a no-auth server uses.
func (s *apiServer) importBusybox(exe string) error {
	dir, err := os.MkdirTemp(s.dir, "busybox-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	layerDir := filepath.Join(dir, "layer")
	if err := busyboxLayer(layerDir); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := tarDir(&buf, layerDir); err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	ref, err := name.ParseReference(benchImage)
	if err != nil {
		return err
	}
	archive := filepath.Join(dir, "busybox.tar")
	if err := tarball.WriteToFile(archive, ref, img); err != nil {
		return err
	}
	out, err := exec.Command(exe, "image", "import", "--quiet", "--state-dir", s.dir, "--name", benchImage, archive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("airlock image import: %v: %s", err, out)
	}
	return nil
}

// tarDir writes the regular files, directories and symlinks under dir as
// a tar stream with root-owned entries.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		link := ""
		if fi.Mode()&os.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name, h.Uid, h.Gid, h.Uname, h.Gname = rel, 0, 0, "", ""
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
