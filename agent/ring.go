package agent

import "encoding/binary"

// ringHeader is the size of an output record header: kind byte + uint32 length.
const ringHeader = 5

// Output record kinds.
const (
	kindStdout byte = 1
	kindStderr byte = 2
)

// outRing keeps the most recent output of a process as records
// [kind][len uint32][data], addressed by absolute offsets that only grow.
// Its buffer starts empty and doubles as needed up to max (a power of two),
// so a quiet process costs nothing. It is not safe for concurrent use.
type outRing struct {
	buf        []byte
	head, tail int64 // absolute offsets of the oldest record and of the end
	max        int
}

func (r *outRing) used() int64 { return r.tail - r.head }

// grow makes room for n more bytes, never beyond max. The caller must have
// evicted enough so that used+n <= max.
func (r *outRing) grow(n int) {
	want := int(r.used()) + n
	if want <= len(r.buf) {
		return
	}
	c := len(r.buf)
	if c == 0 {
		c = 4096
	}
	for c < want {
		c *= 2
	}
	if c > r.max {
		c = r.max
	}
	nb := make([]byte, c)
	for off := r.head; off < r.tail; {
		i := int(off % int64(len(r.buf)))
		end := len(r.buf)
		if rem := int(r.tail - off); end-i > rem {
			end = i + rem
		}
		r.copyIn(nb, off, r.buf[i:end])
		off += int64(end - i)
	}
	r.buf = nb
}

// copyIn writes p into buffer b at absolute offset off, wrapping.
func (r *outRing) copyIn(b []byte, off int64, p []byte) {
	for len(p) > 0 {
		i := int(off % int64(len(b)))
		n := copy(b[i:], p)
		p = p[n:]
		off += int64(n)
	}
}

// copyOut reads len(p) bytes at absolute offset off.
func (r *outRing) copyOut(off int64, p []byte) {
	for len(p) > 0 {
		i := int(off % int64(len(r.buf)))
		n := copy(p, r.buf[i:])
		p = p[n:]
		off += int64(n)
	}
}

// record returns the kind and data length of the record at off.
func (r *outRing) record(off int64) (byte, int) {
	var h [ringHeader]byte
	r.copyOut(off, h[:])
	return h[0], int(binary.BigEndian.Uint32(h[1:]))
}

// evictFor drops the oldest records until a record of n data bytes fits.
func (r *outRing) evictFor(n int) {
	need := int64(ringHeader + n)
	for r.used()+need > int64(r.max) && r.head < r.tail {
		_, l := r.record(r.head)
		r.head += int64(ringHeader + l)
	}
}

// append adds a record; the caller has called evictFor.
func (r *outRing) append(kind byte, data []byte) {
	r.grow(ringHeader + len(data))
	var h [ringHeader]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], uint32(len(data)))
	r.copyIn(r.buf, r.tail, h[:])
	r.copyIn(r.buf, r.tail+ringHeader, data)
	r.tail += int64(ringHeader + len(data))
}
