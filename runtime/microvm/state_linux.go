package microvm

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// VM is one guest (tier.Instance, tier.Checkpointer), across the QEMU
// processes that run it: a pause to disk (Suspend) ends its QEMU and a
// resume starts another from the saved state. Done is closed only when the
// guest really ends.
type VM struct {
	id       string
	dir      string // its state directory (LeaseDir)
	launch   *launch
	token    []byte // its ports' sessions' token (tokenFile)
	group    *cgroups.Group
	enforced rt.Enforced
	vols     []*volumeShare
	mux      *egressMux
	agent    *portRelay // the agent's port (its host side is the manager's connection)
	egress   *portRelay // the egress port (its host side is mux's), nil without network
	// daemons are the pidfds of the volume daemons of a VM taken over
	// running (vols are those of one this server started).
	daemons []int
	// adopted: taken over running from a previous server (DialAgent,
	// Listeners).
	adopted bool

	mu        sync.Mutex
	cur       *qemuProc
	suspended bool // paused to disk: no QEMU runs
	frozen    bool // paused by freezing QEMU's cgroup (a sandbox with volumes)
	conn      net.Conn

	ended   chan struct{}
	endOnce sync.Once
	destroy sync.Once
	waitErr error // how the last QEMU ended, once ended
}

// holdWait bounds how long the guest may take to read what was sent to its
// ports before it is stopped; migrateWait a migration to or from a file.
var (
	holdWait    = 30 * time.Second
	migrateWait = 5 * time.Minute
)

func (v *VM) current() *qemuProc {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.cur
}

// follow ends the VM when p exits while it is the current QEMU and no
// pause to disk is under way.
func (v *VM) follow(p *qemuProc) {
	go func() {
		<-p.done
		v.mu.Lock()
		end := v.cur == p && !v.suspended
		if end {
			v.waitErr = p.waitErr
		}
		v.mu.Unlock()
		if end {
			v.End()
		}
	}()
}

// End marks the guest ended: its relays and egress session close.
func (v *VM) End() {
	v.endOnce.Do(func() {
		if v.agent != nil {
			v.agent.close()
		}
		if v.egress != nil {
			v.egress.close()
		}
		if v.mux != nil {
			v.mux.sess.Close() // ends its listeners' Accept
		}
		close(v.ended)
	})
}

// Pid is the current QEMU's (the last one's while paused to disk).
func (v *VM) Pid() int { return v.current().pid }

// Done is closed when the guest has ended (not when a pause to disk ends
// its QEMU).
func (v *VM) Done() <-chan struct{} { return v.ended }

// Stats reads QEMU's cgroup.
func (v *VM) Stats() (cgroups.Stats, error) {
	if v.group == nil {
		return cgroups.Stats{}, errors.New("microvm: no cgroup")
	}
	return v.group.Stats()
}

// Enforced lists the layers applied.
func (v *VM) Enforced() rt.Enforced { return v.enforced }

// Destroy kills QEMU, waits for it and removes its cgroup.
func (v *VM) Destroy() error {
	var err error
	v.destroy.Do(func() {
		v.mu.Lock()
		p, frozen := v.cur, v.frozen
		v.suspended = false
		v.mu.Unlock()
		if frozen && v.group != nil {
			v.group.Thaw() // a frozen task dies of SIGKILL once thawed
		}
		p.kill()
		v.mu.Lock()
		v.waitErr = p.waitErr
		v.mu.Unlock()
		v.End()
		if p.qmp != nil {
			p.qmp.close()
		}
		p.closePidfd()
		stopVolumes(v.vols)
		if len(v.daemons) > 0 {
			// Taken over running: this server did not start the volume
			// daemons, so their cgroup is not in v.vols; it goes too.
			killDaemons(v.daemons)
			if g, err := cgroups.Lookup(volumeGroup(v.id)); err == nil {
				destroyGroup(g)
			}
		}
		v.daemons = nil
		if v.group != nil {
			v.group.Kill()
			if e := v.group.Destroy(); e != nil {
				err = fmt.Errorf("microvm: remove cgroup: %w", e)
			}
		}
		os.RemoveAll(v.dir)
	})
	return err
}

// LeaseDir implements tier.LeaseHolder: the VM's state directory, which
// lives from its start to its Destroy (or the tier's Remove), across
// pauses to disk, while no QEMU process runs, and server restarts.
func (v *VM) LeaseDir() string { return v.dir }

// WrapConn implements tier.Checkpointer: the agent's connection needs no
// wrapping, since the tier's relay (portRelay) carries the stream across
// QEMU processes on the host side of c.
func (v *VM) WrapConn(c net.Conn) net.Conn {
	v.mu.Lock()
	v.conn = c
	v.mu.Unlock()
	return c
}

// Conn implements tier.Checkpointer.
func (v *VM) Conn() net.Conn {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.conn
}

// holdPorts stops the relays' writes to the guest once it has read all
// they sent.
func (v *VM) holdPorts() error {
	if err := v.agent.hold(holdWait); err != nil {
		return err
	}
	if v.egress != nil {
		if err := v.egress.hold(holdWait); err != nil {
			v.agent.release()
			return err
		}
	}
	return nil
}

func (v *VM) releasePorts() {
	v.agent.release()
	if v.egress != nil {
		v.egress.release()
	}
}

// save stops the guest (its ports held and drained first) and writes its
// state into directory image (memoryFile); the guest stays stopped, in
// QEMU, for the caller to continue or quit. On an error the guest runs on.
func (v *VM) save(p *qemuProc, image string) (*os.File, error) {
	if err := v.holdPorts(); err != nil {
		return nil, err
	}
	fail := func(err error) (*os.File, error) {
		p.qmp.run("cont", nil, nil)
		v.releasePorts()
		return nil, err
	}
	if _, err := p.qmp.run("stop", nil, nil); err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(image, 0o700); err != nil {
		return fail(fmt.Errorf("microvm: %w", err))
	}
	f, err := os.OpenFile(filepath.Join(image, memoryFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600) // QEMU only writes it
	if err != nil {
		return fail(fmt.Errorf("microvm: %w", err))
	}
	if err := p.qmp.migrateTo(f, migrateWait); err != nil {
		f.Close()
		return fail(err)
	}
	return f, nil
}

// Suspend implements tier.Checkpointer: a pause to disk. The guest is
// stopped, its whole state (memory and devices) written to image by QEMU's
// migration to a file, and QEMU quits: the guest's memory is freed and no
// QEMU runs while it is paused. Its disks stay where they are. A sandbox
// with volumes (whose vhost-user devices QEMU cannot migrate) is paused by
// freezing QEMU's cgroup instead: its memory stays resident.
func (v *VM) Suspend(image string) error {
	v.mu.Lock()
	p := v.cur
	if v.suspended || v.frozen {
		v.mu.Unlock()
		return errors.New("microvm: already paused")
	}
	v.mu.Unlock()
	select {
	case <-v.ended:
		return errGone
	default:
	}
	if err := os.MkdirAll(image, 0o700); err != nil {
		return fmt.Errorf("microvm: %w", err)
	}
	if len(v.vols) > 0 {
		if v.group == nil {
			return fmt.Errorf("%w: microvm: pausing a sandbox with volumes needs its cgroup", tier.ErrNotSupported)
		}
		if err := v.group.Freeze(); err != nil {
			return fmt.Errorf("microvm: pause: %w", err)
		}
		v.mu.Lock()
		v.frozen = true
		v.mu.Unlock()
		return nil
	}
	f, err := v.save(p, image)
	if err != nil {
		return err
	}
	defer f.Close()
	v.mu.Lock()
	v.suspended = true // its exit is not the guest's end
	v.mu.Unlock()
	p.qmp.run("quit", nil, nil)
	select {
	case <-p.done:
	case <-time.After(migrateWait):
		p.kill()
	}
	p.qmp.close()
	p.closePidfd()
	if err := v.agent.detached(holdWait); err != nil {
		return v.lost(err)
	}
	if v.egress != nil {
		if err := v.egress.detached(holdWait); err != nil {
			return v.lost(err)
		}
	}
	// The state went through the page cache, charged to QEMU's cgroup:
	// write it out (it is durable once this returns) and drop it, so that
	// the memory is really free; the same for the upper disk's pages.
	if err := syncDrop(f); err != nil {
		return v.lost(err)
	}
	if v.launch.upper != "" {
		if u, err := os.Open(v.launch.upper); err == nil {
			syncDrop(u)
			u.Close()
		}
	}
	return nil
}

// lost ends a VM whose pause to disk failed after its QEMU quit.
func (v *VM) lost(err error) error {
	v.End()
	return fmt.Errorf("microvm: pause to disk: %w", err)
}

// syncDrop writes f's pages to disk and drops them from the page cache.
func syncDrop(f *os.File) error {
	if err := f.Sync(); err != nil {
		return fmt.Errorf("microvm: sync %s: %w", f.Name(), err)
	}
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	return nil
}

// Resume implements tier.Checkpointer: a new QEMU loads the state that
// Suspend wrote to image (-incoming) with the same disks and runs the
// guest on; the ports' streams go on over its sockets. log receives QEMU's
// and the guest console's output.
func (v *VM) Resume(image string, log *os.File) error {
	v.mu.Lock()
	frozen, suspended := v.frozen, v.suspended
	v.mu.Unlock()
	if frozen {
		if err := v.group.Thaw(); err != nil {
			return fmt.Errorf("microvm: resume: %w", err)
		}
		v.mu.Lock()
		v.frozen = false
		v.mu.Unlock()
		return nil
	}
	if !suspended {
		return errors.New("microvm: resume: not paused")
	}
	f, err := os.Open(filepath.Join(image, memoryFile))
	if err != nil {
		return fmt.Errorf("microvm: resume: %w", err)
	}
	defer f.Close()
	l := *v.launch
	// The first QEMU's log may be closed by now (the manager's is): this
	// one's goes to log, or nowhere.
	l.stdout, l.stderr = nil, nil
	if log != nil {
		l.stdout, l.stderr = log, log
	}
	p, err := l.spawn(f, nil)
	if err != nil {
		return fmt.Errorf("microvm: resume: %w", err)
	}
	if err = writeRunning(v.dir, p.pid, nil); err == nil {
		err = p.waitRunning(migrateWait)
	}
	if err != nil {
		p.kill()
		p.close()
		return fmt.Errorf("microvm: resume: %w", err)
	}
	v.mu.Lock()
	v.cur, v.suspended = p, false
	v.mu.Unlock()
	v.agent.attach(p.agent, p.agent)
	if v.egress != nil {
		v.egress.attach(p.egress, p.egress)
	}
	v.follow(p)
	return nil
}

// Snapshot implements tier.Checkpointer: the guest is stopped, its state
// written to image (memoryFile) and, on an image root, its upper disk
// copied beside it (rootDiskFile, copy-on-write where the file system
// can); then it runs on. Fork starts new sandboxes from image.
func (v *VM) Snapshot(image string) error {
	if len(v.vols) > 0 {
		return fmt.Errorf("%w: microvm: a memory snapshot of a sandbox with volumes", tier.ErrNotSupported)
	}
	v.mu.Lock()
	p, paused := v.cur, v.suspended || v.frozen
	v.mu.Unlock()
	if paused {
		return errors.New("microvm: snapshot: paused")
	}
	f, err := v.save(p, image)
	if err != nil {
		return err
	}
	defer f.Close()
	err = syncDrop(f)
	if err == nil && v.token != nil {
		// A fork's agent holds this session's token.
		err = writeToken(image, v.token)
	}
	if err == nil && v.launch.upper != "" {
		// QEMU flushed the disk when it stopped the guest.
		err = copyDisk(v.launch.upper, filepath.Join(image, rootDiskFile))
	}
	if _, cerr := p.qmp.run("cont", nil, nil); cerr != nil {
		// A guest left stopped would look alive and answer nothing: it
		// ends, and says why.
		p.kill()
		return fmt.Errorf("microvm: the guest could not run on after its snapshot, and was ended: %w", cerr)
	}
	v.releasePorts()
	return err
}
