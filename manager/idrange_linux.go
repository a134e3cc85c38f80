package manager

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/airlock-dev/airlock/runtime/native/idrange"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// idLease is a sandbox's host uid/gid range; nil when airlock is not root
// (the sandbox then maps the server's own uid).
type idLease struct{ l *idrange.Lease }

// leaseIDs leases a host id range of its own for a new sandbox: host-wide
// free (no live sandbox of any airlock process holds it) and not recorded
// for a running sandbox of this store. The server holds the lease until
// handTo passes it to the sandbox's init.
func (m *Manager) leaseIDs(ctx context.Context) (*idLease, error) {
	if os.Geteuid() != 0 {
		return &idLease{}, nil
	}
	pool, err := idrange.Default()
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	live, err := m.st.LiveUIDBases(ctx)
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	l, err := pool.Acquire(os.Getpid(), 0, func(base int) bool { return live[base] })
	if err != nil {
		return nil, fmt.Errorf("manager: lease a host uid range: %w", err)
	}
	return &idLease{l}, nil
}

// base is the range's first host id, or 0 (unprivileged: native.Start
// then maps the caller's uid).
func (i *idLease) base() int {
	if i.l == nil {
		return 0
	}
	return i.l.Base
}

// handTo makes the sandbox's init the lease's holder, or the directory
// that bounds its life where its processes do not (tier.LeaseHolder): the
// range stays taken while the sandbox lives, whether or not this server
// does, paused or not.
func (i *idLease) handTo(inst tier.Instance) error {
	if i.l == nil {
		return nil
	}
	var err error
	if dir := leaseDir(inst); dir != "" {
		err = i.l.SetHolderDir(dir)
	} else {
		err = i.l.SetHolder(inst.Pid())
	}
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	return nil
}

// leaseDir is the directory that holds inst's lease, "" if its pid does.
func leaseDir(inst tier.Instance) string {
	if h, ok := inst.(tier.LeaseHolder); ok {
		return h.LeaseDir()
	}
	return ""
}

// Release frees the range; only once the sandbox's processes are gone.
func (i *idLease) Release() {
	if i != nil {
		i.l.Release()
	}
}

// reclaimIDs re-takes a reattached sandbox's range for its holder (as
// handTo), and refuses to reattach a sandbox whose range another live
// holder has. The range is the one the kernel maps for the init (its
// uid_map), which is also right for a sandbox recorded before ranges were
// (base 0).
func reclaimIDs(base int, inst tier.Instance) error {
	if os.Geteuid() != 0 {
		return nil
	}
	if dir := leaseDir(inst); dir != "" {
		if base == 0 {
			return nil
		}
		pool, err := idrange.Default()
		if err != nil {
			return err
		}
		if _, err := pool.ClaimDir(base, dir); err != nil {
			return fmt.Errorf("host uid range: %w", err)
		}
		return nil
	}
	pid := inst.Pid()
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid)); err == nil {
		var inside, host, n int
		if _, err := fmt.Sscan(string(b), &inside, &host, &n); err == nil && inside == 0 && n == idrange.Size {
			base = host
		}
	}
	if base == 0 {
		return nil
	}
	pool, err := idrange.Default()
	if err != nil {
		return err
	}
	if _, err := pool.Claim(base, pid); err != nil {
		return fmt.Errorf("host uid range: %w", err)
	}
	return nil
}

// freeIDs frees the range of an ended sandbox (its init is gone, so its
// lease has a dead holder) at once, so that the next sandbox can have it.
// An init killed but not reaped yet (a reattached one is not this
// process's child) still holds it: freeIDs waits for it a little, so that
// a clean shutdown leaves no lease behind.
func (m *Manager) freeIDs(base int) {
	if base == 0 || os.Geteuid() != 0 {
		return
	}
	pool, err := idrange.Default()
	if err != nil {
		return
	}
	lease := filepath.Join(pool.Dir, strconv.Itoa(base))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := pool.Free(base); err != nil {
			m.cfg.Logf("free host uid range %d: %v", base, err)
			return
		}
		if _, err := os.Stat(lease); os.IsNotExist(err) || time.Now().After(deadline) {
			return
		}
	}
}
