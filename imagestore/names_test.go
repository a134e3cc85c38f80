package imagestore

import "testing"

// TestHasRegistry: a reference names its registry as Docker reads it.
func TestHasRegistry(t *testing.T) {
	for ref, want := range map[string]bool{
		"127.0.0.1:5000/py:3.12": true, "localhost/x": true, "ghcr.io/a/b:1": true, "index.docker.io/library/alpine": true,
		"registry:5000/x": true, "mistyped": false, "python:3.12": false, "library/alpine": false, "me/app:1": false,
		"sha256:0123456789ab": false, "": false,
	} {
		if got := HasRegistry(ref); got != want {
			t.Errorf("HasRegistry(%q) = %v, want %v", ref, got, want)
		}
	}
}
