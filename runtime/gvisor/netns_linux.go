package gvisor

import (
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// egressNetns makes a fresh network namespace holding only loopback (up)
// and the TCP listeners addrs (the egress proxy's, 127.0.0.1:PORT), owned
// by this process. A sandbox with network runs `runsc --network=host`
// inside it: gVisor's sentry then serves the program's socket calls with
// host sockets of this namespace, where nothing but those listeners
// exists. The returned file keeps the namespace for runsc to join.
func egressNetns(addrs []string) (*os.File, []net.Listener, error) {
	type result struct {
		ns  *os.File
		ls  []net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// This thread never returns to the host namespace: it stays locked
		// and exits with the goroutine.
		runtime.LockOSThread()
		var r result
		defer func() {
			if r.err != nil {
				for _, l := range r.ls {
					l.Close()
				}
				if r.ns != nil {
					r.ns.Close()
				}
				r.ls, r.ns = nil, nil
			}
			ch <- r
		}()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			r.err = fmt.Errorf("new network namespace: %w", err)
			return
		}
		if r.err = loopbackUp(); r.err != nil {
			return
		}
		ns, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			r.err = fmt.Errorf("open network namespace: %w", err)
			return
		}
		r.ns = ns
		for _, a := range addrs {
			l, err := net.Listen("tcp4", a)
			if err != nil {
				r.err = fmt.Errorf("listen on %s in the sandbox's network namespace: %w", a, err)
				return
			}
			r.ls = append(r.ls, l)
		}
	}()
	r := <-ch
	return r.ns, r.ls, r.err
}

// loopbackUp brings lo up in the calling thread's network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	req, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	req.SetUint16(unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, req); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}
