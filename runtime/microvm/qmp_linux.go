package microvm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// qmpConn is the host's end of a QEMU's monitor (QMP, QEMU's JSON control
// protocol), on a socketpair QEMU got as a descriptor: the tier stops and
// continues the guest, migrates its state to a file and quits QEMU through
// it. QMP speaks for QEMU, not for the guest; still, a guest that escaped
// into QEMU could answer anything, so replies are bounded in size and
// time and only their "return" or "error" is read.
type qmpConn struct {
	mu sync.Mutex
	c  *net.UnixConn
	r  *bufio.Reader
}

// qmpTimeout bounds one QMP command; qmpLineMax one reply line.
const (
	qmpTimeout = 60 * time.Second
	qmpLineMax = 1 << 20
)

// newQMP takes over f, the host's end of QEMU's monitor socket, and does
// the capabilities handshake (QEMU's greeting, then qmp_capabilities).
func newQMP(f *os.File) (*qmpConn, error) {
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("microvm: qmp: %w", err)
	}
	q := &qmpConn{c: c.(*net.UnixConn), r: bufio.NewReaderSize(c, 64<<10)}
	return q, nil
}

// handshake reads QEMU's greeting and leaves negotiation mode.
func (q *qmpConn) handshake(timeout time.Duration) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.c.SetDeadline(time.Now().Add(timeout))
	defer q.c.SetDeadline(time.Time{})
	line, err := q.readLine()
	if err != nil {
		return fmt.Errorf("microvm: qmp greeting: %w", err)
	}
	var g struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if json.Unmarshal(line, &g) != nil || g.QMP == nil {
		return fmt.Errorf("microvm: qmp greeting: unexpected %.100q", line)
	}
	_, err = q.runLocked("qmp_capabilities", nil, nil)
	return err
}

// readLine reads one reply line, at most qmpLineMax bytes.
func (q *qmpConn) readLine() ([]byte, error) {
	var buf []byte
	for {
		frag, err := q.r.ReadSlice('\n')
		buf = append(buf, frag...)
		if len(buf) > qmpLineMax {
			return nil, errors.New("reply line too long")
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return buf, err
	}
}

// run executes cmd with args (nil for none), passing file's descriptor
// along (SCM_RIGHTS) if file is not nil, and returns its "return" value.
func (q *qmpConn) run(cmd string, args any, file *os.File) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.c.SetDeadline(time.Now().Add(qmpTimeout))
	defer q.c.SetDeadline(time.Time{})
	return q.runLocked(cmd, args, file)
}

func (q *qmpConn) runLocked(cmd string, args any, file *os.File) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var oob []byte
	if file != nil {
		oob = unix.UnixRights(int(file.Fd()))
	}
	if _, _, err := q.c.WriteMsgUnix(append(b, '\n'), oob, nil); err != nil {
		return nil, fmt.Errorf("microvm: qmp %s: %w", cmd, err)
	}
	for {
		line, err := q.readLine()
		if err != nil {
			return nil, fmt.Errorf("microvm: qmp %s: %w", cmd, err)
		}
		var rep struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(bytes.TrimSpace(line), &rep); err != nil {
			return nil, fmt.Errorf("microvm: qmp %s: unreadable reply: %w", cmd, err)
		}
		switch {
		case rep.Event != "":
			continue // asynchronous events are not replies
		case rep.Error != nil:
			return nil, fmt.Errorf("microvm: qmp %s: %s: %.200s", cmd, rep.Error.Class, rep.Error.Desc)
		case rep.Return != nil:
			return rep.Return, nil
		default:
			return nil, fmt.Errorf("microvm: qmp %s: unexpected reply %.100q", cmd, line)
		}
	}
}

// status is the VM's run state ("running", "paused", "inmigrate",
// "postmigrate"...).
func (q *qmpConn) status() (string, error) {
	r, err := q.run("query-status", nil, nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(r, &st); err != nil {
		return "", fmt.Errorf("microvm: qmp query-status: %w", err)
	}
	return st.Status, nil
}

// migrateTo writes the stopped VM's whole state (devices and memory) to
// f, through QEMU's migration to a file descriptor, and waits up to wait
// for it to complete.
func (q *qmpConn) migrateTo(f *os.File, wait time.Duration) error {
	// QEMU's default bandwidth cap (for live migration over a network)
	// would make saving a few hundred MiB to a file take seconds.
	if _, err := q.run("migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
		return err
	}
	if _, err := q.run("getfd", map[string]string{"fdname": "airlock-migration"}, f); err != nil {
		return err
	}
	if _, err := q.run("migrate", map[string]string{"uri": "fd:airlock-migration"}, nil); err != nil {
		return err
	}
	deadline := time.Now().Add(wait)
	for {
		r, err := q.run("query-migrate", nil, nil)
		if err != nil {
			return err
		}
		var st struct {
			Status string `json:"status"`
			Error  string `json:"error-desc"`
		}
		if err := json.Unmarshal(r, &st); err != nil {
			return fmt.Errorf("microvm: qmp query-migrate: %w", err)
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("microvm: migration to a file %s: %.200s", st.Status, st.Error)
		}
		if time.Now().After(deadline) {
			q.run("migrate_cancel", nil, nil)
			return fmt.Errorf("microvm: migration to a file not done after %s (status %q)", wait, st.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// close ends the monitor connection.
func (q *qmpConn) close() { q.c.Close() }

// waitConnected waits, up to wait, until QEMU has accepted a connection
// on each of the socket chardevs ids (its query-chardev filename no longer
// starts with "disconnected:").
func (q *qmpConn) waitConnected(wait time.Duration, ids []string) error {
	deadline := time.Now().Add(wait)
	for {
		r, err := q.run("query-chardev", nil, nil)
		if err != nil {
			return err
		}
		var devs []struct {
			Label    string `json:"label"`
			Filename string `json:"filename"`
		}
		if err := json.Unmarshal(r, &devs); err != nil {
			return fmt.Errorf("microvm: qmp query-chardev: %w", err)
		}
		pending := ""
		for _, id := range ids {
			found := false
			for _, d := range devs {
				if d.Label == id {
					found = true
					if strings.HasPrefix(d.Filename, "disconnected:") {
						pending = id
					}
				}
			}
			if !found {
				return fmt.Errorf("microvm: qemu has no chardev %q", id)
			}
		}
		if pending == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("microvm: qemu did not accept the connection to its %s port in %s", pending, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
