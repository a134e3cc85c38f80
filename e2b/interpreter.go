package e2b

import (
	"net/http"
)

// serveInterpreter serves the code interpreter's port (49999): POST
// /execute, /contexts and /contexts/{id}/restart. They need stateful
// interpreter kernels inside the sandbox, which airlock does not have yet;
// every endpoint but /health says so rather than pretending.
func (h *Handler) serveInterpreter(w http.ResponseWriter, r *http.Request, b *boxState) {
	if r.URL.Path == "/health" {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`"OK"`))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusNotImplemented)
	w.Write([]byte("the code interpreter (runCode, code contexts) is not available in this airlock server yet: it needs interpreter kernels in the sandbox's agent\n"))
}
