package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAuditRoundTripAndFilter(t *testing.T) { eachBackend(t, testAuditRoundTripAndFilter) }

func testAuditRoundTripAndFilter(t *testing.T, b backend) {
	s, _ := b.openTest(t)
	ctx := context.Background()
	at := time.Date(2026, 2, 3, 4, 5, 6, 7, time.UTC)
	evs := []AuditEvent{
		{Time: at, KeyID: "k1", SandboxID: "a", Action: ActionSandboxCreate, Detail: json.RawMessage(`{"profile":"strict"}`)},
		{KeyID: "k1", SandboxID: "a", Action: ActionExec, Detail: json.RawMessage(`{"argv":["ls"]}`)},
		{KeyID: "k2", SandboxID: "b", Action: ActionExec},
		{KeyID: "k1", SandboxID: "a", Action: ActionFileWrite},
		{KeyID: "k2", SandboxID: "b", Action: ActionSandboxKill},
	}
	before := time.Now()
	for _, e := range evs {
		if err := s.Audit(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	all, err := s.AuditLog(ctx, AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(evs) {
		t.Fatalf("%d events, want %d", len(all), len(evs))
	}
	last := all[len(all)-1] // oldest
	if last.ID <= 0 || !last.Time.Equal(at) || last.KeyID != "k1" || last.SandboxID != "a" ||
		last.Action != ActionSandboxCreate || string(last.Detail) != `{"profile":"strict"}` {
		t.Errorf("oldest event = %+v", last)
	}
	if all[2].Detail != nil {
		t.Errorf("nil detail read back as %q", all[2].Detail)
	}
	if all[0].Time.Before(before) {
		t.Errorf("zero Time not filled in: %v", all[0].Time)
	}

	actions := func(f AuditFilter) string {
		t.Helper()
		l, err := s.AuditLog(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range l {
			out = append(out, e.Action)
		}
		return strings.Join(out, ",")
	}
	for _, tc := range []struct {
		f    AuditFilter
		want string
	}{
		{AuditFilter{SandboxID: "a"}, "file.write,exec,sandbox.create"},
		{AuditFilter{Action: ActionExec}, "exec,exec"},
		{AuditFilter{SandboxID: "b", Action: ActionExec}, "exec"},
		{AuditFilter{KeyID: "k2"}, "sandbox.kill,exec"},
		{AuditFilter{Limit: 2}, "sandbox.kill,file.write"},
		{AuditFilter{Before: all[1].ID, Limit: 2}, "exec,exec"},
		{AuditFilter{SandboxID: "zzz"}, ""},
	} {
		if got := actions(tc.f); got != tc.want {
			t.Errorf("AuditLog(%+v) = %q, want %q", tc.f, got, tc.want)
		}
	}

	if err := s.Audit(ctx, AuditEvent{Action: ""}); err == nil {
		t.Error("empty action accepted")
	}
	if err := s.Audit(ctx, AuditEvent{Action: ActionExec, Detail: json.RawMessage(`{`)}); err == nil {
		t.Error("invalid detail accepted")
	}
}

func TestAuditAppendOnly(t *testing.T) { eachBackend(t, testAuditAppendOnly) }

func testAuditAppendOnly(t *testing.T, b backend) {
	s, _ := b.openTest(t)
	ctx := context.Background()
	if err := s.Audit(ctx, AuditEvent{KeyID: "k", SandboxID: "a", Action: ActionExec}); err != nil {
		t.Fatal(err)
	}
	forge := []string{
		`UPDATE audit SET action = 'nothing'`,
		`UPDATE audit SET detail = '{}' WHERE id = 1`,
		`DELETE FROM audit`,
		`DELETE FROM audit WHERE id = 1`,
	}
	if b.url == "" {
		forge = append(forge,
			`INSERT OR REPLACE INTO audit (id, time, action) VALUES (1, 0, 'forged')`,
			`REPLACE INTO audit (id, time, action) VALUES (1, 0, 'forged')`,
			`INSERT INTO audit (id, time, action) VALUES (1, 0, 'forged') ON CONFLICT(id) DO UPDATE SET action = 'forged'`)
	} else {
		forge = append(forge,
			`TRUNCATE audit`,
			`INSERT INTO audit (id, time, action) OVERRIDING SYSTEM VALUE VALUES (1, 0, 'forged') ON CONFLICT(id) DO UPDATE SET action = 'forged'`)
	}
	for _, q := range forge {
		err := rawExec(t, s.kw, q)
		if err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: err = %v, want append-only violation", q, err)
		}
	}
	if b.url != "" {
		// An id cannot be chosen: GENERATED ALWAYS.
		if err := rawExec(t, s.kw, `INSERT INTO audit (id, time, action) VALUES (2, 0, 'forged')`); err == nil {
			t.Error("insert with a chosen id accepted")
		}
	}
	evs, err := s.AuditLog(ctx, AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Action != ActionExec {
		t.Errorf("audit log changed: %+v", evs)
	}
}

func TestAuditCloseFlushes(t *testing.T) { eachBackend(t, testAuditCloseFlushes) }

func testAuditCloseFlushes(t *testing.T, b backend) {
	// Events queued when Close is called are all written.
	dir := filepath.Join(t.TempDir(), "s")
	s, err := b.open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const n = 2000
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, closed := 0, 0
	for i := range n {
		wg.Go(func() {
			err := s.Audit(ctx, AuditEvent{Action: ActionExec, Detail: json.RawMessage(fmt.Sprint(i))})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, ErrClosed):
				closed++
			default:
				t.Error(err)
			}
		})
	}
	time.Sleep(time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if ok+closed != n {
		t.Fatalf("ok %d + closed %d != %d", ok, closed, n)
	}
	s, err = b.open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	evs, err := s.AuditLog(ctx, AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != ok {
		t.Errorf("%d events in the log, %d reported written", len(evs), ok)
	}
	t.Logf("%d written before Close, %d refused with ErrClosed", ok, closed)
}

func TestAuditCancelledContext(t *testing.T) { eachBackend(t, testAuditCancelledContext) }

func testAuditCancelledContext(t *testing.T, b backend) {
	s, _ := b.openTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// With room in the queue the event is still written: ctx only bounds
	// the wait for room, so a cancelled request does not lose its event.
	if err := s.Audit(ctx, AuditEvent{Action: ActionExec}); err != nil {
		t.Fatalf("Audit with cancelled ctx and room in the queue: %v", err)
	}
	if evs, _ := s.AuditLog(context.Background(), AuditFilter{}); len(evs) != 1 {
		t.Errorf("log has %d events, want 1", len(evs))
	}
}

func TestConnections(t *testing.T) { eachBackend(t, testConnections) }

func testConnections(t *testing.T, b backend) {
	s, _ := b.openTest(t)
	ctx := context.Background()
	at := time.Date(2026, 2, 3, 4, 5, 6, 7, time.UTC)
	want := Connection{SandboxID: "a", Time: at, Host: "pypi.org", Port: 443, Allowed: true, Reason: "allowlist",
		BytesUp: 1200, BytesDown: 1 << 40, Duration: 1500 * time.Millisecond}
	if err := s.LogConnection(ctx, want); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		c := Connection{SandboxID: "a", Host: fmt.Sprintf("h%d", i), Port: 80, Reason: "denied by default",
			Duration: 1500 * time.Microsecond}
		if err := s.LogConnection(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.LogConnection(ctx, Connection{SandboxID: "b", Host: "x", Port: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.LogConnection(ctx, Connection{Host: "x"}); err == nil {
		t.Error("connection without sandbox accepted")
	}
	all, err := s.Connections(ctx, "a", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 6 {
		t.Fatalf("%d connections, want 6", len(all))
	}
	got := all[5]
	if !got.Time.Equal(want.Time) {
		t.Errorf("Time = %v, want %v", got.Time, want.Time)
	}
	got.Time = want.Time
	if got != want {
		t.Errorf("oldest connection = %+v, want %+v", got, want)
	}
	if all[0].Host != "h4" || all[0].Allowed || all[0].Duration != time.Millisecond {
		t.Errorf("newest connection = %+v (duration is stored in whole ms)", all[0])
	}
	if l, _ := s.Connections(ctx, "a", 2); len(l) != 2 || l[0].Host != "h4" || l[1].Host != "h3" {
		t.Errorf("limit 2 = %+v", l)
	}
	if l, err := s.Connections(ctx, "none", 0); err != nil || l == nil || len(l) != 0 {
		t.Errorf("no connections = %v, %v", l, err)
	}
}
