// Package volume keeps named, size-capped volumes that sandboxes mount
// read-write and that outlive sandboxes and server restarts: each is an
// ext4 image file (sparse) under the state directory, mounted on the host
// while the server uses it; sandboxes get ID-mapped mounts of it
// (native.Config.Volumes), so every sandbox sees the same owners.
package volume

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/runtime/native"
)

// Errors returned (wrapped) by the store.
var (
	ErrNotFound = errors.New("volume not found")
	ErrExists   = errors.New("volume exists")
	ErrInUse    = errors.New("volume in use")
	ErrInvalid  = errors.New("invalid volume")
)

// Size bounds of a volume.
const (
	MinSize = 4 << 20
	MaxSize = 1 << 40
)

// Compiled on first use: a counted repetition costs every process that
// links this package (the CLI's `airlock run` too) at init.
var validName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`) })

// Volume describes one volume.
type Volume struct {
	Name      string    `json:"name"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
}

// Store holds the volumes of one directory (STATE_DIR/volumes), seen as
// one owner (As); the store Open returns is the operator's.
//
// Each owner has its own namespace of names: the operator's volumes (an
// unauthenticated server's, and every volume made before owners existed)
// are DIR/NAME, those of API key ID are DIR/_keys/ID/NAME ("_keys" is no
// valid volume name). An owner sees, mounts and deletes its own volumes
// only: another owner's volume is ErrNotFound.
type Store struct {
	root string // the store's directory: the lock
	dir  string // the owner's namespace; "" for an invalid owner
	mu   *sync.Mutex
}

// keysDir, under the store's directory, holds the API keys' namespaces.
const keysDir = "_keys"

// validOwner matches the owners As accepts (API key ids: key_ and hex).
var validOwner = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`) })

// Open opens (creating) the store in dir.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	return &Store{root: dir, dir: dir, mu: new(sync.Mutex)}, nil
}

// As returns the view of the store of owner (an API key id; "" is the
// operator): its own volumes only.
func (s *Store) As(owner string) *Store {
	c := &Store{root: s.root, mu: s.mu, dir: s.root}
	if owner != "" {
		c.dir = ""
		if validOwner().MatchString(owner) {
			c.dir = filepath.Join(s.root, keysDir, owner)
		}
	}
	return c
}

// checkOwner refuses a view of an owner As did not accept.
func (s *Store) checkOwner() error {
	if s.dir == "" {
		return fmt.Errorf("%w: owner is not a valid key id", ErrInvalid)
	}
	return nil
}

func (s *Store) lock() (func(), error) {
	s.mu.Lock()
	f, err := os.OpenFile(filepath.Join(s.root, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err == nil {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		s.mu.Unlock()
		return nil, fmt.Errorf("volumes lock: %w", err)
	}
	return func() { f.Close(); s.mu.Unlock() }, nil
}

func (s *Store) path(name string, elem ...string) string {
	return filepath.Join(append([]string{s.dir, name}, elem...)...)
}

// Create makes an empty volume of size bytes.
func (s *Store) Create(name string, size int64) (*Volume, error) {
	if !validName().MatchString(name) {
		return nil, fmt.Errorf("%w: name %q (want lower-case letters, digits, . _ -, at most 63)", ErrInvalid, name)
	}
	if size < MinSize || size > MaxSize {
		return nil, fmt.Errorf("%w: size %d outside %d-%d bytes", ErrInvalid, size, int64(MinSize), int64(MaxSize))
	}
	if err := s.checkOwner(); err != nil {
		return nil, err
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	if err := os.Mkdir(s.path(name), 0o700); err != nil {
		if os.IsExist(err) {
			return nil, fmt.Errorf("%w: %s", ErrExists, name)
		}
		return nil, fmt.Errorf("volumes: %w", err)
	}
	v := &Volume{Name: name, SizeBytes: size, CreatedAt: time.Now().UTC()}
	inodes := min(max(size/(16<<10), 1024), 1<<22)
	err = native.MakeDisk(s.path(name, "disk.img"), size, inodes, 0, true)
	if err == nil {
		var b []byte
		b, _ = json.Marshal(v)
		err = os.WriteFile(s.path(name, "volume.json"), b, 0o600)
	}
	if err != nil {
		os.RemoveAll(s.path(name))
		return nil, fmt.Errorf("volume %s: %w", name, err)
	}
	return v, nil
}

// Get returns the view's volume name.
func (s *Store) Get(name string) (*Volume, error) {
	if s.dir == "" || !validName().MatchString(name) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	b, err := os.ReadFile(s.path(name, "volume.json"))
	if err != nil {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	var v Volume
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("volume %s: %w", name, err)
	}
	return &v, nil
}

// List returns the view's volumes by name.
func (s *Store) List() ([]Volume, error) {
	if err := s.checkOwner(); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(s.dir)
	if os.IsNotExist(err) && s.dir != s.root {
		return []Volume{}, nil // a key that made no volume yet
	}
	if err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	out := []Volume{}
	for _, e := range ents {
		if v, err := s.Get(e.Name()); err == nil {
			out = append(out, *v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// mounted reports whether dir is a mount point.
func mounted(dir string) bool {
	var a, b unix.Stat_t
	return unix.Stat(dir, &a) == nil && unix.Stat(filepath.Dir(dir), &b) == nil && a.Dev != b.Dev
}

// Use mounts volume name on the host (once) and records that holder (a
// sandbox id) uses it for as long as the path alive exists. It returns the
// directory to give native.Config.Volumes.
func (s *Store) Use(name, holder, alive string) (string, error) {
	if _, err := s.Get(name); err != nil {
		return "", err
	}
	if strings.ContainsAny(holder, "/\x00") || strings.ContainsAny(alive, "\n\x00") {
		return "", fmt.Errorf("%w: holder %q", ErrInvalid, holder)
	}
	unlock, err := s.lock()
	if err != nil {
		return "", err
	}
	defer unlock()
	mnt := s.path(name, "mnt")
	if !mounted(mnt) {
		// A disk still attached to a loop device is still mounted
		// somewhere (a copy of the host's mounts in a mount namespace
		// made while it was mounted here keeps the filesystem alive after
		// its unmount, until that namespace lets go): a second mount of
		// the same ext4 image would read it without the first's unwritten
		// state (seen in CI: a file written before the unmount missing
		// after the remount) and corrupt it on write. Wait for it to go.
		img := s.path(name, "disk.img")
		if err := waitDetached(img, detachWait); err != nil {
			return "", fmt.Errorf("volume %s: %w", name, err)
		}
		if err := native.MountDisk(img, mnt); err != nil {
			return "", fmt.Errorf("volume %s: %w", name, err)
		}
	}
	if err := os.MkdirAll(s.path(name, "users"), 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(s.path(name, "users", holder), []byte(alive), 0o600); err != nil {
		return "", fmt.Errorf("volume %s: %w", name, err)
	}
	return mnt, nil
}

// users returns the holders of volume name whose alive path exists,
// forgetting the others.
func (s *Store) users(name string) []string {
	var out []string
	ents, _ := os.ReadDir(s.path(name, "users"))
	for _, e := range ents {
		p := s.path(name, "users", e.Name())
		alive, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if _, err := os.Stat(string(alive)); err != nil {
			os.Remove(p)
			continue
		}
		out = append(out, e.Name())
	}
	return out
}

// Delete removes volume name and its data; a volume that live sandboxes
// use is refused (ErrInUse).
func (s *Store) Delete(name string) (*Volume, error) {
	v, err := s.Get(name)
	if err != nil {
		return nil, err
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if u := s.users(name); len(u) > 0 {
		return nil, fmt.Errorf("%w: volume %s is mounted by sandbox %s", ErrInUse, name, strings.Join(u, ", "))
	}
	if mounted(s.path(name, "mnt")) {
		if err := unix.Unmount(s.path(name, "mnt"), 0); err != nil {
			return nil, fmt.Errorf("volume %s: unmount: %w", name, err)
		}
	}
	if err := os.RemoveAll(s.path(name)); err != nil {
		return nil, fmt.Errorf("volume %s: %w", name, err)
	}
	return v, nil
}

// UnmountIdle unmounts every volume, of every owner, that no live sandbox
// uses (its loop device detaches with it); the next Use mounts it again.
// A server calls it when it stops, so that a clean shutdown leaves no
// volume mounted on the host except those of the sandboxes it leaves
// running (serve --keep-on-shutdown). Call it on the store Open returned.
func (s *Store) UnmountIdle() error {
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	owners := []string{s.root}
	keys, _ := os.ReadDir(filepath.Join(s.root, keysDir))
	for _, k := range keys {
		if k.IsDir() {
			owners = append(owners, filepath.Join(s.root, keysDir, k.Name()))
		}
	}
	var errs []error
	for _, dir := range owners {
		view := &Store{root: s.root, dir: dir, mu: s.mu}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if !e.IsDir() || e.Name() == keysDir {
				continue
			}
			mnt := view.path(e.Name(), "mnt")
			if !mounted(mnt) || len(view.users(e.Name())) > 0 {
				continue
			}
			if err := unix.Unmount(mnt, 0); err != nil {
				errs = append(errs, fmt.Errorf("volume at %s: unmount: %w", mnt, err))
				continue
			}
			if err := waitDetached(view.path(e.Name(), "disk.img"), detachWait); err != nil {
				errs = append(errs, fmt.Errorf("volume at %s: %w", mnt, err))
			}
		}
	}
	return errors.Join(errs...)
}

// detachWait bounds how long a volume's disk may stay attached to a loop
// device after its last unmount here.
const detachWait = 30 * time.Second

// waitDetached waits until no loop device is backed by img (the loop
// device detaches itself once the filesystem on it is gone everywhere).
func waitDetached(img string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for loopBacked(img) {
		if time.Now().After(deadline) {
			return fmt.Errorf("its disk %s is still attached to a loop device %s after its unmount: it is still mounted in another mount namespace; not mounted twice", img, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// loopBacked reports whether a loop device is backed by img.
func loopBacked(img string) bool {
	if abs, err := filepath.Abs(img); err == nil {
		img = abs
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == img {
			return true
		}
	}
	return false
}
