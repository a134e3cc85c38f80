package agent

import (
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestOutputPendingSeesTerminalBuffer: the drain check sees a terminal's
// output as soon as it is written, before the kernel's work queue has moved
// it to the master's read buffer (where TIOCINQ, the old check, looks).
// Each round writes one byte to a slave and asks at once; TIOCINQ alone
// said 0 in most rounds here, as the work had not run yet.
func TestOutputPendingSeesTerminalBuffer(t *testing.T) {
	inqZero := 0
	const rounds = 1000
	for i := range rounds {
		m, s, err := openPty(PtySize{Cols: 80, Rows: 24})
		if err != nil {
			t.Fatal(err)
		}
		mfd := dupFd(t, m)
		if _, err := s.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		var n int32
		unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCINQ, uintptr(unsafe.Pointer(&n)))
		if n == 0 {
			inqZero++
		}
		if !outputPending(mfd) {
			t.Errorf("round %d: a byte written to the terminal is not seen as pending", i)
		}
		// Drained, nothing is pending.
		var b [8]byte
		if k, err := unix.Read(mfd, b[:]); k != 1 || err != nil {
			t.Fatalf("round %d: read %d, %v", i, k, err)
		}
		if outputPending(mfd) {
			t.Errorf("round %d: pending after the only byte was read", i)
		}
		unix.Close(mfd)
		m.Close()
		s.Close()
	}
	t.Logf("TIOCINQ said 0 right after the write in %d of %d rounds", inqZero, rounds)
}

func dupFd(t *testing.T, f *os.File) int {
	t.Helper()
	fd, err := dupCloexec(f)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}
