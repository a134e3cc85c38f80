package imagestore

import (
	"bytes"
	"errors"
	"io"
	"math/rand"
	"testing"
	"testing/iotest"
)

// TestReadAhead: the read-ahead delivers exactly its source's bytes, passes
// the source's error through unchanged (a truncated stream must not look
// like a clean end), and Close stops it midway.
func TestReadAhead(t *testing.T) {
	data := make([]byte, 1<<20+12345)
	rand.New(rand.NewSource(1)).Read(data)
	sources := []func() io.Reader{
		func() io.Reader { return bytes.NewReader(data) },
		func() io.Reader { return iotest.OneByteReader(bytes.NewReader(data[:70000])) },
		func() io.Reader { return iotest.HalfReader(bytes.NewReader(data)) },
	}
	for i, src := range sources {
		want, _ := io.ReadAll(src())
		ra := readAhead(src(), 3, 4096)
		if err := iotest.TestReader(ra, want); err != nil {
			t.Fatalf("source %d: %v", i, err)
		}
		ra.Close()
	}
	ra := readAhead(io.MultiReader(bytes.NewReader(data[:10000]), iotest.ErrReader(io.ErrUnexpectedEOF)), 2, 4096)
	got, err := io.ReadAll(ra)
	if !errors.Is(err, io.ErrUnexpectedEOF) || !bytes.Equal(got, data[:10000]) {
		t.Fatalf("truncated source: read %d bytes, error %v; want 10000 bytes and io.ErrUnexpectedEOF", len(got), err)
	}
	ra = readAhead(bytes.NewReader(data), 2, 4096)
	if _, err := io.ReadFull(ra, make([]byte, 5000)); err != nil {
		t.Fatal(err)
	}
	ra.Close()
	ra.Close()
}
