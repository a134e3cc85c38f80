package client

import "context"

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
