package imagestore

import (
	"errors"
	"io"
	"sync"
)

// errReadAheadClosed is what the reading goroutine of a closed aheadReader
// stops with.
var errReadAheadClosed = errors.New("read-ahead closed")

// aheadReader reads r on a goroutine of its own, up to a few chunks ahead
// of the consumer, so that a layer's decompression and hashing run on one
// CPU while its entries are written to disk on another. It delivers
// exactly r's bytes, then r's error (io.EOF at the end).
type aheadReader struct {
	ch   chan []byte // filled chunks, closed after err is set
	free chan []byte // empty chunks
	done chan struct{}
	err  error
	cur  []byte // unread part of the chunk being consumed
	buf  []byte // that chunk, to return to free
	once sync.Once
}

// readAhead starts reading r in chunks of size, at most chunks ahead.
func readAhead(r io.Reader, chunks, size int) *aheadReader {
	a := &aheadReader{ch: make(chan []byte, chunks), free: make(chan []byte, chunks+1), done: make(chan struct{})}
	for i := 0; i < chunks+1; i++ {
		a.free <- make([]byte, size)
	}
	go a.fill(r)
	return a
}

func (a *aheadReader) fill(r io.Reader) {
	defer close(a.ch)
	for {
		var b []byte
		select {
		case b = <-a.free:
		case <-a.done:
			a.err = errReadAheadClosed
			return
		}
		n, err := fillChunk(r, b)
		if n > 0 {
			select {
			case a.ch <- b[:n]:
			case <-a.done:
				a.err = errReadAheadClosed
				return
			}
		}
		if err != nil {
			a.err = err // io.EOF at the end, else r's own error unchanged
			return
		}
	}
}

// fillChunk reads from r until b is full or r returns an error, which it
// returns as is.
func fillChunk(r io.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := r.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Read returns the next bytes of r, or r's error once they are all read.
func (a *aheadReader) Read(p []byte) (int, error) {
	for len(a.cur) == 0 {
		if a.buf != nil {
			a.free <- a.buf[:cap(a.buf)]
			a.buf = nil
		}
		b, ok := <-a.ch
		if !ok {
			return 0, a.err
		}
		a.buf, a.cur = b, b
	}
	n := copy(p, a.cur)
	a.cur = a.cur[n:]
	return n, nil
}

// Close stops the reading goroutine and waits until it no longer touches
// r; it may be called more than once.
func (a *aheadReader) Close() error {
	a.once.Do(func() {
		close(a.done)
		for range a.ch {
		}
	})
	return nil
}
