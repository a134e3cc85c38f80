package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/airlock-dev/airlock/internal/connlimit"
)

// connFlags are serve's limits on client connections (package connlimit,
// docs/api.md, Server operations).
type connFlags struct {
	max, perAddr           int
	header, idle, bodyIdle time.Duration
}

func (c *connFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&c.max, "max-conns", 4096, "client connections open at once, at most half the descriptor limit (ulimit -n); more wait until one closes")
	fs.IntVar(&c.perAddr, "max-conns-per-ip", 1024, "client connections one address (IPv6: one /64) may hold open; more are closed at once (0: no cap)")
	fs.DurationVar(&c.header, "header-timeout", 10*time.Second, "time a client has to send a request's headers")
	fs.DurationVar(&c.idle, "idle-timeout", 2*time.Minute, "how long a kept-alive connection may wait for its next request")
	fs.DurationVar(&c.bodyIdle, "body-idle-timeout", time.Minute, "how long a request body may send nothing before the request fails (an upload may take any time while data flows)")
}

// check validates the flags and returns the connection cap the descriptor
// limit allows, and that limit.
func (c *connFlags) check() (maxConns int, nofile uint64, err error) {
	switch {
	case c.max < connlimit.MinConns:
		return 0, 0, fmt.Errorf("--max-conns %d: at least %d", c.max, connlimit.MinConns)
	case c.perAddr < 0:
		return 0, 0, fmt.Errorf("--max-conns-per-ip %d: not negative", c.perAddr)
	case c.header <= 0 || c.idle <= 0 || c.bodyIdle <= 0:
		return 0, 0, fmt.Errorf("--header-timeout, --idle-timeout and --body-idle-timeout must be positive")
	}
	return connlimit.Cap(c.max)
}
