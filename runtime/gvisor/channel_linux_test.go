package gvisor

import (
	"os"
	"testing"
)

// BenchmarkLiveNetns measures what every live gVisor sandbox now pays for
// a network namespace of its own (made, loopback up, pinned, unpinned and
// released), whatever its network mode.
func BenchmarkLiveNetns(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	for i := 0; i < b.N; i++ {
		ns, _, err := egressNetns(nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pinNetns("bench-netns", ns); err != nil {
			b.Fatal(err)
		}
		ns.Close()
		unpinNetns("bench-netns")
	}
}

// TestPinNetns: a pinned namespace is found by path (isNetns) and one can
// listen in it; unpinned, nothing is left at the path.
func TestPinNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	ns, _, err := egressNetns(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	p, err := pinNetns("test-pin-netns", ns)
	if err != nil {
		t.Fatal(err)
	}
	if !isNetns(p) {
		unpinNetns("test-pin-netns")
		t.Fatalf("%s is not a network namespace once pinned", p)
	}
	ls, err := listenInNetns(p, []string{"127.0.0.1:3128"})
	if err != nil {
		unpinNetns("test-pin-netns")
		t.Fatal(err)
	}
	ls[0].Close()
	unpinNetns("test-pin-netns")
	if _, err := os.Lstat(p); !os.IsNotExist(err) {
		t.Fatalf("after unpin: %v", err)
	}
	if isNetns(p) {
		t.Fatal("still a namespace after unpin")
	}
}
