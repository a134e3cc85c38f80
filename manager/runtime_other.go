//go:build !linux

package manager

import (
	"context"
	"errors"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/policy"
)

var errNotLinux = errors.New("manager: sandboxes need Linux")

func (m *Manager) start(ctx context.Context, req *CreateRequest, p policy.Policy, ttl time.Duration) (*Sandbox, error) {
	return nil, errNotLinux
}

func (m *Manager) recover(ctx context.Context) error { return nil }

func diskUsage(ctx context.Context, c *agent.Client) (used, total int64, err error) {
	return 0, 0, errNotLinux
}
