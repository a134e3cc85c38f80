package agent

import (
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// SerialReady is what the agent writes on its "--serial" device once it
// has opened it, before any frame: the host waits for it, because a
// virtio-serial port drops what arrives while the guest has it closed.
const SerialReady = "AIRLOCK-SERIAL-READY\n"

// serialArg finds "--serial=PATH" in args: a character device (a
// virtio-serial port in a microVM guest) to serve instead of fd 0.
func serialArg(args []string) (string, bool) {
	for _, arg := range args {
		if v, ok := strings.CutPrefix(arg, "--serial="); ok {
			return v, true
		}
	}
	return "", false
}

// serialStdin makes fd 0 a connected socket that carries the byte stream
// of the character device named by "--serial=PATH", when args have it.
// The agent serves a socket (FileConn), and a virtio-serial port is a
// character device: two goroutines relay between it and one end of a
// socketpair whose other end becomes fd 0. When the device reports end of
// stream (the host closed its side), the socket is shut down, which ends
// the agent's connection like a host hang-up.
func serialStdin(args []string) error {
	path, ok := serialArg(args)
	if !ok {
		return nil
	}
	dev, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("serial: %w", err)
	}
	if _, err := dev.Write([]byte(SerialReady)); err != nil {
		dev.Close()
		return fmt.Errorf("serial: ready: %w", err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		dev.Close()
		return fmt.Errorf("serial: socketpair: %w", err)
	}
	if err := unix.Dup3(fds[1], 0, 0); err != nil {
		dev.Close()
		unix.Close(fds[0])
		unix.Close(fds[1])
		return fmt.Errorf("serial: fd 0: %w", err)
	}
	unix.Close(fds[1])
	relay := os.NewFile(uintptr(fds[0]), "serial-relay")
	go func() {
		io.Copy(relay, dev)
		unix.Shutdown(fds[0], unix.SHUT_WR)
	}()
	go func() {
		io.Copy(dev, relay)
	}()
	return nil
}
