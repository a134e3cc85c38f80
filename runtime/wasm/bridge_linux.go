package wasm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// BridgeModule is the import module name of the host functions a Bridge
// serves (see scripts/quickjs/host.c).
const BridgeModule = "airlock"

// maxRequest bounds one request (a cell's code and its environment) and the
// kernel source.
const maxRequest = 64 << 20

// A Bridge connects a module to a code kernel's pipes (package interp's
// protocol: requests on fd 3, messages on fd 4, sync markers on fds 5 and
// 6), which WASI preview 1 cannot hand a module as file descriptors. The
// module reaches them through the host functions of the "airlock" import
// module, which every Engine provides; they answer only in a run whose
// context carries a Bridge (WithBridge), and fail in any other run.
//
// Requests are read from the kernel's request pipe by a goroutine: first
// the kernel source ("<length>\n<source>"), then JSON lines. A line
// {"interrupt":n} also sets the cell number the module's interrupt handler
// sees (interrupted), so that synchronous code can be stopped.
type Bridge struct {
	out map[int32]io.Writer

	items chan []byte // requests, in order; closed at end of input
	next  []byte      // a request poll reported and take has not copied
	eof   bool

	interrupted atomic.Int32
	readErr     atomic.Pointer[error]
}

// Err is why reading requests stopped early (nil at a clean end of input).
func (b *Bridge) Err() error {
	if e := b.readErr.Load(); e != nil {
		return *e
	}
	return nil
}

func (b *Bridge) fail(err error) { b.readErr.Store(&err) }

// NewBridge reads requests from req and writes the module's fd 1, 2, 4, 5
// and 6 to the given writers (nil ones refuse writes).
func NewBridge(req io.Reader, out map[int]io.Writer) *Bridge {
	b := &Bridge{out: map[int32]io.Writer{}, items: make(chan []byte, 16)}
	for fd, w := range out {
		if w != nil {
			b.out[int32(fd)] = w
		}
	}
	go b.read(req)
	return b
}

func (b *Bridge) read(r io.Reader) {
	defer close(b.items)
	br := bufio.NewReaderSize(r, 64<<10)
	head, err := br.ReadString('\n')
	if err != nil {
		b.fail(fmt.Errorf("kernel source: %w", err))
		return
	}
	n, err := strconv.Atoi(head[:len(head)-1])
	if err != nil || n < 0 || n > maxRequest {
		b.fail(fmt.Errorf("kernel source: bad length %q", head))
		return
	}
	src := make([]byte, n)
	if _, err := io.ReadFull(br, src); err != nil {
		b.fail(fmt.Errorf("kernel source: %w", err))
		return
	}
	b.items <- src
	for {
		line, err := readLine(br)
		if len(line) > 0 {
			if n, ok := interruptOf(line); ok {
				b.interrupted.Store(n)
			}
			b.items <- line
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				b.fail(err)
			}
			return
		}
	}
}

// readLine reads one line (without its newline), refusing one over
// maxRequest.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxRequest {
			return nil, fmt.Errorf("a request is over %d bytes", maxRequest)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if n := len(line); n > 0 && line[n-1] == '\n' {
			line = line[:n-1]
		}
		return line, err
	}
}

// interruptOf recognises {"interrupt":N}, the one request the host reads.
func interruptOf(line []byte) (int32, bool) {
	const pre, post = `{"interrupt":`, `}`
	s := string(line)
	if len(s) < len(pre)+len(post) || s[:len(pre)] != pre || s[len(s)-1:] != post {
		return 0, false
	}
	n, err := strconv.ParseInt(s[len(pre):len(s)-1], 10, 32)
	return int32(n), err == nil
}

// poll waits up to timeout (negative: forever) for the next request and
// returns its length, -1 at end of input, -2 if none came in time.
func (b *Bridge) poll(ctx context.Context, timeoutMS int32) int32 {
	if b.next != nil {
		return int32(len(b.next))
	}
	if b.eof {
		return -1
	}
	var timer <-chan time.Time
	if timeoutMS >= 0 {
		t := time.NewTimer(time.Duration(timeoutMS) * time.Millisecond)
		defer t.Stop()
		timer = t.C
	}
	select {
	case item, ok := <-b.items:
		if !ok {
			b.eof = true
			return -1
		}
		b.next = item
		return int32(len(item))
	case <-timer:
		return -2
	case <-ctx.Done():
		b.eof = true
		return -1
	}
}

type bridgeKey struct{}

// WithBridge returns a context whose runs serve b's host functions.
func WithBridge(ctx context.Context, b *Bridge) context.Context {
	return context.WithValue(ctx, bridgeKey{}, b)
}

func bridgeOf(ctx context.Context) *Bridge {
	b, _ := ctx.Value(bridgeKey{}).(*Bridge)
	return b
}

// instantiateBridge defines the "airlock" host module on rt. Its functions
// return -1 (no request, nothing written) in a run without a Bridge.
func instantiateBridge(ctx context.Context, rt wazero.Runtime) error {
	_, err := rt.NewHostModuleBuilder(BridgeModule).
		NewFunctionBuilder().WithFunc(func(ctx context.Context, timeoutMS int32) int32 {
		b := bridgeOf(ctx)
		if b == nil {
			return -1
		}
		return b.poll(ctx, timeoutMS)
	}).Export("poll").
		NewFunctionBuilder().WithFunc(func(ctx context.Context, m api.Module, ptr uint32) {
		b := bridgeOf(ctx)
		if b == nil || b.next == nil {
			return
		}
		if !m.Memory().Write(ptr, b.next) {
			panic(fmt.Errorf("airlock.take: %d bytes at %#x are out of the module's memory", len(b.next), ptr))
		}
		b.next = nil
	}).Export("take").
		NewFunctionBuilder().WithFunc(func(ctx context.Context, m api.Module, fd int32, ptr, n uint32) int32 {
		b := bridgeOf(ctx)
		if b == nil {
			return -1
		}
		w := b.out[fd]
		buf, ok := m.Memory().Read(ptr, n)
		if w == nil || !ok {
			return -1
		}
		k, err := w.Write(buf)
		if err != nil && k == 0 {
			return -1
		}
		return int32(k)
	}).Export("write").
		NewFunctionBuilder().WithFunc(func(ctx context.Context) int32 {
		if b := bridgeOf(ctx); b != nil {
			return b.interrupted.Load()
		}
		return 0
	}).Export("interrupted").
		Instantiate(ctx)
	if err != nil {
		return fmt.Errorf("wasm: instantiating the %s host module: %w", BridgeModule, err)
	}
	return nil
}
