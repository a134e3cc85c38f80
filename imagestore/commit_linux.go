package imagestore

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// Commit makes a new image named name from base plus one layer holding
// what a sandbox changed: the overlayfs upper directory upper, whose files
// belong to host ids idBase..idBase+65535 (stored in the layer as 0-65535).
// Overlayfs whiteouts become OCI whiteouts. The directory is hostile (the
// sandbox may still be writing to it): it is read through directory fds
// without following any symlink, so nothing outside it can end up in the
// layer, and the layer is then unpacked by the same checks as any pulled
// layer.
func (s *Store) Commit(ctx context.Context, base *Image, upper string, idBase int, name string) (*Image, error) {
	if _, err := normName(name); err != nil {
		return nil, err
	}
	lease, err := s.TempDir("commit-")
	if err != nil {
		return nil, err
	}
	defer lease.Close()
	tmp, err := os.Create(filepath.Join(lease.Path, "layer.tar"))
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	defer tmp.Close()
	bud := &budget{maxBytes: s.lim.MaxBytes, maxFiles: s.lim.MaxFiles}
	tw := tar.NewWriter(tmp)
	fd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	w := &upperWalker{tw: tw, idBase: idBase, bud: bud, ctx: ctx}
	err = w.dir(fd, "")
	unix.Close(fd)
	if err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	img, err := s.AppendTar(ctx, base, tmp.Name(), name, "airlock snapshot")
	if err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return img, nil
}

// upperWalker writes an overlayfs upper directory as a layer tar.
type upperWalker struct {
	tw     *tar.Writer
	idBase int
	bud    *budget
	ctx    context.Context
}

func (w *upperWalker) id(host uint32) int {
	if id := int(host) - w.idBase; id >= 0 && id < maxIDs {
		return id
	}
	return nobody
}

// dir writes the entries of the directory open at fd (rel is its path in
// the layer, "" for the root).
func (w *upperWalker) dir(fd int, rel string) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	if rel != "" {
		buf := make([]byte, 8)
		if n, err := unix.Fgetxattr(fd, "trusted.overlay.opaque", buf); err == nil && string(buf[:n]) == "y" {
			if err := w.tw.WriteHeader(&tar.Header{Name: rel + "/" + whiteoutOpaque, Typeflag: tar.TypeReg, Mode: 0o644}); err != nil {
				return err
			}
		}
	}
	dup, err := unix.Dup(fd) // reading through a File closes it; the caller owns fd
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(dup), rel)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		if err := w.entry(fd, rel, name); err != nil {
			return err
		}
	}
	return nil
}

func (w *upperWalker) entry(dfd int, rel, name string) error {
	p := path.Join(rel, name)
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // removed meanwhile
		}
		return err
	}
	hdr := &tar.Header{Name: p, Uid: w.id(st.Uid), Gid: w.id(st.Gid), Mode: int64(st.Mode & 0o1777),
		ModTime: time.Unix(st.Mtim.Unix()), Format: tar.FormatPAX}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return nil // not a whiteout; a sandbox cannot make one anyway
		}
		return w.tw.WriteHeader(&tar.Header{Name: path.Join(rel, whiteoutPrefix+name), Typeflag: tar.TypeReg, Mode: 0o644, Format: tar.FormatPAX})
	case unix.S_IFDIR:
		if err := w.bud.take(0, 1); err != nil {
			return err
		}
		hdr.Typeflag, hdr.Name = tar.TypeDir, p+"/"
		if err := w.tw.WriteHeader(hdr); err != nil {
			return err
		}
		cfd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		defer unix.Close(cfd)
		return w.dir(cfd, p)
	case unix.S_IFLNK:
		buf := make([]byte, 4096)
		n, err := unix.Readlinkat(dfd, name, buf)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, string(buf[:n])
		if err := w.bud.take(0, 1); err != nil {
			return err
		}
		return w.tw.WriteHeader(hdr)
	case unix.S_IFREG:
		ffd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		f := os.NewFile(uintptr(ffd), p)
		defer f.Close()
		var fst unix.Stat_t
		if err := unix.Fstat(ffd, &fst); err != nil || fst.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("%s: changed while being read", p)
		}
		if err := w.bud.take(fst.Size, 1); err != nil {
			return err
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, fst.Size
		if err := w.tw.WriteHeader(hdr); err != nil {
			return err
		}
		// A file the sandbox shrinks meanwhile is padded, one it grows cut:
		// the header's size holds.
		n, err := io.Copy(w.tw, io.LimitReader(f, fst.Size))
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if n < fst.Size {
			if _, err := io.CopyN(w.tw, zeroReader{}, fst.Size-n); err != nil {
				return err
			}
		}
		return nil
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
		return w.tw.WriteHeader(hdr)
	}
	return nil // sockets and the like: not part of an image
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
