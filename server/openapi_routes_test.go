package server_test

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestOpenAPIHasEveryRoute: every route the server registers (authed(...)
// and open(...) in this package) is an operation of api/openapi.yaml.
func TestOpenAPIHasEveryRoute(t *testing.T) {
	ops, err := loadOpenAPI()
	if err != nil {
		t.Fatal(err)
	}
	param := regexp.MustCompile(`\{[^}]*\}`)
	documented := map[string]bool{}
	for op := range ops {
		documented[param.ReplaceAllString(op, "{}")] = true
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	route := regexp.MustCompile(`\b(?:authed|open)\("([A-Z]+ /[^"]*)"`)
	n := 0
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range route.FindAllSubmatch(src, -1) {
			n++
			if op := param.ReplaceAllString(string(m[1]), "{}"); !documented[op] {
				t.Errorf("%s registers %s, which api/openapi.yaml does not describe", f, m[1])
			}
		}
	}
	if n < 30 {
		t.Fatalf("found only %d routes in the server's sources", n)
	}
}
