package native

import "sync"

// DiskPool keeps upper disks for image roots ready: ext4 images already
// formatted and mounted, with empty upper/ and work/ directories, so that
// creating an image sandbox does not wait for mkfs.ext4 and the loop
// mount (together about three times a plain sandbox start). A disk is made
// by airlock and never seen by a sandbox before it is taken; each is taken
// once. It is safe for concurrent use.
type DiskPool struct {
	dir  string
	size int // ready disks kept per (size, inodes)

	mu      sync.Mutex
	ready   map[diskKey][]string // entry directories: disk.img and disk/ (mounted)
	filling map[diskKey]bool
	seq     int
	closed  bool
	wg      sync.WaitGroup
}

type diskKey struct{ size, inodes int64 }
