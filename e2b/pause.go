package e2b

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/airlock-dev/airlock/manager"
)

// dropProcesses ends every process of the caller's sandbox id (commands,
// their descendants, code contexts' kernels), for E2B's filesystem-only
// pause and reboot: its files stay, the processes' memory is freed. The
// agent and the sandbox live on, on any tier.
func (h *Handler) dropProcesses(r *http.Request, id string) error {
	owner := callerOf(r.Context()).id
	sb, err := h.m.Lookup(owner, id)
	if err != nil {
		return notFound(err, id)
	}
	if err := h.m.AuditFirst(r.Context(), owner, id, "e2b.drop_processes", nil); err != nil {
		return err
	}
	if _, err := sb.Agent().KillProcesses(r.Context()); err != nil {
		return fmt.Errorf("ending the sandbox's processes: %w", err)
	}
	return nil
}

// pause serves POST /sandboxes/{id}/pause: the manager's Pause (native:
// cgroup freezer; gvisor: runsc checkpoint). 204; 409 if already paused,
// which the SDKs report as false.
func (h *Handler) pause(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Memory *bool `json:"memory"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	in, err := h.running(r, id)
	if err != nil {
		return err
	}
	if in.Paused {
		return apiErrorf(http.StatusConflict, "sandbox %q is already paused", id)
	}
	if req.Memory != nil && !*req.Memory {
		// Filesystem-only: the processes go first, the files stay.
		if err := h.dropProcesses(r, id); err != nil {
			return err
		}
	}
	if _, err := h.m.Pause(r.Context(), callerOf(r.Context()).id, id); err != nil {
		return notFound(err, id)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// resume serves the deprecated POST /sandboxes/{id}/resume (newer SDKs
// resume through connect): 201 with the sandbox; 409 if it is not paused.
func (h *Handler) resume(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Timeout   *float64 `json:"timeout"`
		AutoPause *bool    `json:"autoPause"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	d, err := timeoutSeconds(req.Timeout, 15)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	in, err := h.running(r, id)
	if err != nil {
		return err
	}
	if !in.Paused {
		return apiErrorf(http.StatusConflict, "sandbox %q is not paused", id)
	}
	return h.resumeFor(w, r, id, d, false)
}

// resumeFor resumes the caller's paused sandbox id, gives it d to live
// from now (a sandbox paused at its timeout had the server's maximum) and
// answers 201 with it, as E2B's resume and connect do. reboot (E2B's
// onResume: 'reboot') ends the processes it was paused with.
func (h *Handler) resumeFor(w http.ResponseWriter, r *http.Request, id string, d time.Duration, reboot bool) error {
	owner := callerOf(r.Context()).id
	in, err := h.m.Resume(r.Context(), owner, id)
	if err != nil {
		return notFound(err, id)
	}
	if reboot {
		if err := h.dropProcesses(r, id); err != nil {
			return err
		}
	}
	if in, err = h.m.SetTimeout(r.Context(), owner, id, d); err != nil {
		return notFound(err, id)
	}
	writeJSON(w, http.StatusCreated, h.created(id, templateOf(&in)))
	return nil
}

// runningUnpaused is running for a call that needs the sandbox's agent
// (doing names it): a paused sandbox is a 409.
func (h *Handler) runningUnpaused(r *http.Request, id, doing string) (manager.Info, error) {
	in, err := h.running(r, id)
	if err == nil && in.Paused {
		err = apiErrorf(http.StatusConflict, "sandbox %q is paused: connect to it before %s it", id, doing)
	}
	return in, err
}

// notFound maps the manager's not-found and not-running errors to E2B's
// 404 and passes other errors (and nil) through.
func notFound(err error, id string) error {
	if errors.Is(err, manager.ErrNotFound) || errors.Is(err, manager.ErrNotRunning) {
		return apiErrorf(http.StatusNotFound, "sandbox %q not found", id)
	}
	return err
}

// autoResumeTimeout is the timeout of a sandbox resumed by traffic: E2B's
// default for connect.
const autoResumeTimeout = 300 * time.Second

// lookupResuming is the manager's Lookup that, for a paused sandbox created
// with autoResume, resumes it first: traffic wakes it, as in E2B.
func (h *Handler) lookupResuming(r *http.Request, owner, id string) (*manager.Sandbox, error) {
	sb, err := h.m.Lookup(owner, id)
	if !errors.Is(err, manager.ErrPaused) {
		return sb, err
	}
	in, gerr := h.m.Get(r.Context(), owner, id)
	if gerr != nil || in.Metadata[autoResumeKey] != "true" {
		return nil, err
	}
	if _, rerr := h.m.Resume(r.Context(), owner, id); rerr != nil {
		h.cfg.Logf("e2b: auto-resume of %s: %v", id, rerr)
		return nil, rerr
	}
	// A sandbox paused at its timeout had the server's maximum to be
	// resumed in; traffic gives it autoResumeTimeout, as a connect would.
	if _, terr := h.m.SetTimeout(r.Context(), owner, id, autoResumeTimeout); terr != nil {
		h.cfg.Logf("e2b: timeout of auto-resumed %s: %v", id, terr)
	}
	return h.m.Lookup(owner, id)
}

// forkResult is one element of the answer to POST /sandboxes/{id}/fork.
type forkResult struct {
	Sandbox *sandboxCreated `json:"sandbox,omitempty"`
	Error   *forkError      `json:"error,omitempty"`
}

// forkError is why one fork failed.
type forkError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// fork serves POST /sandboxes/{id}/fork ({timeout, count}): one memory
// snapshot of the sandbox (gvisor only: a native one is a 400 naming the
// runtime), then count sandboxes created from it, each an independent
// copy with the original's metadata and template. The answer lists each
// fork or its error, as E2B's does.
func (h *Handler) fork(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Timeout *float64 `json:"timeout"`
		Count   *int     `json:"count"`
	}
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > 10 {
		return apiErrorf(http.StatusBadRequest, "count must be between 1 and 10")
	}
	ttl, err := timeoutSeconds(req.Timeout, 300)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	in, err := h.runningUnpaused(r, id, "forking")
	if err != nil {
		return err
	}
	c := callerOf(r.Context())
	snap, err := h.m.MemorySnapshot(r.Context(), c.id, id)
	if err != nil {
		return notFound(err, id)
	}
	out := make([]forkResult, 0, count)
	for i := 0; i < count; i++ {
		info, err := h.m.Create(r.Context(), manager.CreateRequest{Owner: c.id, OwnerLimit: c.maxSandboxes,
			Snapshot: snap.ID, Metadata: in.Metadata, Timeout: ttl})
		var res forkResult
		if err != nil {
			res.Error = &forkError{}
			res.Error.Code, res.Error.Message = controlStatus(err)
		} else {
			sc := h.created(info.ID, templateOf(&in))
			res.Sandbox = &sc
		}
		out = append(out, res)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
