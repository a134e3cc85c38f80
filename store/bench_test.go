package store

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/airlock-dev/airlock/internal/pgtest"
)

// BenchmarkAuthenticate measures the per-request cost of checking an API key
// once it is cached.
func BenchmarkAuthenticate(b *testing.B) {
	s, _ := openTest(b)
	ctx := context.Background()
	_, secret, err := s.CreateKey(ctx, "bench", 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("cached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Authenticate(ctx, secret); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.Authenticate(ctx, secret); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("uncached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.keyMu.Lock()
			clear(s.keyCache)
			s.keyMu.Unlock()
			if _, err := s.Authenticate(ctx, secret); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unknown", func(b *testing.B) {
		b.ReportAllocs()
		bad := secret[:len(secret)-1] + "x"
		if bad == secret {
			bad = secret[:len(secret)-1] + "y"
		}
		for b.Loop() {
			if _, err := s.Authenticate(ctx, bad); err == nil {
				b.Fatal("unknown secret accepted")
			}
		}
	})
}

// BenchmarkAudit measures appending one exec event, from one goroutine
// (every event is its own commit) and from many (group commit).
func BenchmarkAudit(b *testing.B) {
	ev := AuditEvent{KeyID: "key_0123456789abcdef", SandboxID: "sb-0123", Action: ActionExec,
		Detail: json.RawMessage(`{"argv":["python3","-c","print(1)"],"exit":0,"ms":12}`)}
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		s, _ := openTest(b)
		b.ReportAllocs()
		for b.Loop() {
			if err := s.Audit(ctx, ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		s, _ := openTest(b)
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := s.Audit(ctx, ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	// For comparison: the same INSERT as its own autocommit statement,
	// bypassing the queue.
	b.Run("direct-serial", func(b *testing.B) {
		s, _ := openTest(b)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.insAudit.ExecContext(ctx, int64(1), ev.KeyID, ev.SandboxID, ev.Action, string(ev.Detail)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("direct-parallel", func(b *testing.B) {
		s, _ := openTest(b)
		b.ReportAllocs()
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.insAudit.ExecContext(ctx, int64(1), ev.KeyID, ev.SandboxID, ev.Action, string(ev.Detail)); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// BenchmarkPostgres measures the shared database's per-request costs on a
// local test cluster: a key check (one query, nothing cached) and audit
// appends (one advisory-locked transaction per batch).
func BenchmarkPostgres(b *testing.B) {
	be := backend{name: "postgres", url: pgtest.Shared(b).NewDatabase(b)}
	s, _ := be.openTest(b)
	ctx := context.Background()
	_, secret, err := s.CreateKey(ctx, "bench", 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("authenticate", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Authenticate(ctx, secret); err != nil {
				b.Fatal(err)
			}
		}
	})
	ev := AuditEvent{KeyID: "key_0123456789abcdef", SandboxID: "sb-0123", Action: ActionExec,
		Detail: json.RawMessage(`{"argv":["python3","-c","print(1)"],"exit":0,"ms":12}`)}
	b.Run("audit-serial", func(b *testing.B) {
		for b.Loop() {
			if err := s.Audit(ctx, ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("audit-parallel", func(b *testing.B) {
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := s.Audit(ctx, ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}
