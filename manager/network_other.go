//go:build !linux

package manager

import (
	"net"

	"github.com/airlock-dev/airlock/runtime/tier"
)

func listenIn(pid int, addrs []string) ([]net.Listener, error) { return nil, errNotLinux }

func instListenIn(inst tier.Instance, addrs []string) ([]net.Listener, error) {
	return nil, errNotLinux
}
