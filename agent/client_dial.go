package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// FrameDial opens a TCP connection to a port of the sandbox's loopback
// interface: the agent answers Started once connected, then both sides send
// Data (and EOF for a half-close); the stream ends (Result) when the
// sandbox's side has nothing more to say.
const FrameDial FrameType = 0x41

func init() { frameNames[FrameDial] = "dial" }

// dialMsg is the Dial request.
type dialMsg struct {
	Port int `json:"port"`
}

// Dial connects to 127.0.0.1:port inside the sandbox, through the agent.
// The connection is a net.Conn whose deadlines are not supported (they
// return an error); closing it, or ctx ending before it is made, ends it.
func (c *Client) Dial(ctx context.Context, port int) (*PortConn, error) {
	if port < 1 || port > 65535 {
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("bad port %d", port)}
	}
	s, err := c.openStarted(ctx, FrameDial, dialMsg{Port: port}, "dial")
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(context.Background())
	return &PortConn{s: s, ctx: cctx, cancel: cancel, port: port}, nil
}

// PortConn is a connection to a port inside a sandbox.
type PortConn struct {
	s      *cstream
	ctx    context.Context
	cancel context.CancelFunc
	port   int

	rmu  sync.Mutex
	rbuf []byte
	rlen int // size of the frame rbuf came from, granted back once read
	rerr error
	once sync.Once
}

var _ net.Conn = (*PortConn)(nil)

// Read implements net.Conn.
func (pc *PortConn) Read(p []byte) (int, error) {
	pc.rmu.Lock()
	defer pc.rmu.Unlock()
	for len(pc.rbuf) == 0 {
		if pc.rerr != nil {
			return 0, pc.rerr
		}
		if pc.rlen > 0 {
			pc.s.consumed(pc.rlen)
			pc.rlen = 0
		}
		f, err := pc.s.next(pc.ctx)
		if err != nil {
			if pc.ctx.Err() != nil {
				err = net.ErrClosed
			}
			pc.rerr = err
			continue
		}
		switch f.Type {
		case FrameData:
			pc.rbuf, pc.rlen = f.Payload, len(f.Payload)
		case FrameResult:
			pc.rerr = io.EOF
		case FrameError:
			pc.rerr = decodeError(f.Payload)
		default:
			pc.rerr = protoErr("unexpected %s frame on a connection", f.Type)
			pc.s.reset()
		}
	}
	n := copy(p, pc.rbuf)
	pc.rbuf = pc.rbuf[n:]
	return n, nil
}

// Write implements net.Conn.
func (pc *PortConn) Write(p []byte) (int, error) {
	if err := pc.s.sendData(pc.ctx, p); err != nil {
		if pc.ctx.Err() != nil {
			err = net.ErrClosed
		}
		return 0, err
	}
	return len(p), nil
}

// CloseWrite half-closes the connection: the sandbox's side reads EOF.
func (pc *PortConn) CloseWrite() error { return pc.s.c.write(FrameEOF, pc.s.id, nil) }

// Close implements net.Conn.
func (pc *PortConn) Close() error {
	pc.once.Do(func() {
		pc.cancel()
		pc.s.reset()
	})
	return nil
}

// portAddr names the two ends of a PortConn.
type portAddr string

func (a portAddr) Network() string { return "airlock-agent" }
func (a portAddr) String() string  { return string(a) }

// LocalAddr implements net.Conn.
func (pc *PortConn) LocalAddr() net.Addr { return portAddr("host") }

// RemoteAddr implements net.Conn.
func (pc *PortConn) RemoteAddr() net.Addr { return portAddr(fmt.Sprintf("sandbox:%d", pc.port)) }

// errNoDeadlines is returned by the deadline setters.
var errNoDeadlines = fmt.Errorf("agent connections have no deadlines")

// SetDeadline implements net.Conn; deadlines are not supported.
func (pc *PortConn) SetDeadline(time.Time) error { return errNoDeadlines }

// SetReadDeadline implements net.Conn; deadlines are not supported.
func (pc *PortConn) SetReadDeadline(time.Time) error { return errNoDeadlines }

// SetWriteDeadline implements net.Conn; deadlines are not supported.
func (pc *PortConn) SetWriteDeadline(time.Time) error { return errNoDeadlines }
