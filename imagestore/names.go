package imagestore

import "strings"

// HasRegistry reports whether ref names its registry, as Docker reads a
// reference: the part before the first "/" is a registry when it has a
// "." or a ":" or is "localhost" ("127.0.0.1:5000/py:3.12", "ghcr.io/x/y").
// A name without one ("python:3.12", "mistyped", "library/alpine") would
// be looked up on Docker Hub.
func HasRegistry(ref string) bool {
	first, _, ok := strings.Cut(ref, "/")
	return ok && (strings.ContainsAny(first, ".:") || first == "localhost")
}
