package agent

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"
)

// dialTimeout bounds connecting to a port of the sandbox's loopback.
const dialTimeout = 10 * time.Second

// handleDial connects to a port of the sandbox's loopback interface and
// relays bytes both ways until either side is done.
func (c *hostConn) handleDial(s *astream, payload []byte) (any, error) {
	var req dialMsg
	if err := decodeJSON(payload, &req); err != nil {
		return nil, invalid(err)
	}
	if req.Port < 1 || req.Port > 65535 {
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("bad port %d", req.Port)}
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(req.Port)), dialTimeout)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, &Error{Code: CodeNotFound, Message: fmt.Sprintf("nothing listens on port %d in the sandbox", req.Port)}
		}
		return nil, fmt.Errorf("connecting to port %d: %w", req.Port, err)
	}
	tcp := conn.(*net.TCPConn)
	defer tcp.Close()
	s.onGone(func() { tcp.Close() })
	if err := s.send(FrameStarted, emptyMsg{}); err != nil {
		return nil, errStreamGone
	}
	// Host to sandbox.
	go func() {
		for {
			p, eof, err := s.recv()
			if err != nil {
				tcp.Close()
				return
			}
			if eof {
				tcp.CloseWrite()
				return
			}
			if _, err := tcp.Write(p); err != nil {
				tcp.Close()
				return
			}
			s.consumed(len(p))
		}
	}()
	// Sandbox to host; its end ends the stream.
	buf := make([]byte, 32<<10)
	for {
		n, err := tcp.Read(buf)
		if n > 0 {
			if serr := s.sendData(FrameData, buf[:n]); serr != nil {
				return nil, errStreamGone
			}
		}
		if err != nil {
			return emptyMsg{}, nil
		}
	}
}
