package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-dev/airlock/agent"
)

// A sandbox whose agent a server reached over TCP (AgentAddr, in its
// network namespace) rather than over the socketpair it was started with
// is in "TCP mode": it was taken over running after a server restart, or
// it is restored or forked from one that was. Its agent serves the TCP
// connection in place of its first one, so a checkpoint carries no usable
// host connection: gVisor restores a connected host socket broken (EPIPE),
// and the socketpair given to `runsc restore` is no longer read by the
// agent. After every restore (resume, fork) of such a sandbox the host
// therefore dials the agent's listener again, which gVisor restores
// listening, sends the token and a hello, and continues the stream on the
// new connection (swapConn.swap). What ran on the old connection (a
// foreground exec's stream) ended with it, as on any reconnect; background
// processes, files and interpreter state are the agent's and go on.

// tcpMarker is the file, in a sandbox's state directory and in a snapshot
// image, that says its agent is reached over TCP.
const tcpMarker = "agent.tcp"

// agentHome is the home the manager's clients give the agent in their hello
// (relative paths are resolved from it).
const agentHome = "/workspace"

// reconnectWait bounds how long a restored agent's listener may take to
// accept and answer the hello.
const reconnectWait = 30 * time.Second

// markTCP records in dir that the sandbox's agent is reached over TCP.
func markTCP(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, tcpMarker), nil, 0o600); err != nil {
		return fmt.Errorf("gvisor: record the agent's TCP connection: %w", err)
	}
	return nil
}

// isTCP reports whether dir records an agent reached over TCP.
func isTCP(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, tcpMarker))
	return err == nil
}

// setTCP puts the handle in TCP mode and records it in the sandbox's
// state directory, for a server that adopts it paused after a restart.
func (h *Handle) setTCP() error {
	h.mu.Lock()
	h.tcp = true
	dir := h.cur.dir
	h.mu.Unlock()
	return markTCP(dir)
}

// reconnect dials the agent of sb again over TCP (token sent) and does the
// hello handshake on the new connection, so that the returned connection
// continues an existing client's session.
func reconnect(sb *Sandbox) (net.Conn, error) {
	if sb.nsPath == "" || sb.token == nil {
		return nil, errors.New("gvisor: this sandbox's agent is not reconnectable")
	}
	ctx, cancel := context.WithTimeout(context.Background(), reconnectWait)
	defer cancel()
	var last error
	for {
		c, err := dialAgent(ctx, sb.nsPath, sb.token)
		if err == nil {
			if err = hello(ctx, c); err == nil {
				return c, nil
			}
			c.Close()
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("gvisor: reconnect to the restored agent: %w", last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// hello does the client's side of the agent's handshake on c.
func hello(ctx context.Context, c net.Conn) error {
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	defer c.SetDeadline(time.Time{})
	p, err := json.Marshal(struct {
		Version int    `json:"version"`
		Home    string `json:"home"`
	}{agent.Version, agentHome})
	if err != nil {
		return err
	}
	if _, err := c.Write(agent.AppendFrame(nil, agent.FrameHello, 0, p)); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	f, err := agent.ReadFrame(c) // exactly one frame: nothing after it is read
	if err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	if f.Type != agent.FrameHello || f.Stream != 0 {
		return fmt.Errorf("hello: the agent answered %s on stream %d: %s", f.Type, f.Stream, f.Payload)
	}
	return nil
}
