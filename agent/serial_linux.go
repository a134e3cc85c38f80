package agent

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SerialReady is what the agent writes on a "--serial" (or "--egress")
// port at the start of each session, before anything else: the host reads
// it as the first bytes of its connection to QEMU's end of the port before
// it sends a preamble (ReconnectPreamble), because a virtio-serial port
// drops what arrives while the guest has it closed, and because it tells
// the host that the guest saw the previous host go.
const SerialReady = "AIRLOCK-SERIAL-READY\n"

// A microVM guest's agent serves its virtio-serial port as a sequence of
// sessions, one per host connection to QEMU's end of the port (a listening
// socket in the sandbox's state directory on the host): when the host goes
// (a server killed, say) the guest's reads of the port return end of file,
// the session's connection ends as a host hang-up does (its foreground
// processes are killed, background ones and code contexts live on), and
// the agent waits, for the grace period ("--grace"), for a host to come
// back. Each session starts with the agent's SerialReady and then the
// host's preamble: the first session's token is the one every later
// session must present (the server that booted the guest sent it), so
// whatever reaches QEMU's socket without it gets nothing.

// serialPort serves a virtio-serial port's sessions as connections
// (net.Listener): Accept returns one end of a socket pair per session,
// whose other end the port's bytes are relayed to and from.
type serialPort struct {
	path     string
	dev      *os.File // non-blocking: a write waiting for a host can be cancelled
	sessions chan net.Conn
	once     sync.Once
	closed   chan struct{}
}

// openSerialPort opens the port at path and starts serving its sessions.
func openSerialPort(path string) (*serialPort, error) {
	dev, err := os.OpenFile(path, os.O_RDWR|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("serial: %w", err)
	}
	p := &serialPort{path: path, dev: dev, sessions: make(chan net.Conn), closed: make(chan struct{})}
	go p.run()
	return p, nil
}

// run serves one session after another until the port is closed.
func (p *serialPort) run() {
	for {
		// Blocks (in the poller) until a host is connected.
		if _, err := p.dev.Write([]byte(SerialReady)); err != nil {
			select {
			case <-p.closed:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock agent: serial: socketpair: %v\n", err)
			p.drain(nil)
			continue
		}
		ours, err := fileConn(fds[0], "serial-relay")
		if err != nil {
			unix.Close(fds[1])
			p.drain(nil)
			continue
		}
		theirs, err := fileConn(fds[1], "serial")
		if err != nil {
			ours.Close()
			p.drain(nil)
			continue
		}
		select {
		case p.sessions <- theirs:
		case <-p.closed:
			theirs.Close()
			ours.Close()
			return
		}
		p.drain(ours)
	}
}

// drain relays the current session between the port and c (nil: the
// session is refused, its bytes are dropped) until the host goes, then
// ends it: c is closed, and a write of it to the port still waiting for a
// host is cancelled, so that no byte of it reaches the next one.
func (p *serialPort) drain(c net.Conn) {
	done := make(chan struct{})
	if c != nil {
		go func() {
			defer close(done)
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if _, werr := p.dev.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	} else {
		close(done)
	}
	buf := make([]byte, 32<<10)
	alive := c != nil
	for {
		n, err := p.dev.Read(buf)
		if n > 0 && alive {
			if _, werr := c.Write(buf[:n]); werr != nil {
				alive = false // refused or ended by the agent: drop the rest
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				// Not the host's end: do not spin on a broken port.
				time.Sleep(100 * time.Millisecond)
			}
			break
		}
	}
	if c != nil {
		c.Close()
	}
	p.dev.SetWriteDeadline(time.Now())
	<-done
	p.dev.SetWriteDeadline(time.Time{})
}

// Accept returns the next session's connection.
func (p *serialPort) Accept() (net.Conn, error) {
	select {
	case c := <-p.sessions:
		return c, nil
	case <-p.closed:
		return nil, net.ErrClosed
	}
}

// Close stops serving sessions.
func (p *serialPort) Close() error {
	p.once.Do(func() { close(p.closed) })
	return nil
}

// Addr names the port.
func (p *serialPort) Addr() net.Addr { return serialAddr(p.path) }

type serialAddr string

func (a serialAddr) Network() string { return "virtio-serial" }
func (a serialAddr) String() string  { return string(a) }

// fileConn makes a socket descriptor a net.Conn (whose Close interrupts a
// read in progress).
func fileConn(fd int, name string) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), name)
	c, err := net.FileConn(f)
	f.Close()
	return c, err
}

// serialAuthTimeout bounds how long a session may take to send its
// preamble (an emulated guest on a loaded host is slow to get it; a
// session is the only one on its port meanwhile, and only the host can
// open one).
const serialAuthTimeout = time.Minute

// serialToken is the sessions' token: the first agent session's (set),
// which every later session of the agent's and egress ports must present.
var serialToken struct {
	once sync.Once
	set  chan struct{}
	tok  []byte
}

func init() { serialToken.set = make(chan struct{}) }

// admitSerial reads a session's preamble and admits it if it holds the
// token (the first agent session's sets it, when first is true); it closes
// those it refuses.
func admitSerial(c net.Conn, first bool) bool {
	c.SetReadDeadline(time.Now().Add(serialAuthTimeout))
	got, err := readToken(c)
	c.SetReadDeadline(time.Time{})
	if err != nil || len(got) != ReconnectTokenBytes {
		c.Close()
		return false
	}
	if first {
		set := false
		serialToken.once.Do(func() {
			serialToken.tok = got
			close(serialToken.set)
			set = true
		})
		if set {
			return true
		}
	}
	select {
	case <-serialToken.set:
	case <-time.After(time.Minute):
		c.Close()
		return false
	}
	if subtle.ConstantTimeCompare(got, serialToken.tok) != 1 {
		c.Close()
		return false
	}
	return true
}

// serialArg finds "--serial=PATH" in args: a character device (a
// virtio-serial port in a microVM guest) to serve instead of fd 0.
func serialArg(args []string) (string, bool) {
	for _, arg := range args {
		if v, ok := strings.CutPrefix(arg, "--serial="); ok {
			return v, true
		}
	}
	return "", false
}

// serialListener opens the "--serial=PATH" port, when args have it, and
// serves its sessions (nil without it).
func serialListener(args []string) (*serialPort, error) {
	path, ok := serialArg(args)
	if !ok {
		return nil, nil
	}
	return openSerialPort(path)
}
