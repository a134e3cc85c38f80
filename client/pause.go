package client

import (
	"context"
	"time"
)

// Pause freezes a sandbox: its processes stop where they stand and its
// memory stays resident; requests that need its agent answer 409 paused
// until Resume. The TTL keeps counting.
func (c *Client) Pause(ctx context.Context, id string) (*Sandbox, error) {
	var out Sandbox
	return &out, c.call(ctx, "POST", sbPath(id, "/pause"), nil, nil, &out)
}

// Resume thaws a paused sandbox.
func (c *Client) Resume(ctx context.Context, id string) (*Sandbox, error) {
	var out Sandbox
	return &out, c.call(ctx, "POST", sbPath(id, "/resume"), nil, nil, &out)
}

// MemorySnapshot is a snapshot of a gvisor sandbox's whole state.
type MemorySnapshot struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandbox_id"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
}

// MemorySnapshot snapshots a running gvisor sandbox without stopping it;
// CreateRequest.Snapshot forks it.
func (c *Client) MemorySnapshot(ctx context.Context, id string) (*MemorySnapshot, error) {
	var out MemorySnapshot
	return &out, c.call(ctx, "POST", sbPath(id, "/snapshots"), nil, nil, &out)
}
