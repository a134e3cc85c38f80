// Package spans times the phases of one operation and logs them as one
// debug line (`airlock serve --log-level debug`): what a latency figure is
// made of, repeatable on any deployment without a profiler.
package spans

import (
	"context"
	"log/slog"
	"time"
)

// Spans times the consecutive phases of one operation. The zero value is
// not usable: call Start.
type Spans struct {
	t0, last time.Time
	attrs    []any
}

// Start begins timing an operation now.
func Start() *Spans {
	now := time.Now()
	return &Spans{t0: now, last: now}
}

// Mark ends the phase that began at the previous Mark (or Start) and
// records it as name_ms.
func (s *Spans) Mark(name string) {
	now := time.Now()
	s.attrs = append(s.attrs, name+"_ms", ms(now.Sub(s.last)))
	s.last = now
}

// Add records a value that is not a phase (a count, an id).
func (s *Spans) Add(key string, value any) { s.attrs = append(s.attrs, key, value) }

// Log writes msg at debug level with every phase and total_ms, the time
// since Start, through slog's default logger.
func (s *Spans) Log(msg string) {
	if !slog.Default().Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	slog.Debug(msg, append(s.attrs, "total_ms", ms(time.Since(s.t0)))...)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
