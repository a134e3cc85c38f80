package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"
)

// testSandbox returns a fully populated running sandbox.
func testSandbox(id string) *Sandbox {
	created := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	return &Sandbox{
		ID:        id,
		Owner:     "key_0001",
		Profile:   "strict",
		Template:  "python",
		State:     StateRunning,
		CreatedAt: created,
		ExpiresAt: created.Add(time.Hour),
		Metadata:  map[string]string{"team": "ml", "run": "42"},
		Policy:    json.RawMessage(`{"profile":"strict","limits":{"memory":"512MiB"}}`),
		InitPID:   4242,
		Runtime:   json.RawMessage(`{"tier":"native","netns":"/proc/4242/ns/net"}`),
		Cgroup:    "airlock/" + id,
	}
}

// assertSandbox compares two sandboxes field by field.
func assertSandbox(t *testing.T, got, want *Sandbox) {
	t.Helper()
	if got.ID != want.ID || got.Owner != want.Owner || got.Profile != want.Profile ||
		got.Template != want.Template || got.State != want.State || got.EndReason != want.EndReason ||
		got.InitPID != want.InitPID || got.Cgroup != want.Cgroup {
		t.Errorf("scalar fields:\n got %+v\nwant %+v", got, want)
	}
	if !got.CreatedAt.Equal(want.CreatedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) {
		t.Errorf("times: got created %v expires %v, want %v %v", got.CreatedAt, got.ExpiresAt, want.CreatedAt, want.ExpiresAt)
	}
	if (got.EndedAt == nil) != (want.EndedAt == nil) || got.EndedAt != nil && !got.EndedAt.Equal(*want.EndedAt) {
		t.Errorf("EndedAt = %v, want %v", got.EndedAt, want.EndedAt)
	}
	if got.Metadata == nil {
		t.Error("Metadata is nil")
	}
	if !maps.Equal(got.Metadata, want.Metadata) {
		t.Errorf("Metadata = %v, want %v", got.Metadata, want.Metadata)
	}
	if !bytes.Equal(got.Policy, want.Policy) || !bytes.Equal(got.Runtime, want.Runtime) {
		t.Errorf("JSON blobs: got %s %s, want %s %s", got.Policy, got.Runtime, want.Policy, want.Runtime)
	}
}

func TestSandboxRoundTrip(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	want := testSandbox("sb-round")
	if err := s.PutSandbox(ctx, want); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, want.ID)
	if err != nil {
		t.Fatal(err)
	}
	assertSandbox(t, got, want)
	if got.CreatedAt.Location() != time.UTC {
		t.Errorf("CreatedAt location = %v, want UTC", got.CreatedAt.Location())
	}

	// Replace: change everything, drop a metadata key, clear the blobs.
	want.State = StateExited
	ended := want.CreatedAt.Add(time.Minute)
	want.EndedAt = &ended
	want.EndReason = "exit status 0"
	want.Metadata = map[string]string{"team": "infra"}
	want.Policy, want.Runtime = nil, nil
	want.ExpiresAt = time.Time{}
	want.InitPID = 0
	if err := s.PutSandbox(ctx, want); err != nil {
		t.Fatal(err)
	}
	got, err = s.GetSandbox(ctx, want.ID)
	if err != nil {
		t.Fatal(err)
	}
	assertSandbox(t, got, want)
	// The metadata index follows the replacement.
	if l, _ := s.ListSandboxes(ctx, ListFilter{Metadata: map[string]string{"run": "42"}}); len(l) != 0 {
		t.Errorf("stale metadata index entry matched: %v", l)
	}
	if l, _ := s.ListSandboxes(ctx, ListFilter{Metadata: map[string]string{"team": "infra"}}); len(l) != 1 {
		t.Errorf("new metadata not indexed: %v", l)
	}
}

func TestSandboxMinimal(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	sb := &Sandbox{ID: "min", State: StateRunning}
	before := time.Now()
	if err := s.PutSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if sb.CreatedAt.Before(before) {
		t.Errorf("CreatedAt not filled in: %v", sb.CreatedAt)
	}
	got, err := s.GetSandbox(ctx, "min")
	if err != nil {
		t.Fatal(err)
	}
	if got.Metadata == nil || len(got.Metadata) != 0 || got.Policy != nil || got.Runtime != nil ||
		!got.ExpiresAt.IsZero() || got.EndedAt != nil {
		t.Errorf("minimal sandbox read back as %+v", got)
	}
}

func TestSandboxValidation(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	for name, sb := range map[string]*Sandbox{
		"no id":       {State: StateRunning},
		"bad state":   {ID: "x", State: "zombie"},
		"no state":    {ID: "x"},
		"bad policy":  {ID: "x", State: StateRunning, Policy: json.RawMessage(`{`)},
		"bad runtime": {ID: "x", State: StateRunning, Runtime: json.RawMessage(`nope`)},
	} {
		if err := s.PutSandbox(ctx, sb); err == nil {
			t.Errorf("%s: PutSandbox accepted %+v", name, sb)
		}
	}
	if _, err := s.GetSandbox(ctx, "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetSandbox(missing) = %v, want ErrNotFound", err)
	}
}

func TestEndSandboxAndExpiry(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	sb := testSandbox("e")
	if err := s.PutSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	exp := sb.CreatedAt.Add(2 * time.Hour)
	if err := s.SetExpiry(ctx, "e", exp); err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetSandbox(ctx, "e")
	if !got.ExpiresAt.Equal(exp) {
		t.Errorf("ExpiresAt = %v, want %v", got.ExpiresAt, exp)
	}
	if err := s.SetExpiry(ctx, "e", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got, _ = s.GetSandbox(ctx, "e"); !got.ExpiresAt.IsZero() {
		t.Errorf("expiry not cleared: %v", got.ExpiresAt)
	}

	if err := s.EndSandbox(ctx, "e", StateRunning, "", time.Time{}); err == nil {
		t.Error("EndSandbox accepted state running")
	}
	at := sb.CreatedAt.Add(30 * time.Minute)
	if err := s.EndSandbox(ctx, "e", StateKilled, "killed by key_0001", at); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetSandbox(ctx, "e")
	if got.State != StateKilled || got.EndReason != "killed by key_0001" || got.EndedAt == nil || !got.EndedAt.Equal(at) {
		t.Errorf("after end: %+v", got)
	}
	// The first end wins.
	if err := s.EndSandbox(ctx, "e", StateExited, "exit 1", time.Time{}); !errors.Is(err, ErrEnded) {
		t.Errorf("second EndSandbox = %v, want ErrEnded", err)
	}
	if err := s.SetExpiry(ctx, "e", at); !errors.Is(err, ErrEnded) {
		t.Errorf("SetExpiry on ended = %v, want ErrEnded", err)
	}
	if got, _ = s.GetSandbox(ctx, "e"); got.State != StateKilled {
		t.Errorf("state overwritten: %s", got.State)
	}
	if err := s.EndSandbox(ctx, "nope", StateLost, "", time.Time{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("EndSandbox(missing) = %v, want ErrNotFound", err)
	}
	if err := s.SetExpiry(ctx, "nope", at); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetExpiry(missing) = %v, want ErrNotFound", err)
	}
}

func TestListFilters(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	put := func(id, owner, state string, meta map[string]string, expires time.Time) {
		t.Helper()
		sb := &Sandbox{ID: id, Owner: owner, State: state, CreatedAt: base, Metadata: meta, ExpiresAt: expires}
		if err := s.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	put("a", "k1", StateRunning, map[string]string{"env": "prod", "team": "ml"}, base.Add(time.Hour))
	put("b", "k1", StateKilled, map[string]string{"env": "prod", "team": "web"}, time.Time{})
	put("c", "k2", StateRunning, map[string]string{"env": "dev", "team": "ml"}, base.Add(3*time.Hour))
	put("d", "k2", StateRunning, nil, base.Add(2*time.Hour))
	// A key/value pair split differently must not match ("env"="prod" vs
	// a key "envprod" or value concatenations).
	put("e", "k3", StateRunning, map[string]string{"envprod": "", "x\"y": "a'b"}, time.Time{})

	ids := func(f ListFilter) string {
		t.Helper()
		l, err := s.ListSandboxes(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		out := ""
		for _, sb := range l {
			out += sb.ID
		}
		n, err := s.CountSandboxes(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if f.Limit == 0 && f.After == "" && n != len(l) {
			t.Errorf("CountSandboxes(%+v) = %d, List returned %d", f, n, len(l))
		}
		return out
	}
	for _, tc := range []struct {
		f    ListFilter
		want string
	}{
		{ListFilter{}, "abcde"},
		{ListFilter{Owner: "k1"}, "ab"},
		{ListFilter{States: []string{StateRunning}}, "acde"},
		{ListFilter{States: []string{StateKilled, StateExpired}}, "b"},
		{ListFilter{Owner: "k2", States: []string{StateRunning}}, "cd"},
		{ListFilter{Metadata: map[string]string{"env": "prod"}}, "ab"},
		{ListFilter{Metadata: map[string]string{"env": "prod", "team": "ml"}}, "a"},
		{ListFilter{Metadata: map[string]string{"team": "ml"}, States: []string{StateRunning}}, "ac"},
		{ListFilter{Metadata: map[string]string{"env": "staging"}}, ""},
		{ListFilter{Metadata: map[string]string{"envprod": ""}}, "e"},
		{ListFilter{Metadata: map[string]string{"x\"y": "a'b"}}, "e"},
		{ListFilter{Metadata: map[string]string{"env": ""}}, ""},
		{ListFilter{ExpiresBefore: base.Add(150 * time.Minute)}, "ad"},
		{ListFilter{ExpiresBefore: base.Add(time.Hour)}, ""},
		{ListFilter{Limit: 2}, "ab"},
		{ListFilter{After: "b"}, "cde"},
		{ListFilter{After: "b", Limit: 2}, "cd"},
		{ListFilter{Owner: "nobody"}, ""},
	} {
		if got := ids(tc.f); got != tc.want {
			t.Errorf("ListSandboxes(%+v) = %q, want %q", tc.f, got, tc.want)
		}
	}
	if l, err := s.ListSandboxes(ctx, ListFilter{Owner: "nobody"}); err != nil || l == nil {
		t.Errorf("empty list = %v, %v; want non-nil empty", l, err)
	}
	if _, err := s.ListSandboxes(ctx, ListFilter{Limit: -1}); err == nil {
		t.Error("negative limit accepted")
	}
}

func TestListPaging(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	const n = 95
	for i := range n {
		meta := map[string]string{"parity": fmt.Sprint(i % 2)}
		if err := s.PutSandbox(ctx, &Sandbox{ID: fmt.Sprintf("sb-%03d", i), State: StateRunning, Metadata: meta}); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	f := ListFilter{Limit: 10, Metadata: map[string]string{"parity": "0"}}
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("paging does not terminate")
		}
		page, err := s.ListSandboxes(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range page {
			seen = append(seen, sb.ID)
		}
		if len(page) < f.Limit {
			break
		}
		f.After = page[len(page)-1].ID
	}
	if len(seen) != 48 {
		t.Fatalf("paged through %d sandboxes, want 48", len(seen))
	}
	for i, id := range seen {
		if want := fmt.Sprintf("sb-%03d", 2*i); id != want {
			t.Fatalf("page order: seen[%d] = %s, want %s", i, id, want)
		}
	}
}

func TestConcurrentWriters(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	key, secret, err := s.CreateKey(ctx, "load", 0)
	if err != nil {
		t.Fatal(err)
	}
	const workers, each = 50, 20
	var wg sync.WaitGroup
	errs := make(chan error, workers*each*5)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("w%02d-%02d", w, i)
				sb := &Sandbox{ID: id, Owner: key.ID, State: StateRunning, Metadata: map[string]string{"worker": fmt.Sprint(w)}}
				if err := s.PutSandbox(ctx, sb); err != nil {
					errs <- err
					continue
				}
				if err := s.Audit(ctx, AuditEvent{KeyID: key.ID, SandboxID: id, Action: ActionExec,
					Detail: json.RawMessage(`{"argv":["true"]}`)}); err != nil {
					errs <- err
				}
				if err := s.LogConnection(ctx, Connection{SandboxID: id, Host: "pypi.org", Port: 443}); err != nil {
					errs <- err
				}
				if _, err := s.Authenticate(ctx, secret); err != nil {
					errs <- err
				}
				if i%2 == 0 {
					if err := s.EndSandbox(ctx, id, StateExited, "done", time.Time{}); err != nil {
						errs <- err
					}
				}
				if _, err := s.ListSandboxes(ctx, ListFilter{Metadata: map[string]string{"worker": fmt.Sprint(w)}}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	total, err := s.CountSandboxes(ctx, ListFilter{Owner: key.ID})
	if err != nil {
		t.Fatal(err)
	}
	running, err := s.CountSandboxes(ctx, ListFilter{Owner: key.ID, States: []string{StateRunning}})
	if err != nil {
		t.Fatal(err)
	}
	if total != workers*each || running != workers*each/2 {
		t.Errorf("total %d running %d, want %d and %d", total, running, workers*each, workers*each/2)
	}
	evs, err := s.AuditLog(ctx, AuditFilter{Action: ActionExec})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != workers*each {
		t.Errorf("%d audit events, want %d", len(evs), workers*each)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].ID >= evs[i-1].ID {
			t.Fatalf("audit log not newest first at %d: %d then %d", i, evs[i-1].ID, evs[i].ID)
		}
	}
}
