package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Sandbox states. A sandbox starts running and ends in exactly one of the
// other states.
const (
	// StateRunning: the sandbox is alive (or believed to be).
	StateRunning = "running"
	// StateKilled: ended on request.
	StateKilled = "killed"
	// StateExpired: ended because its expiry passed.
	StateExpired = "expired"
	// StateLost: could not be reattached after a server restart.
	StateLost = "lost"
	// StateExited: its init process exited on its own.
	StateExited = "exited"
)

// validState reports whether st is a known sandbox state.
func validState(st string) bool {
	switch st {
	case StateRunning, StateKilled, StateExpired, StateLost, StateExited:
		return true
	}
	return false
}

// Sandbox is the stored record of one sandbox.
type Sandbox struct {
	// ID identifies the sandbox; chosen by the caller.
	ID string
	// Owner is the ID of the API key that created it ("" for none).
	Owner string
	// Profile is the policy preset name.
	Profile string
	// Template is the template the sandbox was created from, if any.
	Template string
	// State is one of the State* constants.
	State string
	// CreatedAt is when the sandbox was created. PutSandbox fills in the
	// current time when it is zero.
	CreatedAt time.Time
	// ExpiresAt is when the sandbox should be reaped; zero means never.
	ExpiresAt time.Time
	// EndedAt is when the sandbox ended; nil while running.
	EndedAt *time.Time
	// EndReason says why it ended, in words.
	EndReason string
	// Metadata holds caller-defined labels. Never nil when read back.
	Metadata map[string]string
	// Policy is the sandbox's policy as JSON; nil if not recorded.
	Policy json.RawMessage
	// InitPID is the host PID of the sandbox's init process.
	InitPID int
	// Runtime is the runtime's own reattach state, opaque to the store.
	Runtime json.RawMessage
	// Cgroup is the name of the sandbox's cgroup.
	Cgroup string
	// UIDBase is the first host uid and gid of the sandbox's own id range
	// (0 when airlock runs unprivileged and maps the caller's uid).
	UIDBase int
}

// ListFilter selects sandboxes for ListSandboxes and CountSandboxes. Zero
// fields do not filter.
type ListFilter struct {
	// Owner keeps sandboxes owned by this key ID.
	Owner string
	// States keeps sandboxes in any of these states.
	States []string
	// Metadata keeps sandboxes whose metadata has every one of these
	// key/value pairs.
	Metadata map[string]string
	// ExpiresBefore keeps sandboxes with an expiry strictly before this
	// time (sandboxes without an expiry never match).
	ExpiresBefore time.Time
	// Limit caps the number of results; 0 means no limit. Ignored by
	// CountSandboxes.
	Limit int
	// After keeps sandboxes whose ID sorts after this one: pass the last
	// ID of the previous page. Ignored by CountSandboxes.
	After string
}

const sandboxCols = `id, owner, profile, template, state, created_at, expires_at,
	ended_at, end_reason, metadata, policy, init_pid, runtime, cgroup, uid_base`

// PutSandbox inserts sb, or replaces the stored sandbox with the same ID.
// If sb.CreatedAt is zero it is set to the current time, in sb too.
func (s *Store) PutSandbox(ctx context.Context, sb *Sandbox) (err error) {
	defer func() { err = s.spaceErr(err) }()
	if sb == nil || sb.ID == "" {
		return errors.New("store: put sandbox: empty ID")
	}
	if !validState(sb.State) {
		return fmt.Errorf("store: put sandbox %q: invalid state %q", sb.ID, sb.State)
	}
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = time.Now().UTC()
	}
	created, err := mustNanos(sb.CreatedAt)
	if err != nil {
		return fmt.Errorf("store: put sandbox %q: created_at: %w", sb.ID, err)
	}
	expires, err := nanos(sb.ExpiresAt)
	if err != nil {
		return fmt.Errorf("store: put sandbox %q: expires_at: %w", sb.ID, err)
	}
	var ended any
	if sb.EndedAt != nil {
		if ended, err = nanos(*sb.EndedAt); err != nil {
			return fmt.Errorf("store: put sandbox %q: ended_at: %w", sb.ID, err)
		}
	}
	meta := []byte("{}")
	if len(sb.Metadata) > 0 {
		if meta, err = json.Marshal(sb.Metadata); err != nil {
			return fmt.Errorf("store: put sandbox %q: metadata: %w", sb.ID, err)
		}
	}
	pol, err := rawJSON("policy", sb.Policy)
	if err != nil {
		return fmt.Errorf("store: put sandbox %q: %w", sb.ID, err)
	}
	rt, err := rawJSON("runtime state", sb.Runtime)
	if err != nil {
		return fmt.Errorf("store: put sandbox %q: %w", sb.ID, err)
	}

	// The owner goes to the shared database first: if the sandbox's own
	// record then fails, an owner row for a sandbox that never ran is
	// harmless.
	if err := s.putOwnerPG(ctx, sb); err != nil {
		return err
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: put sandbox %q: begin: %w", sb.ID, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO sandboxes (`+sandboxCols+`)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT(id) DO UPDATE SET
	owner = excluded.owner, profile = excluded.profile, template = excluded.template,
	state = excluded.state, created_at = excluded.created_at, expires_at = excluded.expires_at,
	ended_at = excluded.ended_at, end_reason = excluded.end_reason, metadata = excluded.metadata,
	policy = excluded.policy, init_pid = excluded.init_pid, runtime = excluded.runtime,
	cgroup = excluded.cgroup, uid_base = excluded.uid_base`,
		sb.ID, sb.Owner, sb.Profile, sb.Template, sb.State, created, expires,
		ended, sb.EndReason, string(meta), pol, sb.InitPID, rt, sb.Cgroup, sb.UIDBase); err != nil {
		return fmt.Errorf("store: put sandbox %q: %w", sb.ID, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_meta WHERE sandbox_id = ?`, sb.ID); err != nil {
		return fmt.Errorf("store: put sandbox %q: clear metadata index: %w", sb.ID, err)
	}
	for _, k := range slices.Sorted(maps.Keys(sb.Metadata)) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandbox_meta (sandbox_id, key, value) VALUES (?, ?, ?)`,
			sb.ID, k, sb.Metadata[k]); err != nil {
			return fmt.Errorf("store: put sandbox %q: index metadata %q: %w", sb.ID, k, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: put sandbox %q: commit: %w", sb.ID, err)
	}
	return nil
}

// GetSandbox returns the sandbox with the given ID, or an error wrapping
// ErrNotFound.
func (s *Store) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	row := s.r.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id)
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("store: sandbox %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: get sandbox %q: %w", id, err)
	}
	return sb, nil
}

// ListSandboxes returns the sandboxes matching f, ordered by ID. The result
// is never nil.
func (s *Store) ListSandboxes(ctx context.Context, f ListFilter) ([]*Sandbox, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("store: list sandboxes: negative limit %d", f.Limit)
	}
	where, args, err := f.where(true)
	if err != nil {
		return nil, err
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes` + where + ` ORDER BY id`
	if f.Limit > 0 {
		q += ` LIMIT ?`
		args = append(args, f.Limit)
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list sandboxes: %w", err)
	}
	defer rows.Close()
	out := []*Sandbox{}
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list sandboxes: %w", err)
	}
	return out, nil
}

// CountSandboxes returns how many sandboxes match f, ignoring f.Limit and
// f.After. Use it to enforce APIKey.MaxSandboxes.
func (s *Store) CountSandboxes(ctx context.Context, f ListFilter) (int, error) {
	where, args, err := f.where(false)
	if err != nil {
		return 0, err
	}
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes`+where, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count sandboxes: %w", err)
	}
	return n, nil
}

// where renders the filter as a WHERE clause (possibly empty) and its
// arguments. paging includes the After condition.
func (f ListFilter) where(paging bool) (string, []any, error) {
	var conds []string
	var args []any
	if f.Owner != "" {
		conds = append(conds, `owner = ?`)
		args = append(args, f.Owner)
	}
	if len(f.States) > 0 {
		conds = append(conds, `state IN (?`+strings.Repeat(`, ?`, len(f.States)-1)+`)`)
		for _, st := range f.States {
			args = append(args, st)
		}
	}
	if !f.ExpiresBefore.IsZero() {
		n, err := mustNanos(f.ExpiresBefore)
		if err != nil {
			return "", nil, fmt.Errorf("store: list filter: %w", err)
		}
		conds = append(conds, `expires_at < ?`)
		args = append(args, n)
	}
	// Sorted so that equal filters produce identical SQL.
	for _, k := range slices.Sorted(maps.Keys(f.Metadata)) {
		conds = append(conds, `id IN (SELECT sandbox_id FROM sandbox_meta WHERE key = ? AND value = ?)`)
		args = append(args, k, f.Metadata[k])
	}
	if paging && f.After != "" {
		conds = append(conds, `id > ?`)
		args = append(args, f.After)
	}
	if len(conds) == 0 {
		return "", nil, nil
	}
	return ` WHERE ` + strings.Join(conds, ` AND `), args, nil
}

// EndSandbox moves a running sandbox to the terminal state, recording when
// and why. A zero at means now. It returns an error wrapping ErrNotFound if
// there is no such sandbox and ErrEnded if it has already ended (the first
// end is kept).
func (s *Store) EndSandbox(ctx context.Context, id, state, reason string, at time.Time) error {
	if state == StateRunning || !validState(state) {
		return fmt.Errorf("store: end sandbox %q: invalid end state %q", id, state)
	}
	if at.IsZero() {
		at = time.Now()
	}
	n, err := mustNanos(at)
	if err != nil {
		return fmt.Errorf("store: end sandbox %q: %w", id, err)
	}
	return s.updateRunning(ctx, "end", id,
		`UPDATE sandboxes SET state = ?, ended_at = ?, end_reason = ? WHERE id = ? AND state = 'running'`,
		state, n, reason, id)
}

// SetExpiry changes when a running sandbox expires; a zero at removes the
// expiry. It returns an error wrapping ErrNotFound or ErrEnded like
// EndSandbox.
func (s *Store) SetExpiry(ctx context.Context, id string, at time.Time) error {
	n, err := nanos(at)
	if err != nil {
		return fmt.Errorf("store: set expiry of %q: %w", id, err)
	}
	return s.updateRunning(ctx, "set expiry of", id,
		`UPDATE sandboxes SET expires_at = ? WHERE id = ? AND state = 'running'`, n, id)
}

// updateRunning runs an UPDATE guarded by state = 'running' and, when it
// matches nothing, tells a missing sandbox from an ended one.
func (s *Store) updateRunning(ctx context.Context, verb, id, query string, args ...any) (err error) {
	defer func() { err = s.spaceErr(err) }()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: %s sandbox %q: begin: %w", verb, id, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("store: %s sandbox %q: %w", verb, id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("store: %s sandbox %q: %w", verb, id, err)
	} else if n == 0 {
		var one int
		err := tx.QueryRowContext(ctx, `SELECT 1 FROM sandboxes WHERE id = ?`, id).Scan(&one)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("store: %s sandbox %q: %w", verb, id, ErrNotFound)
		case err != nil:
			return fmt.Errorf("store: %s sandbox %q: %w", verb, id, err)
		}
		return fmt.Errorf("store: %s sandbox %q: %w", verb, id, ErrEnded)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: %s sandbox %q: commit: %w", verb, id, err)
	}
	return nil
}

// scanner is satisfied by *sql.Row and *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

// scanSandbox reads one row selected with sandboxCols.
func scanSandbox(sc scanner) (*Sandbox, error) {
	var (
		sb              Sandbox
		created         int64
		expires, ended  sql.NullInt64
		meta            string
		policy, rtState sql.NullString
	)
	if err := sc.Scan(&sb.ID, &sb.Owner, &sb.Profile, &sb.Template, &sb.State, &created,
		&expires, &ended, &sb.EndReason, &meta, &policy, &sb.InitPID, &rtState, &sb.Cgroup, &sb.UIDBase); err != nil {
		return nil, err
	}
	sb.CreatedAt = fromNanos(created)
	sb.ExpiresAt = fromNullNanos(expires)
	if ended.Valid {
		t := fromNanos(ended.Int64)
		sb.EndedAt = &t
	}
	sb.Metadata = map[string]string{}
	if err := json.Unmarshal([]byte(meta), &sb.Metadata); err != nil {
		return nil, fmt.Errorf("sandbox %q: decode metadata: %w", sb.ID, err)
	}
	if sb.Metadata == nil { // stored "null"
		sb.Metadata = map[string]string{}
	}
	if policy.Valid {
		sb.Policy = json.RawMessage(policy.String)
	}
	if rtState.Valid {
		sb.Runtime = json.RawMessage(rtState.String)
	}
	return &sb, nil
}

// LiveUIDBases returns the host id ranges (first ids) recorded for running
// sandboxes. Ranges of ended and lost sandboxes are free again.
func (s *Store) LiveUIDBases(ctx context.Context) (map[int]bool, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT uid_base FROM sandboxes WHERE state = ? AND uid_base != 0`, StateRunning)
	if err != nil {
		return nil, fmt.Errorf("store: live uid ranges: %w", err)
	}
	defer rows.Close()
	out := map[int]bool{}
	for rows.Next() {
		var b int
		if err := rows.Scan(&b); err != nil {
			return nil, fmt.Errorf("store: live uid ranges: %w", err)
		}
		out[b] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: live uid ranges: %w", err)
	}
	return out, nil
}
