package server

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/airlock-dev/airlock/agent"
)

// procErr maps "no such process" from the agent to 404 process_not_found
// (the agent's generic not_found would read as a missing file).
func procErr(pid int, err error) error {
	var ae *agent.Error
	if errors.As(err, &ae) && ae.Code == agent.CodeNotFound {
		return errf(404, "process_not_found", "no process %d in this sandbox (it never existed, or it exited and was forgotten)", pid)
	}
	return err
}

// ProcessView is a process as listed by GET .../processes: the agent's
// description, but exit_code only once it has exited (a running process
// has none, rather than 0).
type ProcessView struct {
	agent.ProcessInfo
	ExitCode *int `json:"exit_code,omitempty"`
}

func processViews(ps []agent.ProcessInfo) []ProcessView {
	out := make([]ProcessView, 0, len(ps))
	for _, p := range ps {
		v := ProcessView{ProcessInfo: p}
		if !p.Running {
			code := p.ExitCode
			v.ExitCode = &code
		}
		out = append(out, v)
	}
	return out
}

// LogsResult is the body of GET .../processes/{pid}/logs: the output the
// agent retains for the process (its most recent output when it wrote
// more than the agent keeps), then its state.
type LogsResult struct {
	Pid int `json:"pid"`
	// Stdout and Stderr are the output as text; StdoutB64/StderrB64
	// replace them when the output is not valid UTF-8.
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	StdoutB64 string `json:"stdout_b64,omitempty"`
	StderrB64 string `json:"stderr_b64,omitempty"`
	// Truncated: more than max_output bytes of a stream; the start is kept.
	Truncated bool   `json:"truncated"`
	Running   bool   `json:"running"`
	ExitCode  *int   `json:"exit_code,omitempty"`
	Signal    string `json:"signal,omitempty"`
}

func (s *Server) logs(w http.ResponseWriter, r *http.Request) error {
	pid, err := pidParam(r)
	if err != nil {
		return err
	}
	if err := onlyParams(r, "max_output"); err != nil {
		return err
	}
	maxOut := DefaultMaxOutput
	if v := r.URL.Query().Get("max_output"); v != "" {
		if maxOut, err = strconv.Atoi(v); err != nil || maxOut < 1 || maxOut > MaxMaxOutput {
			return errf(400, "bad_request", "max_output must be an integer from 1 to %d", MaxMaxOutput)
		}
	}
	sb, err := s.sandbox(r)
	if err != nil {
		return err
	}
	p, err := sb.Agent().Snapshot(r.Context(), pid)
	if err != nil {
		return procErr(pid, err)
	}
	defer p.Close()
	res := LogsResult{Pid: pid}
	var out [2][]byte
	for ev := range p.Events() {
		switch ev.Type {
		case agent.EventStdout, agent.EventStderr:
			i := 0
			if ev.Type == agent.EventStderr {
				i = 1
			}
			room := maxOut - len(out[i])
			if len(ev.Data) > room {
				ev.Data, res.Truncated = ev.Data[:max(room, 0)], true
			}
			out[i] = append(out[i], ev.Data...)
		case agent.EventExit:
			res.Running = ev.Running
			if !ev.Running {
				code := ev.ExitCode
				res.ExitCode, res.Signal = &code, ev.Signal
			}
			o, e := outputEvent(out[0]), outputEvent(out[1])
			res.Stdout, res.StdoutB64, res.Stderr, res.StderrB64 = o.Data, o.DataB64, e.Data, e.DataB64
			writeJSON(w, 200, res)
			return nil
		}
	}
	if _, err := p.Wait(r.Context()); err != nil {
		return procErr(pid, err)
	}
	return errf(502, "internal", "the agent ended the snapshot of process %d without its state", pid)
}
