package server

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestLoggableID: only sandbox ids reach the log; whatever else a client
// puts where an id goes (a key pasted by mistake, a path, a forged log
// line) becomes "invalid".
func TestLoggableID(t *testing.T) {
	for in, want := range map[string]string{
		"":                    "",
		"sb-12d520bea8e19f51": "sb-12d520bea8e19f51",
		"al_QUERYtokenQUERYtokenQUERYtokenQUERYtoken01": "invalid",
		"sb-":                            "invalid",
		"sb-XYZ":                         "invalid",
		"sb-12\nlevel=ERROR msg=x":       "invalid",
		"sb-" + string(make([]byte, 70)): "invalid",
		"../../etc/passwd":               "invalid",
	} {
		if got := loggableID(in); got != want {
			t.Errorf("loggableID(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestStatusWriter: the writer records the status and size, and keeps
// what streaming handlers need: Flush through http.ResponseController and
// the status of a handler that only flushes.
func TestStatusWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	w := &statusWriter{ResponseWriter: rec}
	w.WriteHeader(http.StatusCreated)
	w.Write([]byte("hello"))
	if err := http.NewResponseController(w).Flush(); err != nil {
		t.Fatalf("flush through the wrapper: %v", err)
	}
	if w.status != http.StatusCreated || w.bytes != 5 || !rec.Flushed || rec.Code != http.StatusCreated {
		t.Fatalf("status %d bytes %d flushed %v code %d", w.status, w.bytes, rec.Flushed, rec.Code)
	}
	w2 := &statusWriter{ResponseWriter: httptest.NewRecorder()}
	w2.Flush()
	if w2.status != http.StatusOK {
		t.Fatalf("flush-only handler: status %d, want 200", w2.status)
	}
	// A recorder cannot be hijacked: the error passes through, and the
	// request is not counted as switched.
	if _, _, err := w2.Hijack(); err == nil || w2.hijacked {
		t.Fatalf("hijack of a recorder: %v, hijacked %v", err, w2.hijacked)
	}
}
