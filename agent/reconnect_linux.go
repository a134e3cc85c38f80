package agent

import (
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// A reconnectable agent ("--reconnect ADDR" with a connected fd 0) serves
// its first host connection on fd 0, as a connected agent does, but does
// not end with it: it also listens on TCP ADDR (in the sandbox's own
// network namespace) for a host that comes back, as the gvisor tier's
// agent does so that a restarted server can take the sandbox over. Anything
// inside the sandbox can connect to ADDR too, so a connection is served only
// after it has sent the token the host gave on fd 0 before its hello
// (ReconnectPreamble). A connection served replaces the current one; when
// none is left the agent waits for the grace period ("--grace") and then
// kills everything and exits, as a listening agent does.

// ReconnectTokenBytes is the size of a reconnect token (hex-encoded on the
// wire: twice as many characters, then a newline).
const ReconnectTokenBytes = 32

// reconnectAuthTimeout bounds how long a connection to ADDR may take to
// send its token, and maxReconnectPending how many may be pending at once:
// a program inside cannot hold the listener up.
const (
	reconnectAuthTimeout = 10 * time.Second
	maxReconnectPending  = 8
)

// ReconnectPreamble is what the host sends first on every connection to a
// reconnectable agent, on fd 0 and on ADDR alike: the token, hex, and a
// newline.
func ReconnectPreamble(token []byte) []byte {
	return []byte(hex.EncodeToString(token) + "\n")
}

// reconnectArg finds "--reconnect ADDR" or "--reconnect=ADDR" in args.
func reconnectArg(args []string) (string, bool) {
	for i, arg := range args {
		v, ok := strings.CutPrefix(arg, "--reconnect=")
		if !ok && arg == "--reconnect" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if ok {
			return v, true
		}
	}
	return "", false
}

// readToken reads a preamble from c byte by byte (nothing after it is
// consumed) and returns the token it holds.
func readToken(c net.Conn) ([]byte, error) {
	buf := make([]byte, 2*ReconnectTokenBytes+1)
	if _, err := io.ReadFull(c, buf); err != nil {
		return nil, fmt.Errorf("reading the reconnect token: %w", err)
	}
	if buf[len(buf)-1] != '\n' {
		return nil, fmt.Errorf("bad reconnect preamble")
	}
	tok, err := hex.DecodeString(string(buf[:len(buf)-1]))
	if err != nil {
		return nil, fmt.Errorf("bad reconnect preamble: %w", err)
	}
	return tok, nil
}

// runReconnectable reads the token from first, listens on addr and serves
// first, then every connection to addr that presents the token.
func runReconnectable(first net.Conn, addr string) int {
	grace, err := graceArg(os.Args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: %v\n", err)
		return 2
	}
	first.SetReadDeadline(time.Now().Add(time.Minute))
	token, err := readToken(first)
	first.SetReadDeadline(time.Time{})
	if err != nil || len(token) != ReconnectTokenBytes {
		fmt.Fprintf(os.Stderr, "airlock agent: fd 0: %v (want a %d-byte token)\n", err, ReconnectTokenBytes)
		return 1
	}
	// Bound before the first request is served, so before any program of
	// the sandbox runs: nothing inside can take the address first.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock agent: reconnect listener: %v\n", err)
		return 1
	}
	pending := make(chan struct{}, maxReconnectPending)
	admit := func(c net.Conn) bool {
		select {
		case pending <- struct{}{}:
			defer func() { <-pending }()
		default:
			c.Close()
			return false
		}
		c.SetReadDeadline(time.Now().Add(reconnectAuthTimeout))
		got, err := readToken(c)
		c.SetReadDeadline(time.Time{})
		if err != nil || subtle.ConstantTimeCompare(got, token) != 1 {
			c.Close()
			return false
		}
		return true
	}
	return runListener(ln, grace, first, admit)
}
