package agent

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// EgressMux is the multiplexer configuration of a microVM guest's egress
// port, on both ends: the guest opens a stream per connection, the host
// never pings (a virtio-serial port drops what arrives while the guest has
// it closed), and a stream's first byte names the listener it came from.
func EgressMux() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.LogOutput = io.Discard
	c.ConnectionWriteTimeout = 30 * time.Second
	return c
}

// egressRelay serves the host's egress proxy inside a microVM guest, which
// has no network device: with "--egress=PATH" (the virtio-serial port
// named airlock.egress) and "--egress-listen=ADDR,...", it listens on each
// ADDR (the guest's loopback) and carries every connection to the host as
// a stream of a multiplexed session on the port, whose first byte is the
// index of its ADDR. The host hands the streams to the proxy, so
// allowlists, credential injection and the network log are the native
// tier's. The port is served in sessions, as the agent's (serialPort):
// each host connection that presents the agent's token gets a new
// multiplexed session, which replaces the last (a restarted server's
// proxy takes over); connections made while no session is up are closed.
func egressRelay(args []string) error {
	var path string
	var addrs []string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--egress="); ok {
			path = v
		}
		if v, ok := strings.CutPrefix(a, "--egress-listen="); ok {
			addrs = strings.Split(v, ",")
		}
	}
	if path == "" && len(addrs) == 0 {
		return nil
	}
	if path == "" || len(addrs) == 0 || len(addrs) > 255 {
		return fmt.Errorf("egress: want --egress=PORT and --egress-listen=ADDR,... together (got %q, %q)", path, addrs)
	}
	var lns []net.Listener
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("egress: listen %s: %w", a, err)
		}
		lns = append(lns, ln)
	}
	port, err := openSerialPort(path)
	if err != nil {
		for _, l := range lns {
			l.Close()
		}
		return fmt.Errorf("egress: %w", err)
	}
	var cur atomic.Pointer[yamux.Session]
	go func() {
		for {
			c, err := port.Accept()
			if err != nil {
				return
			}
			go func() {
				if !admitSerial(c, false) {
					return
				}
				sess, err := yamux.Client(c, EgressMux())
				if err != nil {
					c.Close()
					return
				}
				if old := cur.Swap(sess); old != nil {
					old.Close()
				}
			}()
		}
	}()
	for i, ln := range lns {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				sess := cur.Load()
				if sess == nil || sess.IsClosed() {
					c.Close() // no host proxy at the moment
					continue
				}
				go relayEgress(sess, byte(i), c)
			}
		}()
	}
	return nil
}

// relayEgress carries one guest connection over a new stream.
func relayEgress(sess *yamux.Session, idx byte, c net.Conn) {
	defer c.Close()
	st, err := sess.OpenStream()
	if err != nil {
		return
	}
	defer st.Close()
	if _, err := st.Write([]byte{idx}); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		io.Copy(st, c)
		st.Close() // half-close: the host sees end of stream
		close(done)
	}()
	io.Copy(c, st)
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	<-done
}
