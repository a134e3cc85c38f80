package native

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"unsafe"

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

// errNoListeners means the child ended before it sent its listeners.
var errNoListeners = errors.New("sandbox sent no listeners")

// planListeners prepares the child's part: the addresses (IPv4 loopback
// host:port only) and the SCM_RIGHTS message the fds travel in.
func planListeners(pl *plan, addrs []string) error {
	for _, a := range addrs {
		ap, err := netip.ParseAddrPort(a)
		if err != nil || !ap.Addr().Is4() || !ap.Addr().IsLoopback() || ap.Port() == 0 {
			return fmt.Errorf("listen address %q: want 127.x.y.z:PORT", a)
		}
		var sa unix.RawSockaddrInet4
		sa.Family = unix.AF_INET
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		p[0], p[1] = byte(ap.Port()>>8), byte(ap.Port())
		sa.Addr = ap.Addr().As4()
		pl.listenAddrs = append(pl.listenAddrs, sa)
	}
	n := len(pl.listenAddrs)
	pl.cmsg = make([]byte, unix.CmsgSpace(4*n))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&pl.cmsg[0]))
	h.Level, h.Type = unix.SOL_SOCKET, unix.SCM_RIGHTS
	h.SetLen(unix.CmsgLen(4 * n))
	pl.cmsgData = unix.CmsgLen(0)
	pl.iov.Base = &pl.iovByte[0]
	pl.iov.SetLen(1)
	pl.msg = &unix.Msghdr{Iov: &pl.iov, Iovlen: 1, Control: &pl.cmsg[0]}
	pl.msg.SetControllen(len(pl.cmsg))
	return nil
}

// recvListeners receives the n listening sockets the child sent on fd.
func recvListeners(fd, n int) ([]net.Listener, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*n))
	nr, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("receive listeners: %w", err)
	}
	if nr == 0 {
		return nil, errNoListeners
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("receive listeners: bad control message (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil {
		return nil, fmt.Errorf("receive listeners: %w", err)
	}
	var ls []net.Listener
	for i, f := range fds {
		if i >= n {
			unix.Close(f)
			continue
		}
		file := os.NewFile(uintptr(f), "sandbox-listener")
		l, err := net.FileListener(file)
		file.Close()
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return nil, fmt.Errorf("receive listeners: %w", err)
		}
		ls = append(ls, l)
	}
	if len(ls) != n {
		for _, l := range ls {
			l.Close()
		}
		return nil, fmt.Errorf("receive listeners: got %d of %d", len(ls), n)
	}
	return ls, nil
}
