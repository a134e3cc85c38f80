package gvisor

import (
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// swapConn is a net.Conn whose underlying connection can be replaced: the
// byte stream goes on over the new one. A gvisor sandbox's agent keeps its
// connection across checkpoint and restore this way: while the sandbox is
// held (checkpointed), writes wait and the old connection's end of file is
// not reported; swap resumes both on the socket the restored agent got.
type swapConn struct {
	mu     sync.Mutex
	cond   *sync.Cond
	cur    net.Conn
	gen    int
	held   bool
	closed bool
}

func newSwapConn(c net.Conn) *swapConn {
	s := &swapConn{cur: c}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// hold makes writes wait and read errors wait for swap.
func (s *swapConn) hold() {
	s.mu.Lock()
	s.held = true
	s.mu.Unlock()
}

// release ends a hold without a new connection (the checkpoint failed).
func (s *swapConn) release() {
	s.mu.Lock()
	s.held = false
	s.cond.Broadcast()
	s.mu.Unlock()
}

// file returns a duplicate of the current connection's descriptor, for a
// process that must keep the connection open (see gvisorHandle.suspend).
func (s *swapConn) file() (*os.File, error) {
	s.mu.Lock()
	c := s.cur
	s.mu.Unlock()
	fc, ok := c.(interface{ File() (*os.File, error) })
	if !ok {
		return nil, errors.New("manager: the agent's connection has no descriptor")
	}
	return fc.File()
}

// swap continues the stream on c and ends the hold.
func (s *swapConn) swap(c net.Conn) {
	s.mu.Lock()
	old := s.cur
	s.cur, s.held = c, false
	s.gen++
	s.cond.Broadcast()
	s.mu.Unlock()
	old.Close()
}

func (s *swapConn) Read(p []byte) (int, error) {
	for {
		s.mu.Lock()
		c, gen := s.cur, s.gen
		s.mu.Unlock()
		n, err := c.Read(p)
		if err == nil || n > 0 {
			return n, nil
		}
		s.mu.Lock()
		for s.held && s.gen == gen && !s.closed {
			s.cond.Wait()
		}
		swapped := s.gen != gen && !s.closed
		s.mu.Unlock()
		if !swapped {
			return 0, err
		}
	}
}

func (s *swapConn) Write(p []byte) (int, error) {
	s.mu.Lock()
	for s.held && !s.closed {
		s.cond.Wait()
	}
	c := s.cur
	s.mu.Unlock()
	return c.Write(p)
}

func (s *swapConn) Close() error {
	s.mu.Lock()
	s.closed = true
	c := s.cur
	s.cond.Broadcast()
	s.mu.Unlock()
	return c.Close()
}

func (s *swapConn) conn() net.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *swapConn) LocalAddr() net.Addr                { return s.conn().LocalAddr() }
func (s *swapConn) RemoteAddr() net.Addr               { return s.conn().RemoteAddr() }
func (s *swapConn) SetDeadline(t time.Time) error      { return s.conn().SetDeadline(t) }
func (s *swapConn) SetReadDeadline(t time.Time) error  { return s.conn().SetReadDeadline(t) }
func (s *swapConn) SetWriteDeadline(t time.Time) error { return s.conn().SetWriteDeadline(t) }
