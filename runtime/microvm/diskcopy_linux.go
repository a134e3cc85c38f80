package microvm

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// copyDisk copies the disk image src to a new file dst: a reflink (the
// file system shares the blocks, copy on write) where the file system
// can, else a sparse copy of src's data extents only (SEEK_DATA and
// SEEK_HOLE, each extent with copy_file_range). An upper disk is mostly
// holes (a fresh ext4 of limits.disk_bytes), so the copy costs what the
// guest wrote, not the disk's size. docs/RATIONALE.md has the figures.
func copyDisk(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("microvm: copy disk: %w", err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return fmt.Errorf("microvm: copy disk: %w", err)
	}
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("microvm: copy disk: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("microvm: copy disk: %w", cerr)
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return out.Sync()
	}
	if err := out.Truncate(fi.Size()); err != nil {
		return fmt.Errorf("microvm: copy disk: %w", err)
	}
	size := fi.Size()
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("microvm: copy disk: seek data: %w", err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("microvm: copy disk: seek hole: %w", err)
		}
		for pos := data; pos < hole; {
			roff, woff := pos, pos
			n, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(hole-pos), 0)
			if err != nil || n == 0 {
				// A file system without copy_file_range: plain reads.
				if _, err := io.Copy(io.NewOffsetWriter(out, pos), io.NewSectionReader(in, pos, hole-pos)); err != nil {
					return fmt.Errorf("microvm: copy disk: %w", err)
				}
				break
			}
			pos += int64(n)
		}
		off = hole
	}
	return out.Sync()
}

// forkUpperDisk gives a fork its own upper disk in dir: a copy of the
// snapshot's (copyDisk), which the fork alone writes.
func forkUpperDisk(snapshotDisk, dir string) error {
	return copyDisk(snapshotDisk, filepath.Join(dir, upperDiskFile))
}
