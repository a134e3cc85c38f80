package store

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-dev/airlock/internal/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}

// backend is where a test's shared tables live: SQLite in the state
// directory, or a fresh PostgreSQL database every store the test opens
// through it shares.
type backend struct {
	name string
	url  string // "" for SQLite
}

// open opens a store on dir with the backend's shared tables.
func (b backend) open(dir string) (*Store, error) {
	return OpenOptions(dir, Options{DatabaseURL: b.url})
}

// openTest is the package's openTest on this backend.
func (b backend) openTest(t testing.TB) (*Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	s, err := b.open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, dir
}

// eachBackend runs f on SQLite and on PostgreSQL (a test cluster this
// package starts once; the test fails, never skips, without PostgreSQL).
func eachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	t.Run("sqlite", func(t *testing.T) { f(t, backend{name: "sqlite"}) })
	t.Run("postgres", func(t *testing.T) {
		f(t, backend{name: "postgres", url: pgtest.Shared(t).NewDatabase(t)})
	})
}
