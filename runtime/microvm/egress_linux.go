package microvm

import (
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/agent"
)

// egressMux is the host end of a guest's egress port: the guest's agent
// opens a stream per connection made to one of its listen addresses
// (agent's --egress-listen), and the stream's first byte names which; the
// host hands it to that address's listener, which the manager serves with
// the egress proxy as it serves a native sandbox's.
type egressMux struct {
	sess *yamux.Session
	lns  []*muxListener
	// open holds a slot per stream not yet closed: a guest has at most
	// MaxEgressStreams connections at once (each may buffer a yamux
	// window on the host, outside the guest's memory), the rest are reset.
	open chan struct{}
}

// MaxEgressStreams bounds a guest's concurrent egress connections.
var MaxEgressStreams = 128

// newEgressMux serves the session on conn and returns a listener per
// address, in order.
func newEgressMux(f *os.File, addrs []string) (*egressMux, error) {
	// A net.Conn, whose Close interrupts a read in progress (an *os.File
	// of a blocking socket's would not).
	conn, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	sess, err := yamux.Server(conn, agent.EgressMux())
	if err != nil {
		conn.Close()
		return nil, err
	}
	m := &egressMux{sess: sess, open: make(chan struct{}, MaxEgressStreams)}
	for _, a := range addrs {
		addr, err := net.ResolveTCPAddr("tcp", a)
		if err != nil {
			sess.Close()
			return nil, err
		}
		m.lns = append(m.lns, &muxListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})})
	}
	go m.serve()
	return m, nil
}

// serve dispatches the guest's streams until the session ends.
func (m *egressMux) serve() {
	defer func() {
		for _, l := range m.lns {
			l.Close()
		}
	}()
	for {
		st, err := m.sess.AcceptStream()
		if err != nil {
			return
		}
		select {
		case m.open <- struct{}{}:
		default:
			st.Close() // over the limit
			continue
		}
		go func() {
			var c net.Conn = &slotConn{Conn: st, release: func() { <-m.open }}
			st.SetReadDeadline(time.Now().Add(30 * time.Second))
			var b [1]byte
			if _, err := st.Read(b[:]); err != nil || int(b[0]) >= len(m.lns) {
				c.Close()
				return
			}
			st.SetReadDeadline(time.Time{})
			l := m.lns[b[0]]
			select {
			case l.conns <- c:
			case <-l.done:
				c.Close()
			}
		}()
	}
}

// slotConn is a stream that gives its slot back when closed.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// Close closes the stream and frees its slot.
func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// listeners returns the listeners as net.Listeners.
func (m *egressMux) listeners() []net.Listener {
	out := make([]net.Listener, len(m.lns))
	for i, l := range m.lns {
		out[i] = l
	}
	return out
}

// muxListener is one listen address of a guest (net.Listener).
type muxListener struct {
	addr  *net.TCPAddr
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

// Accept returns the next connection the guest made to the address.
func (l *muxListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; the guest's next connections are closed.
func (l *muxListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr is the address inside the guest.
func (l *muxListener) Addr() net.Addr { return l.addr }

// egressPair returns a new mux serving the listen addresses and the host
// side of its connection, which a portRelay carries to the guest's egress
// port.
func egressPair(addrs []string) (*egressMux, net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	relayEnd := os.NewFile(uintptr(fds[0]), "egress-relay")
	host, err := net.FileConn(relayEnd)
	relayEnd.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	mux, err := newEgressMux(os.NewFile(uintptr(fds[1]), "egress"), addrs)
	if err != nil {
		host.Close()
		return nil, nil, err
	}
	return mux, host, nil
}
