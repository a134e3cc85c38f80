package native

import (
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// ListenIn opens TCP listeners inside the network namespace of the
// sandbox whose init has host pid pid (a server that restarted uses it to
// offer the egress proxy again to a sandbox it reattached).
func ListenIn(pid int, addrs []string) ([]net.Listener, error) { return listenIn(pid, addrs) }

// listenIn opens TCP listeners inside the network namespace of pid. The
// sockets live in the sandbox's namespace (programs inside reach them at
// the given addresses, e.g. 127.0.0.1:3128) but belong to the host process:
// this is how the egress proxy is offered to a sandbox whose namespace is
// otherwise empty, with no veth, no iptables and no trust in anything that
// runs inside. Works unprivileged: the launcher owns the sandbox's user
// namespace.
func listenIn(pid int, addrs []string) ([]net.Listener, error) {
	if len(addrs) == 0 {
		return nil, nil
	}
	target, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return nil, fmt.Errorf("open sandbox netns: %w", err)
	}
	defer target.Close()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("open own netns: %w", err)
	}
	defer self.Close()

	type result struct {
		ls  []net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// A dedicated thread: if it cannot return to the host namespace it
		// stays locked and dies with this goroutine instead of serving others.
		runtime.LockOSThread()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("enter sandbox netns: %w", err)}
			return
		}
		var r result
		for _, a := range addrs {
			l, err := net.Listen("tcp", a)
			if err != nil {
				r.err = fmt.Errorf("listen on %s inside the sandbox: %w", a, err)
				break
			}
			r.ls = append(r.ls, l)
		}
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			r.err = fmt.Errorf("return to host netns: %w", err)
			ch <- r
			return // thread stays locked: the runtime discards it
		}
		runtime.UnlockOSThread()
		ch <- r
	}()
	r := <-ch
	if r.err != nil {
		for _, l := range r.ls {
			l.Close()
		}
		return nil, r.err
	}
	return r.ls, nil
}
