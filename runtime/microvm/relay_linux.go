package microvm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// portRelay carries one virtio-serial port's byte stream between a host
// side that lasts as long as the sandbox (the manager's agent connection,
// the egress mux) and the socket of the QEMU process currently running
// the guest, which a pause to disk ends and a resume replaces. The stream
// goes on across the change without a byte lost or repeated: before the
// guest is stopped the relay stops writing to QEMU and waits until QEMU has
// taken every byte written (into the guest's memory, which the migration
// saves: hold), and after QEMU has quit it forwards what QEMU wrote up to
// its end (detached); the next QEMU's socket takes over (attach).
type portRelay struct {
	fixed net.Conn

	wmu    sync.Mutex // held while a write to the guest's socket is in progress, and by hold
	mu     sync.Mutex
	cond   *sync.Cond
	guest  *os.File // QEMU's side, nil between QEMU processes
	held   bool
	eof    bool          // the host side ended: the guest's sides are shut for writing
	copied chan struct{} // closed when the current QEMU's output has all been forwarded
}

func newPortRelay(fixed net.Conn) *portRelay {
	r := &portRelay{fixed: fixed}
	r.cond = sync.NewCond(&r.mu)
	go r.pump()
	return r
}

// attach makes g (read through rd, which may hold bytes already read from
// it) the guest's side and ends a hold.
func (r *portRelay) attach(g *os.File, rd io.Reader) {
	copied := make(chan struct{})
	r.mu.Lock()
	r.guest, r.held, r.copied = g, false, copied
	if r.eof {
		unix.Shutdown(int(g.Fd()), unix.SHUT_WR)
	}
	r.cond.Broadcast()
	r.mu.Unlock()
	go func() {
		io.Copy(r.fixed, rd)
		close(copied)
	}()
}

// pump forwards the host side to the guest's current socket, waiting
// while the relay is held.
func (r *portRelay) pump() {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.fixed.Read(buf)
		if n > 0 {
			r.write(buf[:n])
		}
		if err != nil {
			r.mu.Lock()
			r.eof = true
			if r.guest != nil {
				unix.Shutdown(int(r.guest.Fd()), unix.SHUT_WR)
			}
			r.cond.Broadcast()
			r.mu.Unlock()
			return
		}
	}
}

// write writes b to the guest's socket once the relay is not held.
func (r *portRelay) write(b []byte) {
	for {
		r.mu.Lock()
		for (r.held || r.guest == nil) && !r.eof {
			r.cond.Wait()
		}
		g := r.guest
		r.mu.Unlock()
		if g == nil {
			return // ended
		}
		r.wmu.Lock()
		r.mu.Lock()
		same := !r.held && r.guest == g
		r.mu.Unlock()
		if same { // hold takes wmu before it holds: no write starts after
			writeAll(g, b)
			r.wmu.Unlock()
			return
		}
		r.wmu.Unlock()
	}
}

func writeAll(f *os.File, b []byte) {
	for len(b) > 0 {
		n, err := f.Write(b)
		if err != nil {
			return // QEMU ended: the sandbox ends with it
		}
		b = b[n:]
	}
}

// hold stops forwarding to the guest and waits, up to wait, until QEMU has
// read everything written to its socket. It fails (and does not hold)
// when a write is stuck or QEMU does not take the bytes: the guest is not
// reading its port.
func (r *portRelay) hold(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for !r.wmu.TryLock() {
		if time.Now().After(deadline) {
			return errors.New("microvm: the guest does not read its port (a write to it is stuck)")
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.mu.Lock()
	r.held = true
	g := r.guest
	r.mu.Unlock()
	r.wmu.Unlock()
	if g == nil {
		return nil
	}
	for {
		n, err := unix.IoctlGetInt(int(g.Fd()), unix.SIOCOUTQ)
		if err != nil {
			r.release()
			return fmt.Errorf("microvm: the guest port's queue: %w", err)
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			r.release()
			return fmt.Errorf("microvm: the guest has not read the last %d bytes sent to its port after %s", n, wait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// release ends a hold on the same QEMU (its pause failed or a snapshot is
// done).
func (r *portRelay) release() {
	r.mu.Lock()
	r.held = false
	r.cond.Broadcast()
	r.mu.Unlock()
}

// detached waits, up to wait, until everything the quitting QEMU wrote
// has been forwarded, and forgets its socket.
func (r *portRelay) detached(wait time.Duration) error {
	r.mu.Lock()
	copied, g := r.copied, r.guest
	r.mu.Unlock()
	if copied != nil {
		select {
		case <-copied:
		case <-time.After(wait):
			return errors.New("microvm: the guest port's last bytes were not forwarded in time")
		}
	}
	r.mu.Lock()
	if r.guest == g {
		r.guest = nil
	}
	r.mu.Unlock()
	if g != nil {
		g.Close()
	}
	return nil
}

// close ends the relay: the host side is closed, the pump ends.
func (r *portRelay) close() {
	r.fixed.Close()
	r.mu.Lock()
	r.eof = true
	if r.guest != nil {
		r.guest.Close()
		r.guest = nil
	}
	r.cond.Broadcast()
	r.mu.Unlock()
}
