package microvm

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/airlock-dev/airlock/agent"
)

// TestEgressMuxLimitsStreams: a guest opens many more egress connections
// than it may hold at once: the host hands the proxy at most
// MaxEgressStreams of them and resets the rest, and a slot freed by a
// closed connection serves the next one. A stream naming a listener that
// does not exist is closed.
func TestEgressMuxLimitsStreams(t *testing.T) {
	old := MaxEgressStreams
	MaxEgressStreams = 4
	defer func() { MaxEgressStreams = old }()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := newEgressMux(os.NewFile(uintptr(fds[0]), "host"), []string{"127.0.0.1:3128"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.sess.Close()
	gf := os.NewFile(uintptr(fds[1]), "guest")
	gc, err := net.FileConn(gf)
	gf.Close()
	if err != nil {
		t.Fatal(err)
	}
	guest, err := yamux.Client(gc, agent.EgressMux())
	if err != nil {
		t.Fatal(err)
	}
	defer guest.Close()
	ln := m.listeners()[0]
	open := func(idx byte) *yamux.Stream {
		st, err := guest.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Write([]byte{idx}); err != nil {
			t.Fatal(err)
		}
		return st
	}
	var held []io.Closer
	for range 4 {
		open(0)
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// The fifth is over the limit: reset, never handed to the proxy.
	over := open(0)
	over.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := over.Read(make([]byte, 1)); !closedNotTimedOut(err) {
		t.Fatalf("a stream over the limit was not reset: %v", err)
	}
	// A bad listener index is closed too.
	held[0].Close()
	bad := open(9)
	bad.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := bad.Read(make([]byte, 1)); !closedNotTimedOut(err) {
		t.Fatalf("a stream for no listener was not closed: %v", err)
	}
	// A freed slot serves the next connection.
	held[1].Close()
	open(0)
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	select {
	case err := <-accepted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a connection within the limit was not served")
	}
}

// closedNotTimedOut reports whether a read ended because the host closed
// or reset the stream, not because nothing came.
func closedNotTimedOut(err error) bool {
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}
