//go:build !linux

package manager

import "net"

func listenIn(pid int, addrs []string) ([]net.Listener, error) { return nil, errNotLinux }
