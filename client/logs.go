package client

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/url"
	"strconv"
)

// Logs is a snapshot of a process's output so far.
type Logs struct {
	Pid       int
	Stdout    []byte
	Stderr    []byte
	Truncated bool
	Running   bool
	// ExitCode and Signal are set once it has exited.
	ExitCode int
	Signal   string
}

// Logs reads what a process has written so far without following it
// (Attach follows); maxOutput caps each stream in bytes (0: 1 MiB).
func (c *Client) Logs(ctx context.Context, id string, pid, maxOutput int) (*Logs, error) {
	q := url.Values{}
	if maxOutput > 0 {
		q.Set("max_output", strconv.Itoa(maxOutput))
	}
	var raw struct {
		Pid       int    `json:"pid"`
		Stdout    string `json:"stdout"`
		Stderr    string `json:"stderr"`
		StdoutB64 string `json:"stdout_b64"`
		StderrB64 string `json:"stderr_b64"`
		Truncated bool   `json:"truncated"`
		Running   bool   `json:"running"`
		ExitCode  int    `json:"exit_code"`
		Signal    string `json:"signal"`
	}
	if err := c.call(ctx, "GET", sbPath(id, "/processes/", strconv.Itoa(pid), "/logs"), q, nil, &raw); err != nil {
		return nil, err
	}
	l := &Logs{Pid: raw.Pid, Stdout: []byte(raw.Stdout), Stderr: []byte(raw.Stderr), Truncated: raw.Truncated,
		Running: raw.Running, ExitCode: raw.ExitCode, Signal: raw.Signal}
	for _, s := range []struct {
		b64 string
		dst *[]byte
	}{{raw.StdoutB64, &l.Stdout}, {raw.StderrB64, &l.Stderr}} {
		if s.b64 == "" {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(s.b64)
		if err != nil {
			return nil, fmt.Errorf("airlock: process %d logs: bad base64: %w", pid, err)
		}
		*s.dst = b
	}
	return l, nil
}

// OpenFile streams a file of the sandbox; the caller closes it. Unlike
// ReadFile it holds no more than a buffer in memory.
func (c *Client) OpenFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	req, err := c.newRequest(ctx, "GET", sbPath(id, "/files"), url.Values{"path": {path}}, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}
