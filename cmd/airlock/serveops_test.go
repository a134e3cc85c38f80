package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeConfigDefaultPath: without --config the default file is read
// if it exists and skipped if not; --config names another file; --config
// "" reads none even when the default exists; an unreadable default is
// an error, not a silent skip.
func TestServeConfigDefaultPath(t *testing.T) {
	dir := t.TempDir()
	def := filepath.Join(dir, "config.toml")
	other := filepath.Join(dir, "other.toml")
	os.WriteFile(other, []byte("max-sandboxes = 7\n"), 0o600)
	run := func(args ...string) (int, string, error) {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		maxSB := fs.Int("max-sandboxes", 100, "")
		var of opsFlags
		of.register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		file, err := of.applyConfig(fs, def)
		return *maxSB, file, err
	}
	if n, file, err := run(); err != nil || file != "" || n != 100 {
		t.Fatalf("no default file: %d %q %v", n, file, err)
	}
	os.WriteFile(def, []byte("max-sandboxes = 5\n"), 0o600)
	if n, file, err := run(); err != nil || file != def || n != 5 {
		t.Fatalf("default file: %d %q %v", n, file, err)
	}
	if n, file, err := run("--config", other); err != nil || file != other || n != 7 {
		t.Fatalf("--config: %d %q %v", n, file, err)
	}
	if n, file, err := run("--config", ""); err != nil || file != "" || n != 100 {
		t.Fatalf("--config '': %d %q %v", n, file, err)
	}
	if n, _, err := run("--max-sandboxes", "9"); err != nil || n != 9 {
		t.Fatalf("flag over default file: %d %v", n, err)
	}
	os.WriteFile(def, []byte("max-sandboxes = 5\nmax-sandboxs = 6\n"), 0o600)
	if _, _, err := run(); err == nil || !strings.Contains(err.Error(), `"max-sandboxs"`) {
		t.Fatalf("typo in the default file: %v", err)
	}
	// A default that cannot be read (here a directory) stops serve.
	os.Remove(def)
	os.Mkdir(def, 0o700)
	if _, _, err := run(); err == nil {
		t.Fatal("an unreadable default file was skipped")
	}
}
