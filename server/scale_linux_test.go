package server_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-dev/airlock/client"
)

// TestConcurrent200 runs 200 sandboxes at once, each running a command
// through the API, and checks from the host that nothing leaks afterwards.
func TestConcurrent200(t *testing.T) {
	needRoot(t)
	if testing.Short() {
		t.Skip("200 sandboxes: skipped in -short")
	}
	const n = 200
	state := stateDir(t)
	key := newKey(t, state, "scale")
	s := startServer(t, state, "--max-sandboxes", "250")
	c := client.New(s.URL, key)
	ctx := ctxT(t)

	ids := make([]string, n)
	pids := make([]int, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16) // creation in flight; all 200 stay alive together
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			sb, err := c.Create(ctx, client.CreateRequest{Limits: &client.Limits{MemoryBytes: 64 << 20}, Metadata: map[string]string{"scale": "1"}})
			<-sem
			if err != nil {
				errs <- fmt.Errorf("create %d: %w", i, err)
				return
			}
			ids[i] = sb.ID
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	list, err := c.List(ctx, map[string]string{"scale": "1"})
	if err != nil || len(list) != n {
		t.Fatalf("%d running sandboxes listed, want %d (%v)", len(list), n, err)
	}
	errs = make(chan error, n)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Exec(ctx, id, client.ExecRequest{Shell: fmt.Sprintf("echo sandbox-%d", i)})
			if err != nil {
				errs <- fmt.Errorf("exec in %s: %w", id, err)
				return
			}
			if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != fmt.Sprintf("sandbox-%d", i) {
				errs <- fmt.Errorf("exec in %s: %+v", id, res)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i, id := range ids {
		pids[i] = initPid(t, state, id)
	}
	errs = make(chan error, n)
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Kill(context.Background(), id); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i, id := range ids {
		assertGone(t, state, id, pids[i])
	}
	if ents, _ := os.ReadDir(state + "/sandboxes"); len(ents) != 0 {
		t.Errorf("%d sandbox state dirs left", len(ents))
	}
}
