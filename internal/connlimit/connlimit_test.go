package connlimit

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestClientKey: IPv4 addresses count one by one, IPv6 ones by /64 (and
// an IPv4-mapped IPv6 address as its IPv4 address).
func TestClientKey(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.7":            "192.0.2.7",
		"::ffff:192.0.2.7":     "192.0.2.7",
		"2001:db8:1:2:3:4:5:6": "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff::1": "2001:db8:1:2::/64",
		"2001:db8:1:3::1":      "2001:db8:1:3::/64",
	} {
		if got := ClientKey(net.ParseIP(in)); got != want {
			t.Errorf("ClientKey(%s) = %s, want %s", in, got, want)
		}
	}
}

// TestPerAddrAndTotal: over a real loopback listener, an address at its
// cap has its next connection closed at once (and logged) while another
// address is accepted; closing a connection frees its place; reaching
// the total is logged.
func TestPerAddrAndTotal(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logged []string
	ln := Listen(inner, Config{Max: 3, PerAddr: 2, Logf: func(f string, a ...any) {
		mu.Lock()
		logged = append(logged, f)
		mu.Unlock()
	}})
	defer ln.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func(from string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	wait := func() net.Conn {
		select {
		case c := <-accepted:
			return c
		case <-time.After(time.Minute):
			t.Fatal("no connection accepted")
			return nil
		}
	}
	a1, a2 := dial("127.0.0.1"), dial("127.0.0.1")
	defer a1.Close()
	defer a2.Close()
	s1, s2 := wait(), wait()
	over := dial("127.0.0.1")
	over.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.ReadAll(over); err != nil {
		t.Fatalf("the third connection from one address was not closed: %v", err)
	}
	b := dial("127.0.0.2")
	defer b.Close()
	wait()
	mu.Lock()
	got := strings.Join(logged, "\n")
	mu.Unlock()
	if !strings.Contains(got, "--max-conns-per-ip") || !strings.Contains(got, "connection cap reached") {
		t.Fatalf("logged %q", got)
	}
	// A place of 127.0.0.1 (and of the total) frees when its connection closes.
	s1.Close()
	a3 := dial("127.0.0.1")
	defer a3.Close()
	wait()
	s2.Close()
}
