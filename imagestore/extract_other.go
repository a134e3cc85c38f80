//go:build !linux

package imagestore

import (
	"context"
	"errors"
	"io"
	"os"
)

var errNotLinux = errors.New("unpacking image layers needs Linux (openat2)")

func decompress(r io.Reader, bud *budget) (io.ReadCloser, error) { return nil, errNotLinux }

func extract(r io.Reader, root string, bud *budget) error { return errNotLinux }

func removeAll(p string) error { return os.RemoveAll(p) }

// Commit needs Linux (overlayfs upper directories).
func (s *Store) Commit(ctx context.Context, base *Image, upper string, idBase int, name string) (*Image, error) {
	return nil, errNotLinux
}
