package server

import "net/http"

// actionKillProcesses is the audit action of POST .../kill-processes.
const actionKillProcesses = "processes.kill"

// KillProcessesResult is the body of POST .../kill-processes.
type KillProcessesResult struct {
	// Killed is how many processes were killed.
	Killed int `json:"killed"`
}

// killProcesses kills every workload process of a sandbox (foreground and
// background processes, their descendants, code-context interpreters)
// without ending the sandbox: its files stay, and the next exec runs.
func (s *Server) killProcesses(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	k := caller(r)
	// Fail closed like exec: no kill without its audit record.
	if err := s.m.AuditFirst(r.Context(), k.id, sb.ID, actionKillProcesses, nil); err != nil {
		return err
	}
	n, err := sb.Agent().KillProcesses(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, 200, KillProcessesResult{Killed: n})
	return nil
}
