//go:build !linux

package imagestore

import (
	"errors"
	"io"
	"os"
)

var errNotLinux = errors.New("unpacking image layers needs Linux (openat2)")

func decompress(r io.Reader, bud *budget) (io.ReadCloser, error) { return nil, errNotLinux }

func extract(r io.Reader, root string, bud *budget) error { return errNotLinux }

func removeAll(p string) error { return os.RemoveAll(p) }
