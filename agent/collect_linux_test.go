package agent_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/agent"
)

// TestCollectReadsDirect: Wait and Collect called before Events read the
// stream in the caller's goroutine. An early deadline leaves the process
// followed (a later Collect gets everything), output beyond the stream's
// credit still flows (credit is granted back as it is read), Events after
// the end is a closed channel, and Close ends a blocked Wait.
func TestCollectReadsDirect(t *testing.T) {
	ta := startAgent(t)
	ctx := ctxT(t)

	p, err := ta.c.Exec(ctx, agent.ExecRequest{Shell: "sleep 0.5; echo out; echo err >&2; exit 4"})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, _, _, _, err = p.Collect(short, 100)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("collect with an early deadline: %v", err)
	}
	out, errb, trunc, st, err := p.Collect(ctx, 100)
	if err != nil || trunc || string(out) != "out\n" || string(errb) != "err\n" || st.Code != 4 {
		t.Fatalf("collect again: %q %q %v %+v %v", out, errb, trunc, st, err)
	}
	if st, err := p.Wait(ctx); err != nil || st.Code != 4 {
		t.Fatalf("wait after collect: %+v %v", st, err)
	}
	select {
	case ev, ok := <-p.Events():
		if ok {
			t.Fatalf("events after the end: %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("events after the end: not closed")
	}
	p.Close()

	// 4 MiB: many times the stream's initial credit.
	const n = 4 << 20
	p, err = ta.c.Exec(ctx, agent.ExecRequest{Shell: "head -c 4194304 /dev/zero"})
	if err != nil {
		t.Fatal(err)
	}
	out, _, trunc, st, err = p.Collect(ctx, n)
	p.Close()
	if err != nil || trunc || len(out) != n || st.Code != 0 {
		t.Fatalf("collect 4 MiB: %d bytes, truncated %v, %+v %v", len(out), trunc, st, err)
	}

	p, err = ta.c.Exec(ctx, agent.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := p.Wait(context.Background())
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // let Wait block (it must end either way)
	p.Close()
	select {
	case err := <-done:
		if !errors.Is(err, agent.ErrDetached) {
			t.Fatalf("wait when closed: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("wait did not end when the process was closed")
	}
	waitGone(t, p.Pid)
}
