package imagestore

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// Whiteout names in OCI layers (image-spec layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// maxIDs is the id range an image's files may be owned by (a sandbox's
// user namespace maps 65536 ids); owners outside it become nobody.
const (
	maxIDs = 65536
	nobody = 65534
)

// decompress returns the uncompressed stream of a layer blob (gzip, zstd or
// plain tar), capped by the budget: a stream longer than the byte cap plus
// the tar headers the file cap allows is a decompression bomb.
func decompress(r io.Reader, bud *budget) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, _ := br.Peek(4)
	limit := &capReader{r: nil, left: bud.maxBytes - bud.bytes + (bud.maxFiles-bud.files+1)*2048 + 1<<20, maxBytes: bud.maxBytes}
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		limit.r = zr
		limit.close = zr.Close
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(256<<20))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		limit.r = zr
		limit.close = func() error { zr.Close(); return nil }
	default:
		limit.r = br
	}
	return limit, nil
}

// capReader fails with a LimitError once more than left bytes were read.
type capReader struct {
	r        io.Reader
	left     int64
	maxBytes int64
	close    func() error
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, &LimitError{What: "bytes", Limit: c.maxBytes}
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

func (c *capReader) Close() error {
	if c.close != nil {
		return c.close()
	}
	return nil
}

// extractor unpacks one layer into root. Every path operation is relative
// to a directory fd opened with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)
// from root's fd, and the last component is never followed, so no name,
// symlink or hard link in the layer can reach outside root.
type extractor struct {
	root int
	bud  *budget
	// parent caches the fd of the directory the previous entry went into
	// (entries of a layer come directory by directory): parentRel names it,
	// parentFd is -1 when nothing is cached. Any unlink in the layer marks
	// it stale (the next entry opens its directory afresh), so a cached fd
	// always names the directory a fresh openat2 of parentRel would find.
	parentRel   string
	parentFd    int
	parentStale bool
	// ownIDs: a new file is already owned by this uid:gid (the
	// extracting process's, and no directory of the tree is set-gid), so
	// an entry with these owners needs no chown.
	ownUID, ownGID int
	ownIDs         bool
	buf            []byte // write's copy buffer
}

// parent returns the fd of directory rel, cached for the next entry; the
// caller must not close it.
func (x *extractor) parent(rel string) (int, error) {
	if x.parentFd >= 0 && !x.parentStale && x.parentRel == rel {
		return x.parentFd, nil
	}
	x.dropParent()
	fd, err := x.dir(rel)
	if err != nil {
		return -1, err
	}
	x.parentRel, x.parentFd = rel, fd
	return fd, nil
}

// dropParent forgets the cached directory fd.
func (x *extractor) dropParent() {
	if x.parentFd >= 0 {
		unix.Close(x.parentFd)
	}
	x.parentRel, x.parentFd, x.parentStale = "", -1, false
}

// clear is clearEntry that also marks the cached directory fd stale when
// it removed something (the removed thing may be that directory or above
// it); the fd stays open for the current entry, which may be using it.
func (x *extractor) clear(fd int, base string, keepDir bool) (bool, error) {
	isDir, removed, err := clearEntry(fd, base, keepDir)
	if removed {
		x.parentStale = true
	}
	return isDir, err
}

// chown sets the owner of base in fd (never following a symlink) unless a
// new entry is owned by uid:gid already.
func (x *extractor) chown(fd int, base string, uid, gid int) error {
	if x.ownIDs && uid == x.ownUID && gid == x.ownGID {
		return nil
	}
	return unix.Fchownat(fd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
}

// create makes base in fd with mk, which must fail with EEXIST rather
// than follow or reuse anything there (O_EXCL, mkdirat, symlinkat,
// mknodat); only if something is there is it cleared (clearEntry) and mk
// tried again. For a directory entry an existing directory is kept
// (existed reports it).
func (x *extractor) create(fd int, base string, keepDir bool, mk func() error) (existed bool, err error) {
	if err := mk(); !errors.Is(err, unix.EEXIST) {
		return false, err
	}
	isDir, err := x.clear(fd, base, keepDir)
	if err != nil || isDir {
		return isDir, err
	}
	return false, mk()
}

// cleanName turns a tar entry name into a path relative to the layer root:
// leading slashes and "." components go, ".." is refused.
func cleanName(n string) (string, error) {
	if strings.IndexByte(n, 0) >= 0 {
		return "", fmt.Errorf("entry name %q contains a NUL byte", n)
	}
	var parts []string
	for _, p := range strings.Split(n, "/") {
		switch p {
		case "", ".":
		case "..":
			return "", fmt.Errorf("entry %q refused: '..' would leave the layer", n)
		default:
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "/"), nil
}

// dir opens directory rel (relative to the root, "" is the root itself),
// creating missing components. It refuses symlinks anywhere on the way.
func (x *extractor) dir(rel string) (int, error) {
	if rel == "" || rel == "." {
		return unix.Dup(x.root)
	}
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}
	fd, err := unix.Openat2(x.root, rel, &how)
	if err == nil {
		return fd, nil
	}
	switch {
	case errors.Is(err, unix.ENOENT):
		parent, err := x.dir(path.Dir(rel))
		if err != nil {
			return -1, err
		}
		err = unix.Mkdirat(parent, path.Base(rel), 0o755)
		unix.Close(parent)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("mkdir %s: %w", rel, err)
		}
		fd, err = unix.Openat2(x.root, rel, &how)
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", rel, err)
		}
		return fd, nil
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV), errors.Is(err, unix.ENOTDIR):
		return -1, fmt.Errorf("path %q refused: it goes through a symlink or a non-directory (%v)", rel, err)
	}
	return -1, fmt.Errorf("open %s: %w", rel, err)
}

// clearEntry removes whatever the layer put at base in directory fd
// earlier, so that a later entry replaces it; a directory is kept when
// keepDir. removed reports whether anything was unlinked.
func clearEntry(fd int, base string, keepDir bool) (isDir, removed bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstatat(fd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, false, nil
		}
		return false, false, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if keepDir {
			return true, false, nil
		}
		if err := unix.Unlinkat(fd, base, unix.AT_REMOVEDIR); err != nil {
			return false, false, fmt.Errorf("replace directory %s: %w", base, err)
		}
		return false, true, nil
	}
	if err := unix.Unlinkat(fd, base, 0); err != nil {
		return false, false, err
	}
	return false, true, nil
}

// owner maps a tar entry's owner into the id range images may use.
func owner(id int) int {
	if id < 0 || id >= maxIDs {
		return nobody
	}
	return id
}

// perm keeps the permission and sticky bits of a tar mode, never set-uid or
// set-gid: a layer grants no privilege (no_new_privs stays as well).
func perm(mode int64) uint32 {
	return uint32(mode) & 0o1777
}

// extract unpacks the tar stream r into the directory root.
func extract(r io.Reader, root string, bud *budget) error {
	rfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("open layer root: %w", err)
	}
	defer unix.Close(rfd)
	x := &extractor{root: rfd, bud: bud, parentFd: -1}
	defer x.dropParent()
	var st unix.Stat_t
	if err := unix.Fstat(rfd, &st); err != nil {
		return fmt.Errorf("stat layer root: %w", err)
	}
	// Directories made here inherit set-gid only from the root (entries'
	// modes never carry it), so without it new entries get our ids.
	x.ownUID, x.ownGID, x.ownIDs = os.Geteuid(), os.Getegid(), st.Mode&unix.S_ISGID == 0
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			var le *LimitError
			if errors.As(err, &le) {
				return err
			}
			return fmt.Errorf("read tar: %w", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
}

// entry unpacks one tar entry.
func (x *extractor) entry(hdr *tar.Header, tr io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	size := int64(0)
	if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeGNUSparse {
		size = hdr.Size
	}
	if err := x.bud.take(size, 1); err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("entry %q refused: the layer root must be a directory", hdr.Name)
		}
		return nil
	}
	pfd, err := x.parent(path.Dir(rel))
	if err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	base := path.Base(rel)

	if strings.HasPrefix(base, whiteoutPrefix) {
		return x.whiteout(pfd, rel, base)
	}
	uid, gid := owner(hdr.Uid), owner(hdr.Gid)
	mode := perm(hdr.Mode)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if _, err := x.create(pfd, base, true, func() error { return unix.Mkdirat(pfd, base, 0o700) }); err != nil {
			return fmt.Errorf("entry %q: mkdir: %w", hdr.Name, err)
		}
		if err := x.chown(pfd, base, uid, gid); err != nil {
			return fmt.Errorf("entry %q: chown: %w", hdr.Name, err)
		}
		if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
			return fmt.Errorf("entry %q: chmod: %w", hdr.Name, err)
		}
	case tar.TypeReg, tar.TypeGNUSparse:
		fd := -1
		if _, err := x.create(pfd, base, false, func() (err error) {
			fd, err = unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
			return err
		}); err != nil {
			return fmt.Errorf("entry %q: create: %w", hdr.Name, err)
		}
		err := x.write(fd, tr, hdr.Size)
		if err == nil && (!x.ownIDs || uid != x.ownUID || gid != x.ownGID) {
			err = unix.Fchown(fd, uid, gid)
		}
		if err == nil {
			err = unix.Fchmod(fd, mode) // after chown, which clears set-id bits anyway (perm has none)
		}
		if cerr := unix.Close(fd); err == nil {
			err = cerr
		}
		if err != nil {
			var le *LimitError
			if errors.As(err, &le) {
				return err
			}
			return fmt.Errorf("entry %q: write: %w", hdr.Name, err)
		}
		if !hdr.ModTime.IsZero() {
			ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
			_ = unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
		}
	case tar.TypeSymlink:
		if strings.IndexByte(hdr.Linkname, 0) >= 0 || hdr.Linkname == "" {
			return fmt.Errorf("entry %q: bad symlink target", hdr.Name)
		}
		// The target is stored, never followed here; inside a sandbox it
		// resolves within the sandbox's own root.
		if _, err := x.create(pfd, base, false, func() error { return unix.Symlinkat(hdr.Linkname, pfd, base) }); err != nil {
			return fmt.Errorf("entry %q: symlink: %w", hdr.Name, err)
		}
		if err := x.chown(pfd, base, uid, gid); err != nil {
			return fmt.Errorf("entry %q: chown: %w", hdr.Name, err)
		}
	case tar.TypeLink:
		return x.hardlink(hdr, pfd, base)
	case tar.TypeFifo:
		if _, err := x.create(pfd, base, false, func() error { return unix.Mknodat(pfd, base, unix.S_IFIFO|mode&0o777, 0) }); err != nil {
			return fmt.Errorf("entry %q: mkfifo: %w", hdr.Name, err)
		}
		if err := x.chown(pfd, base, uid, gid); err != nil {
			return fmt.Errorf("entry %q: chown: %w", hdr.Name, err)
		}
	case tar.TypeChar, tar.TypeBlock:
		return fmt.Errorf("entry %q refused: device nodes are not allowed in image layers (%d:%d)", hdr.Name, hdr.Devmajor, hdr.Devminor)
	default:
		return fmt.Errorf("entry %q refused: unsupported tar entry type %q", hdr.Name, hdr.Typeflag)
	}
	return nil
}

// write copies size bytes of r to fd.
func (x *extractor) write(fd int, r io.Reader, size int64) error {
	if x.buf == nil {
		x.buf = make([]byte, 128<<10)
	}
	for size > 0 {
		b := x.buf
		if int64(len(b)) > size {
			b = b[:size]
		}
		n, err := io.ReadFull(r, b)
		size -= int64(n)
		for p := b[:n]; len(p) > 0; {
			k, werr := unix.Write(fd, p)
			if werr == unix.EINTR {
				continue
			}
			if werr != nil {
				return werr
			}
			p = p[k:]
		}
		if err == io.ErrUnexpectedEOF || (err == io.EOF && size > 0) {
			return io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// hardlink links base in pfd to an earlier entry of the same layer. The
// target is resolved like any entry name: beneath the root, through no
// symlink, and it must be a regular file or symlink of this layer.
func (x *extractor) hardlink(hdr *tar.Header, pfd int, base string) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link %q: target %w", hdr.Name, err)
	}
	if target == "" {
		return fmt.Errorf("hard link %q refused: target is the layer root", hdr.Name)
	}
	tfd, err := x.dir(path.Dir(target))
	if err != nil {
		return fmt.Errorf("hard link %q: target %w", hdr.Name, err)
	}
	defer unix.Close(tfd)
	tbase := path.Base(target)
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("hard link %q refused: target %q is not in the layer: %w", hdr.Name, hdr.Linkname, err)
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFLNK {
		return fmt.Errorf("hard link %q refused: target %q is not a regular file", hdr.Name, hdr.Linkname)
	}
	if _, err := x.clear(pfd, base, false); err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
		return fmt.Errorf("hard link %q: %w", hdr.Name, err)
	}
	return nil
}

// whiteout turns an OCI whiteout into its overlayfs form: ".wh.NAME"
// becomes a 0:0 character device NAME (hides NAME of lower layers), the
// opaque marker an xattr on its directory (hides all of a lower directory).
func (x *extractor) whiteout(pfd int, rel, base string) error {
	if base == whiteoutOpaque {
		dfd, err := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opaque whiteout %q: %w", rel, err)
		}
		defer unix.Close(dfd)
		if err := unix.Fsetxattr(dfd, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
			return fmt.Errorf("opaque whiteout %q: %w", rel, err)
		}
		return nil
	}
	if strings.HasPrefix(base, whiteoutPrefix+whiteoutPrefix) {
		return nil // other AUFS metadata (.wh..wh.plnk...): meaningless here
	}
	hidden := strings.TrimPrefix(base, whiteoutPrefix)
	if hidden == "" || hidden == "." || hidden == ".." {
		return fmt.Errorf("whiteout %q refused: no name to hide", rel)
	}
	if _, err := x.clear(pfd, hidden, false); err != nil {
		return fmt.Errorf("whiteout %q: %w", rel, err)
	}
	if err := unix.Mknodat(pfd, hidden, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("whiteout %q: %w", rel, err)
	}
	return nil
}

// removeAll removes a tree of the store (layers hold read-only
// directories; root ignores their modes).
func removeAll(p string) error { return os.RemoveAll(p) }
