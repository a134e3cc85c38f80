package manager

import (
	"net"

	"github.com/airlock-dev/airlock/runtime/native"
	"github.com/airlock-dev/airlock/runtime/tier"
)

// listenIn opens TCP listeners inside the network namespace of the sandbox
// whose init has host pid pid.
func listenIn(pid int, addrs []string) ([]net.Listener, error) { return native.ListenIn(pid, addrs) }

// instListenIn opens TCP listeners inside the network namespace of the
// sandbox inst: the one it holds itself (tier.NetAttacher, gVisor's), else
// its init's.
func instListenIn(inst tier.Instance, addrs []string) ([]net.Listener, error) {
	if a, ok := inst.(tier.NetAttacher); ok {
		return a.ListenIn(addrs)
	}
	return listenIn(inst.Pid(), addrs)
}
