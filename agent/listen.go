package agent

import "net"

// ListenConfig configures MainListen.
type ListenConfig struct {
	// Listener accepts the raw connections of hosts (airlock servers).
	Listener net.Listener
	// Authenticate turns a raw connection into an authenticated one (TLS
	// and the sandbox's token, kube/agenttls.Server.Authenticate) or fails,
	// having closed it. Nothing of the agent protocol is read or sent
	// before it succeeds. It must not be nil: there is no plaintext mode.
	Authenticate func(net.Conn) (net.Conn, error)
	// MaxPending caps connections being authenticated at once; more are
	// closed at once. 64 if zero.
	MaxPending int
}
