package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Audit actions used by airlock. Others may be recorded.
const (
	ActionSandboxCreate  = "sandbox.create"
	ActionSandboxKill    = "sandbox.kill"
	ActionExec           = "exec"
	ActionFileWrite      = "file.write"
	ActionNetworkChange  = "network.change"
	ActionNetworkConnect = "network.connect"
)

// AuditEvent is one entry of the append-only audit log.
type AuditEvent struct {
	// ID is assigned by the store, increasing; ignored by Audit.
	ID int64
	// Time is when it happened; Audit uses the current time when zero.
	Time time.Time
	// KeyID is the API key that acted ("" for none).
	KeyID string
	// SandboxID is the sandbox acted on ("" for none).
	SandboxID string
	// Action is what was done, e.g. "exec"; required.
	Action string
	// Detail is optional JSON about the action.
	Detail json.RawMessage
}

// AuditFilter selects audit events. Zero fields do not filter.
type AuditFilter struct {
	// SandboxID keeps events about this sandbox.
	SandboxID string
	// Action keeps events with this action.
	Action string
	// KeyID keeps events by this API key.
	KeyID string
	// Before keeps events with an ID below this one: pass the last ID of
	// the previous page.
	Before int64
	// Since and Until keep events at or after Since and before Until.
	Since, Until time.Time
	// Scoped keeps only what the API key Owner may see: the events it made
	// and the events about its sandboxes ("" is the owner of an
	// unauthenticated server's sandboxes).
	Scoped bool
	Owner  string
	// Limit caps the number of results; 0 means no limit.
	Limit int
}

// Connection is one outbound connection attempt by a sandbox.
type Connection struct {
	// SandboxID is the sandbox that connected.
	SandboxID string
	// Time is when the attempt started; LogConnection uses the current
	// time when zero.
	Time time.Time
	// Host is the destination host name or address.
	Host string
	// Port is the destination port.
	Port int
	// Allowed says whether policy let the connection through.
	Allowed bool
	// Reason says which rule decided.
	Reason string
	// BytesUp and BytesDown count bytes sent and received.
	BytesUp, BytesDown int64
	// Duration is how long the connection lasted; stored in whole
	// milliseconds.
	Duration time.Duration
}

// Writes to the audit and network logs are serialised by the write lock
// (Store.wmu). A caller that finds the lock free and nothing queued commits
// its own append at once, in its own goroutine (no hand-off to another
// goroutine and back: that was most of an uncontended append's cost).
// Otherwise it queues the append, and one goroutine commits whatever has
// queued up in a single transaction (group commit), so concurrent callers
// share the cost of a commit. Either way each caller waits for its own
// commit: an event reported as logged is in the database.
const (
	queueSize = 1024 // bounded: callers block when it is full
	maxBatch  = 256  // events per transaction
)

const (
	sqlInsertAudit = `INSERT INTO audit (time, key_id, sandbox_id, action, detail) VALUES (?, ?, ?, ?, ?)`
	sqlInsertConn  = `INSERT INTO network_log (sandbox_id, time, host, port, allowed, reason, bytes_up, bytes_down, duration_ms)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`
)

// writeReq is one queued append: exactly one of audit or conn is set.
type writeReq struct {
	audit bool
	time  int64
	ev    AuditEvent
	conn  Connection
	done  chan error
}

var reqPool = sync.Pool{New: func() any { return &writeReq{done: make(chan error, 1)} }}

// Audit appends ev to the audit log and returns once it is committed.
// Events are never updated or deleted. ctx bounds only the wait for room in
// the write queue; once queued, the event is written even if ctx is
// cancelled, and Close writes every queued event before closing.
func (s *Store) Audit(ctx context.Context, ev AuditEvent) error {
	if ev.Action == "" {
		return errors.New("store: audit: empty action")
	}
	if len(ev.Detail) > 0 && !json.Valid(ev.Detail) {
		return fmt.Errorf("store: audit %s: detail is not valid JSON", ev.Action)
	}
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	t, err := mustNanos(ev.Time)
	if err != nil {
		return fmt.Errorf("store: audit %s: %w", ev.Action, err)
	}
	r := reqPool.Get().(*writeReq)
	r.audit, r.time, r.ev = true, t, ev
	if err := s.submit(ctx, r); err != nil {
		return fmt.Errorf("store: audit %s: %w", ev.Action, s.sharedErr(err))
	}
	return nil
}

// LogConnection appends c to the network log and returns once it is
// committed; ctx is handled as by Audit.
func (s *Store) LogConnection(ctx context.Context, c Connection) error {
	if c.SandboxID == "" {
		return errors.New("store: log connection: empty sandbox ID")
	}
	if c.Time.IsZero() {
		c.Time = time.Now()
	}
	t, err := mustNanos(c.Time)
	if err != nil {
		return fmt.Errorf("store: log connection of %q: %w", c.SandboxID, err)
	}
	r := reqPool.Get().(*writeReq)
	r.audit, r.time, r.conn = false, t, c
	if err := s.submit(ctx, r); err != nil {
		return fmt.Errorf("store: log connection of %q: %w", c.SandboxID, s.sharedErr(err))
	}
	return nil
}

// submit queues r, waits for its commit and recycles r.
func (s *Store) submit(ctx context.Context, r *writeReq) error {
	s.qmu.RLock()
	if s.closed {
		s.qmu.RUnlock()
		reqPool.Put(r)
		return ErrClosed
	}
	if err, done := s.writeNow(r); done {
		s.qmu.RUnlock()
		*r = writeReq{done: r.done}
		reqPool.Put(r)
		return err
	}
	select {
	case s.queue <- r:
	default:
		// Full: wait for room, for as long as ctx allows. (Trying
		// without ctx first keeps a cancelled ctx from racing a free
		// slot in the select below.)
		select {
		case s.queue <- r:
		case <-ctx.Done():
			s.qmu.RUnlock()
			reqPool.Put(r)
			return ctx.Err()
		}
	}
	// Close waits for this read lock before closing the queue, so r is
	// guaranteed to reach the writer, which drains the queue to the end.
	s.qmu.RUnlock()
	err := <-r.done
	*r = writeReq{done: r.done}
	reqPool.Put(r)
	return err
}

// writeNow commits r in the caller's goroutine if no other write is under
// way and none is queued, and reports whether it did (err is then r's
// outcome). The caller holds s.qmu's read lock, so Close waits for this
// write to end before it closes the database.
func (s *Store) writeNow(r *writeReq) (err error, done bool) {
	if len(s.queue) > 0 || !s.wmu.TryLock() {
		return nil, false
	}
	defer s.wmu.Unlock()
	if len(s.queue) > 0 {
		// Queued meanwhile: keep the order (first queued, first written).
		return nil, false
	}
	return s.writeBatch([]*writeReq{r}), true
}

// writeLoop commits queued appends in batches until the queue is closed and
// drained.
func (s *Store) writeLoop() {
	defer close(s.writerDone)
	batch := make([]*writeReq, 0, maxBatch)
	for r := range s.queue {
		batch = append(batch[:0], r)
		s.wmu.Lock() // wait for a caller's own write (writeNow) to end
	fill:
		for len(batch) < maxBatch {
			select {
			case r, ok := <-s.queue:
				if !ok {
					break fill
				}
				batch = append(batch, r)
			default:
				break fill
			}
		}
		err := s.writeBatch(batch)
		s.wmu.Unlock()
		for _, r := range batch {
			r.done <- err
		}
	}
}

// writeBatch commits batch in one transaction. It deliberately ignores the
// callers' contexts: a queued event must not be lost to a cancelled request.
// The caller holds s.wmu.
func (s *Store) writeBatch(batch []*writeReq) error {
	ctx := context.Background()
	if len(batch) == 1 && !s.pg {
		// One append is one statement: SQLite commits it on its own
		// (autocommit), with the same atomicity and durability as a
		// transaction around it, and without preparing and running a
		// BEGIN and a COMMIT (the driver prepares those anew each time).
		return s.writeOne(ctx, batch[0])
	}
	if s.pg {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, pgTimeout)
		defer cancel()
	}
	tx, err := s.kw.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	if s.pg {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, pgLockAudit); err != nil {
			return fmt.Errorf("lock: %w", err)
		}
	}
	var ins, insConn *sql.Stmt
	for _, r := range batch {
		if r.audit && ins == nil {
			ins = tx.StmtContext(ctx, s.insAudit)
		}
		if !r.audit && insConn == nil {
			insConn = tx.StmtContext(ctx, s.insConn)
		}
		if err := r.insert(ctx, ins, insConn); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// writeOne commits r alone as one autocommit statement.
func (s *Store) writeOne(ctx context.Context, r *writeReq) error {
	return r.insert(ctx, s.insAudit, s.insConn)
}

// insert runs r's INSERT: ins for an audit event, insConn for a
// connection.
func (r *writeReq) insert(ctx context.Context, ins, insConn *sql.Stmt) error {
	if r.audit {
		e := &r.ev
		var detail any
		if len(e.Detail) > 0 {
			detail = string(e.Detail)
		}
		if _, err := ins.ExecContext(ctx, r.time, e.KeyID, e.SandboxID, e.Action, detail); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		return nil
	}
	c := &r.conn
	if _, err := insConn.ExecContext(ctx, c.SandboxID, r.time, c.Host, c.Port, c.Allowed,
		c.Reason, c.BytesUp, c.BytesDown, c.Duration.Milliseconds()); err != nil {
		return fmt.Errorf("insert: %w", err)
	}
	return nil
}

// AuditLog returns the audit events matching f, newest first. The result is
// never nil.
func (s *Store) AuditLog(ctx context.Context, f AuditFilter) ([]AuditEvent, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("store: audit log: negative limit %d", f.Limit)
	}
	var conds []string
	var args []any
	for _, c := range []struct {
		col string
		val string
	}{{"sandbox_id", f.SandboxID}, {"action", f.Action}, {"key_id", f.KeyID}} {
		if c.val != "" {
			conds = append(conds, c.col+` = ?`)
			args = append(args, c.val)
		}
	}
	if f.Before > 0 {
		conds = append(conds, `id < ?`)
		args = append(args, f.Before)
	}
	for _, c := range []struct {
		cond string
		t    time.Time
	}{{`time >= ?`, f.Since}, {`time < ?`, f.Until}} {
		if !c.t.IsZero() {
			n, err := mustNanos(c.t)
			if err != nil {
				return nil, fmt.Errorf("store: audit log: %w", err)
			}
			conds = append(conds, c.cond)
			args = append(args, n)
		}
	}
	if f.Scoped {
		owned := `SELECT id FROM sandboxes WHERE owner = ?`
		args = append(args, f.Owner, f.Owner)
		if s.pg {
			// Owner rows of sandboxes on this host's kind of backend, and
			// the creates the log itself records (any backend).
			owned = `SELECT sandbox_id FROM sandbox_owners WHERE owner = ?
	UNION SELECT sandbox_id FROM audit WHERE action = '` + ActionSandboxCreate + `' AND key_id = ?`
			args = append(args, f.Owner)
		}
		conds = append(conds, `(key_id = ? OR sandbox_id IN (`+owned+`))`)
	}
	q := `SELECT id, time, key_id, sandbox_id, action, detail FROM audit`
	if len(conds) > 0 {
		q += ` WHERE ` + strings.Join(conds, ` AND `)
	}
	q += ` ORDER BY id DESC`
	if f.Limit > 0 {
		q += ` LIMIT ?`
		args = append(args, f.Limit)
	}
	rows, err := s.kr.QueryContext(ctx, s.q(q), args...)
	if err != nil {
		return nil, fmt.Errorf("store: audit log: %w", err)
	}
	defer rows.Close()
	out := []AuditEvent{}
	for rows.Next() {
		var (
			e      AuditEvent
			t      int64
			detail sql.NullString
		)
		if err := rows.Scan(&e.ID, &t, &e.KeyID, &e.SandboxID, &e.Action, &detail); err != nil {
			return nil, fmt.Errorf("store: audit log: %w", err)
		}
		e.Time = fromNanos(t)
		if detail.Valid {
			e.Detail = json.RawMessage(detail.String)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: audit log: %w", err)
	}
	return out, nil
}

// Connections returns the newest connections of a sandbox, newest first; a
// limit of 0 means all. The result is never nil.
func (s *Store) Connections(ctx context.Context, sandboxID string, limit int) ([]Connection, error) {
	if limit < 0 {
		return nil, fmt.Errorf("store: connections of %q: negative limit %d", sandboxID, limit)
	}
	q := `SELECT sandbox_id, time, host, port, allowed, reason, bytes_up, bytes_down, duration_ms
FROM network_log WHERE sandbox_id = ? ORDER BY id DESC`
	args := []any{sandboxID}
	if limit > 0 {
		q += ` LIMIT ?`
		args = append(args, limit)
	}
	rows, err := s.kr.QueryContext(ctx, s.q(q), args...)
	if err != nil {
		return nil, fmt.Errorf("store: connections of %q: %w", sandboxID, err)
	}
	defer rows.Close()
	out := []Connection{}
	for rows.Next() {
		var (
			c      Connection
			t, dur int64
		)
		if err := rows.Scan(&c.SandboxID, &t, &c.Host, &c.Port, &c.Allowed, &c.Reason,
			&c.BytesUp, &c.BytesDown, &dur); err != nil {
			return nil, fmt.Errorf("store: connections of %q: %w", sandboxID, err)
		}
		c.Time = fromNanos(t)
		c.Duration = time.Duration(dur) * time.Millisecond
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: connections of %q: %w", sandboxID, err)
	}
	return out, nil
}
