package manager

import (
	"net"

	"airlock/runtime/native"
)

// listenIn opens TCP listeners inside the network namespace of the sandbox
// whose init has host pid pid.
func listenIn(pid int, addrs []string) ([]net.Listener, error) { return native.ListenIn(pid, addrs) }
