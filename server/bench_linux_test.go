package server_test

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// benchSandbox starts a server and one sandbox.
func benchSandbox(b *testing.B) (*client.Client, string) {
	needRoot(b)
	state := stateDir(b)
	s := startServer(b, state, "--no-auth")
	c := client.New(s.URL, "")
	sb, err := c.Create(context.Background(), client.CreateRequest{})
	if err != nil {
		b.Fatal(err)
	}
	// Warm up the connection and the agent.
	for range 5 {
		if _, err := c.Exec(context.Background(), sb.ID, client.ExecRequest{Argv: []string{"/bin/true"}}); err != nil {
			b.Fatal(err)
		}
	}
	return c, sb.ID
}

// BenchmarkExecTrue measures one exec of /bin/true in a live sandbox
// through the HTTP API; it reports the median latency too.
func BenchmarkExecTrue(b *testing.B) {
	c, id := benchSandbox(b)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"/bin/true"}})
		lat = append(lat, time.Since(t0))
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("%+v %v", res, err)
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "median-ms")
}

// BenchmarkExecParallel8 runs /bin/true from 8 concurrent clients in one
// sandbox and reports execs per second.
func BenchmarkExecParallel8(b *testing.B) {
	c, id := benchSandbox(b)
	ctx := context.Background()
	var wg sync.WaitGroup
	work := make(chan struct{}, b.N)
	for range b.N {
		work <- struct{}{}
	}
	close(work)
	errs := make(chan error, 8)
	b.ResetTimer()
	t0 := time.Now()
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				if _, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"/bin/true"}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(t0)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "execs/s")
}
