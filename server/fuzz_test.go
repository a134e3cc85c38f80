package server_test

import (
	"encoding/json"
	"path"
	"reflect"
	"strings"
	"testing"

	"github.com/airlock-dev/airlock/server"
)

// FuzzDecodeCreate checks that strict decoding of request bodies never
// panics and only accepts a single JSON object of known fields.
func FuzzDecodeCreate(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"profile":"strict","timeout":60,"metadata":{"a":"b"}}`, `{"limits":{"memory_bytes":1}}`,
		`{"unknown":1}`, `{"profile":1}`, `[]`, `{} {}`, `{"env":{"A":"B"}}`, ``, `nul`, `{"timeout":1e400}`, `null`, `{"timeout":null}`, ` `,
	} {
		f.Add(s)
	}
	// The fields of CreateRequest, by JSON name (Go matches keys without
	// regard to case).
	known := map[string]bool{}
	ct := reflect.TypeOf(server.CreateRequest{})
	for i := range ct.NumField() {
		name, _, _ := strings.Cut(ct.Field(i).Tag.Get("json"), ",")
		known[strings.ToLower(name)] = true
	}
	f.Fuzz(func(t *testing.T, body string) {
		var req server.CreateRequest
		if err := server.DecodeJSON(strings.NewReader(body), &req); err == nil {
			// Accepted: an empty body (meaning {}), or exactly one JSON
			// object without nulls, and every key of it is known.
			if strings.TrimSpace(body) == "" {
				return
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal([]byte(body), &m); err != nil || m == nil {
				t.Fatalf("accepted %q, which is not one JSON object: %v", body, err)
			}
			for k, v := range m {
				if string(v) == "null" {
					t.Fatalf("accepted null field %q in %q", k, body)
				}
				if !known[strings.ToLower(k)] {
					t.Fatalf("accepted unknown field %q in %q", k, body)
				}
			}
		}
		var ex server.ExecRequest
		_ = server.DecodeJSON(strings.NewReader(body), &ex)
	})
}

// FuzzCleanPath checks that an accepted file path is clean, absolute and
// inside /workspace or /tmp, whatever the input.
func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"a", "../x", "/etc/passwd", "/workspace/../etc", "/tmp/x", "a/./b//c", "/proc/self",
		"\x00", "/workspace", "//workspace/x", "/workspacex", "..", "a/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := server.CleanPath(p)
		if err != nil {
			return
		}
		if got != path.Clean(got) || !path.IsAbs(got) || strings.Contains(got, "\x00") {
			t.Fatalf("CleanPath(%q) = %q: not clean and absolute", p, got)
		}
		if !(got == "/workspace" || got == "/tmp" || strings.HasPrefix(got, "/workspace/") || strings.HasPrefix(got, "/tmp/")) {
			t.Fatalf("CleanPath(%q) = %q: outside the roots", p, got)
		}
		for _, el := range strings.Split(p, "/") {
			if el == ".." {
				t.Fatalf("CleanPath(%q) accepted '..'", p)
			}
		}
	})
}
