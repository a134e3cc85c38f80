package manager

import (
	"errors"
	"os"
	"testing"
)

// TestCheckStaticAgent: a dynamically linked agent is refused for image
// sandboxes (the image has no host loader: the create failed with "command
// not found" before), a static one is accepted.
func TestCheckStaticAgent(t *testing.T) {
	if err := checkStaticAgent("/bin/sh"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("dynamic /bin/sh: %v", err)
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("needs busybox-static")
	}
	if err := checkStaticAgent("/bin/busybox"); err != nil {
		t.Fatalf("static busybox: %v", err)
	}
}
