package volume_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-dev/airlock/volume"
)

// TestOwners: each owner has its own volume names. A volume of the old
// layout (STATE_DIR/volumes/NAME, from before owners) is the operator's:
// a key neither sees, mounts nor deletes it, and the key's volume of the
// same name is another volume, deleted without touching the operator's.
// An owner that is not a key id is refused.
func TestOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mkfs of the volume's disk)")
	}
	dir := filepath.Join(t.TempDir(), "volumes")
	op, err := volume.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Create("data", volume.MinSize); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "volume.json")); err != nil {
		t.Fatalf("the operator's volume is not in the old layout: %v", err)
	}
	a := op.As("key_a")
	if _, err := a.Get("data"); !errors.Is(err, volume.ErrNotFound) {
		t.Errorf("key A gets the operator's volume: %v", err)
	}
	if _, err := a.Delete("data"); !errors.Is(err, volume.ErrNotFound) {
		t.Errorf("key A deletes the operator's volume: %v", err)
	}
	if _, err := a.Use("data", "sb-x", t.TempDir()); !errors.Is(err, volume.ErrNotFound) {
		t.Errorf("key A mounts the operator's volume: %v", err)
	}
	if l, err := a.List(); err != nil || len(l) != 0 {
		t.Errorf("key A's list: %+v %v", l, err)
	}
	if _, err := a.Create("data", volume.MinSize); err != nil {
		t.Fatalf("key A's own volume of the same name: %v", err)
	}
	if l, err := op.List(); err != nil || len(l) != 1 {
		t.Errorf("the operator's list: %+v %v, want its one volume", l, err)
	}
	if _, err := op.As("key_b").Get("data"); !errors.Is(err, volume.ErrNotFound) {
		t.Errorf("key B gets a volume named data: %v", err)
	}
	if _, err := a.Delete("data"); err != nil {
		t.Fatal(err)
	}
	if _, err := op.Get("data"); err != nil {
		t.Errorf("the operator's volume after key A deleted its own: %v", err)
	}
	for _, bad := range []string{"../x", "a/b", ".."} {
		if _, err := op.As(bad).Create("v", volume.MinSize); !errors.Is(err, volume.ErrInvalid) {
			t.Errorf("owner %q: %v, want ErrInvalid", bad, err)
		}
	}
}
