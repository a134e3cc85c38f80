package bench

import (
	"fmt"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// The code interpreter's figures: only airlock has a warm pool and code
// cells behind an API, so the peers are not measured in them.

// codePeers is the airlock peer for an API figure, with others marked
// missing.
func codePeers(note string, others []Peer, why string) []Peer {
	ps := []Peer{{Name: Reference, Note: note}}
	for _, p := range others {
		if p.Missing == "" {
			p = Peer{Name: p.Name, Missing: why}
		}
		ps = append(ps, p)
	}
	return ps
}

// CodeCellFigure times the round trip of the cell `1 + 1` in a warm Python
// context of a live sandbox: POST /v1/sandboxes/{id}/code through the Go
// client.
func (s *apiServer) CodeCellFigure(others []Peer, runs int) Figure {
	ctx, cancel := s.ctx()
	defer cancel()
	var id string
	sb, err := s.c.Create(ctx, client.CreateRequest{})
	if err == nil {
		id = sb.ID
		defer s.c.Kill(ctx, id)
		_, err = s.c.RunCode(ctx, id, client.CodeRequest{Code: "1 + 1"}) // starts the context
	}
	if err != nil {
		return Unavailable("code cell", "could not prepare a warm Python context: "+err.Error())
	}
	ps := codePeers("POST /v1/sandboxes/{id}/code {code: \"1 + 1\"} in the default Python context, through the Go client",
		others, "has no code interpreter")
	fig := Sample(ps, UnitMS, runs, func(p Peer) (float64, error) {
		ctx, cancel := s.ctx()
		defer cancel()
		start := time.Now()
		res, err := s.c.RunCode(ctx, id, client.CodeRequest{Code: "1 + 1"})
		d := time.Since(start)
		if err == nil && res.Text != "2" {
			err = fmt.Errorf("1 + 1 gave %q (error %v)", res.Text, res.Error)
		}
		return float64(d) / float64(time.Millisecond), err
	})
	fig.Name, fig.Command = "code cell", []string{"1 + 1"}
	fig.Note = "round trip of a Python cell in a warm context of a live sandbox, through the API"
	return fig
}

// PooledStartFigure starts a second `airlock serve` with a warm pool of
// sandboxes with a warm Python context (--pool 2 --pool-python), and times
// creating a sandbox from the pool plus its first cell (`1 + 1`). Before
// each sample it waits, untimed, until the pool is full again.
func PooledStartFigure(exe, scratch string, others []Peer, runs int, timeout time.Duration) Figure {
	srv, err := startServer(exe, scratch, 8, timeout, "--pool", "2", "--pool-python")
	if err != nil {
		return Unavailable("pooled start", "airlock serve --pool did not start: "+err.Error())
	}
	defer srv.stop()
	waitPool := func() error {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			ctx, cancel := srv.ctx()
			info, err := srv.c.Info(ctx)
			cancel()
			if err == nil && info.PoolIdle >= 2 {
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
		return fmt.Errorf("the pool did not refill within a minute: %s", srv.log())
	}
	ps := codePeers("airlock serve --pool 2 --pool-python: POST /v1/sandboxes served from the pool, then POST /v1/sandboxes/{id}/code {code: \"1 + 1\"}",
		others, "has no warm pool")
	fig := Sample(ps, UnitMS, runs, func(p Peer) (float64, error) {
		if err := waitPool(); err != nil {
			return 0, err
		}
		ctx, cancel := srv.ctx()
		defer cancel()
		start := time.Now()
		sb, err := srv.c.Create(ctx, client.CreateRequest{})
		if err != nil {
			return 0, err
		}
		res, err := srv.c.RunCode(ctx, sb.ID, client.CodeRequest{Code: "1 + 1"})
		d := time.Since(start)
		if err == nil && res.Text != "2" {
			err = fmt.Errorf("1 + 1 gave %q (error %v)", res.Text, res.Error)
		}
		if kerr := srv.c.Kill(ctx, sb.ID); err == nil && kerr != nil {
			err = fmt.Errorf("kill: %w", kerr)
		}
		return float64(d) / float64(time.Millisecond), err
	})
	fig.Name, fig.Command = "pooled start", []string{"1 + 1"}
	fig.Note = "create a sandbox from the warm pool and run its first Python cell; waiting for the pool to refill and killing the sandbox are not timed"
	return fig
}
