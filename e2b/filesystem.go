package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/agent"
)

// envd's filesystem.Filesystem service over the agent. Paths are
// translated between /home/user and the workspace (see paths.go).

// entryFor describes a sandbox file in envd's terms. Like envd, mode holds
// the permission bits and permissions the full ls-style string.
func entryFor(fi agent.FileInfo) entryInfo {
	mode := fi.Mode
	e := entryInfo{Name: fi.Name, Path: fromSandbox(fi.Path), Size: pbInt64(fi.Size), Mode: uint32(fi.Mode.Perm()),
		Owner: fi.Owner, Group: fi.Group, Metadata: fi.Metadata}
	switch fi.Type {
	case agent.TypeFile:
		e.Type = pbFileType(fileTypeFile)
	case agent.TypeDir:
		e.Type = pbFileType(fileTypeDirectory)
		mode |= os.ModeDir
	case agent.TypeSymlink:
		e.Type = pbFileType(fileTypeSymlink)
		mode |= os.ModeSymlink
		// As envd, the target as an absolute path: a relative one is
		// relative to the link's directory.
		t := fi.Target
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(fi.Path), t)
		}
		t = fromSandbox(path.Clean(t))
		e.SymlinkTarget = &t
	default:
		e.Type = pbFileType(fileTypeUnspecified)
		mode |= os.ModeIrregular
	}
	e.Permissions = mode.String()
	if !fi.ModTime.IsZero() {
		t := pbTime(fi.ModTime)
		e.ModifiedTime = &t
	}
	return e
}

func (h *Handler) fsStat(ctx context.Context, c *rpcCall, b *boxState, body []byte) (any, error) {
	req, err := rpcRequest[pathRequest](c, body)
	if err != nil {
		return nil, err
	}
	p, cerr := fileTarget(req.Path)
	if cerr != nil {
		return nil, cerr
	}
	fi, err := b.sb.Agent().Stat(ctx, p)
	if err != nil {
		return nil, agentRPCError(err)
	}
	e := entriesFor(ctx, c.r, b.sb.Agent(), []agent.FileInfo{fi})[0]
	return &entryResponse{Entry: &e}, nil
}

func (h *Handler) fsListDir(ctx context.Context, c *rpcCall, b *boxState, body []byte) (any, error) {
	req, err := rpcRequest[listDirRequest](c, body)
	if err != nil {
		return nil, err
	}
	p, cerr := fileTarget(req.Path)
	if cerr != nil {
		return nil, cerr
	}
	depth := int(req.Depth)
	if depth == 0 {
		depth = 1
	}
	if depth > 64 {
		return nil, errorf(CodeInvalidArgument, "depth %d is above the maximum of 64", depth)
	}
	list, err := b.sb.Agent().List(ctx, p, depth)
	if err != nil {
		return nil, agentRPCError(err)
	}
	return &listDirResponse{Entries: entriesFor(ctx, c.r, b.sb.Agent(), list)}, nil
}

func (h *Handler) fsMakeDir(ctx context.Context, c *rpcCall, b *boxState, body []byte) (any, error) {
	req, err := rpcRequest[pathRequest](c, body)
	if err != nil {
		return nil, err
	}
	p, cerr := fileTarget(req.Path)
	if cerr != nil {
		return nil, cerr
	}
	ag := b.sb.Agent()
	// envd reports an existing directory as AlreadyExists (the SDKs'
	// makeDir then returns false) and an existing file as invalid.
	if fi, err := ag.Stat(ctx, p); err == nil {
		if fi.Type == agent.TypeDir {
			return nil, errorf(CodeAlreadyExists, "directory already exists: %s", fromSandbox(p))
		}
		return nil, errorf(CodeInvalidArgument, "path already exists but it is not a directory: %s", fromSandbox(p))
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, agentRPCError(err)
	}
	if err := ag.Mkdir(ctx, p); err != nil {
		return nil, agentRPCError(err)
	}
	return &entryResponse{Entry: &entryInfo{Name: path.Base(p), Type: pbFileType(fileTypeDirectory), Path: fromSandbox(p)}}, nil
}

func (h *Handler) fsMove(ctx context.Context, c *rpcCall, b *boxState, body []byte) (any, error) {
	req, err := rpcRequest[moveRequest](c, body)
	if err != nil {
		return nil, err
	}
	from, cerr := fileTarget(req.Source)
	if cerr != nil {
		return nil, cerr
	}
	to, cerr := fileTarget(req.Destination)
	if cerr != nil {
		return nil, cerr
	}
	ag := b.sb.Agent()
	// Like envd, create the destination's parent directories.
	if dir := path.Dir(to); dir != to {
		if _, err := ag.Stat(ctx, dir); errors.Is(err, os.ErrNotExist) {
			if err := ag.Mkdir(ctx, dir); err != nil {
				return nil, agentRPCError(err)
			}
		}
	}
	if err := h.m.AuditFirst(ctx, b.sb.Owner(), b.sb.ID, "file.move", map[string]string{"from": from, "to": to, "via": "e2b"}); err != nil {
		return nil, auditError(err)
	}
	if err := ag.Move(ctx, from, to); err != nil {
		return nil, agentRPCError(err)
	}
	fi, err := ag.Stat(ctx, to)
	if err != nil {
		return nil, agentRPCError(err)
	}
	e := entriesFor(ctx, c.r, ag, []agent.FileInfo{fi})[0]
	return &entryResponse{Entry: &e}, nil
}

func (h *Handler) fsRemove(ctx context.Context, c *rpcCall, b *boxState, body []byte) (any, error) {
	req, err := rpcRequest[pathRequest](c, body)
	if err != nil {
		return nil, err
	}
	p, cerr := fileTarget(req.Path)
	if cerr != nil {
		return nil, cerr
	}
	for _, r := range fileRoots {
		if p == r {
			return nil, errorf(CodeInvalidArgument, "refusing to remove %s itself", fromSandbox(p))
		}
	}
	if err := h.m.AuditFirst(ctx, b.sb.Owner(), b.sb.ID, "file.remove", map[string]string{"path": p, "via": "e2b"}); err != nil {
		return nil, auditError(err)
	}
	// envd removes with os.RemoveAll: a missing path is not an error.
	if err := b.sb.Agent().Remove(ctx, p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, agentRPCError(err)
	}
	return &empty{}, nil
}

// Directory watching: the agent watches with inotify inside the sandbox
// (agent.Client.Watch), recursively if asked, and its events are passed on
// as envd's: a file created and written is a create then writes, a rename
// is a rename of the old name and a create of the new one.
const (
	maxWatchers     = 16
	maxQueuedEvents = 10000
	watcherIdle     = 30 * time.Minute
)

// watchOps maps the agent's operations to envd's event types.
var watchOps = map[string]int32{agent.WatchCreate: eventCreate, agent.WatchWrite: eventWrite,
	agent.WatchRemove: eventRemove, agent.WatchRename: eventRename, agent.WatchChmod: eventChmod}

// watcher is one watch of a directory.
type watcher struct {
	ag           *agent.Client
	aw           *agent.Watch
	dir          string
	recursive    bool
	includeEntry bool

	// For watchers created by CreateWatcher: queued events.
	mu       sync.Mutex
	queue    []filesystemEvent
	dropped  bool
	lastRead time.Time
	failed   *Error
	stopCh   chan struct{}
	stopOnce sync.Once
	// seq counts the events queued; last holds, per name and type, the
	// seq of the latest (see settle); arrived is closed and replaced at
	// each event.
	seq     uint64
	last    map[string]uint64
	arrived chan struct{}
}

// newWatcher starts watching; events made after it returns are reported.
func newWatcher(ctx context.Context, ag *agent.Client, req *watchRequest) (*watcher, *Error) {
	// Nothing in an airlock sandbox is a network mount:
	// allowNetworkMounts is accepted and means nothing.
	dir, cerr := fileTarget(req.Path)
	if cerr != nil {
		return nil, cerr
	}
	aw, err := ag.Watch(ctx, dir, req.Recursive)
	if err != nil {
		var ae *agent.Error
		if errors.As(err, &ae) && ae.Code == agent.CodeNotADirectory {
			return nil, errorf(CodeInvalidArgument, "path is not a directory: %s", fromSandbox(dir))
		}
		if errors.As(err, &ae) && ae.Code == agent.CodeTooLarge {
			return nil, errorf(CodeResourceExhausted, "%s", ae.Message)
		}
		return nil, agentRPCError(err)
	}
	return &watcher{ag: ag, aw: aw, dir: dir, recursive: req.Recursive, includeEntry: req.IncludeEntry,
		stopCh: make(chan struct{}), lastRead: time.Now(), last: map[string]uint64{}, arrived: make(chan struct{})}, nil
}

func (w *watcher) stop() {
	w.stopOnce.Do(func() {
		close(w.stopCh)
		w.aw.Close()
	})
}

// event converts one of the agent's events.
func (w *watcher) event(ctx context.Context, ev agent.WatchEvent) filesystemEvent {
	out := filesystemEvent{Name: strings.TrimPrefix(ev.Path, w.dir+"/"), Type: pbEventType(watchOps[ev.Op])}
	if w.includeEntry && ev.Op != agent.WatchRemove && ev.Op != agent.WatchRename {
		if fi, err := w.ag.Stat(ctx, ev.Path); err == nil {
			e := entryFor(fi)
			out.Entry = &e
		}
	}
	return out
}

// ended explains why the agent's watch ended.
func (w *watcher) ended() *Error {
	if err := w.aw.Err(); err != nil {
		var ae *agent.Error
		if errors.As(err, &ae) && ae.Code == agent.CodeTooLarge {
			return errorf(CodeResourceExhausted, "%s", ae.Message)
		}
		return agentRPCError(err)
	}
	return errorf(CodeNotFound, "the watched directory %s was removed or moved", fromSandbox(w.dir))
}

func (h *Handler) fsWatchDir(ctx context.Context, c *rpcCall, b *boxState, body []byte, send func(any) error) error {
	if e := rpcUser(c.r); e != nil {
		return e
	}
	var req watchRequest
	if err := decodeMessage(body, &req); err != nil {
		return err
	}
	w, cerr := newWatcher(ctx, b.sb.Agent(), &req)
	if cerr != nil {
		return cerr
	}
	defer w.stop()
	if err := send(&watchDirResponse{Start: &empty{}}); err != nil {
		return err
	}
	keep := time.NewTicker(keepaliveInterval(c.r.Header))
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-b.sb.Ended():
			return errorf(CodeUnavailable, "the sandbox ended")
		case <-keep.C:
			if err := send(&watchDirResponse{Keepalive: &empty{}}); err != nil {
				return err
			}
		case ev, ok := <-w.aw.Events():
			if !ok {
				return w.ended()
			}
			fe := w.event(ctx, ev)
			if err := send(&watchDirResponse{Filesystem: &fe}); err != nil {
				return err
			}
		}
	}
}

func (h *Handler) fsCreateWatcher(ctx context.Context, c *rpcCall, b *boxState, body []byte) (any, error) {
	req, err := rpcRequest[watchRequest](c, body)
	if err != nil {
		return nil, err
	}
	var idb [12]byte
	rand.Read(idb[:])
	id := hex.EncodeToString(idb[:])
	b.mu.Lock()
	n := len(b.watchers)
	b.mu.Unlock()
	if n >= maxWatchers {
		return nil, errorf(CodeResourceExhausted, "at most %d watchers per sandbox", maxWatchers)
	}
	w, cerr := newWatcher(ctx, b.sb.Agent(), req)
	if cerr != nil {
		return nil, cerr
	}
	b.mu.Lock()
	if len(b.watchers) >= maxWatchers {
		b.mu.Unlock()
		w.stop()
		return nil, errorf(CodeResourceExhausted, "at most %d watchers per sandbox", maxWatchers)
	}
	b.watchers[id] = w
	b.mu.Unlock()
	go func() {
		failed := false
		defer func() {
			w.stop()
			// A failed watcher stays listed so that GetWatcherEvents can
			// report why, until it is removed.
			if failed {
				return
			}
			b.mu.Lock()
			if b.watchers[id] == w {
				delete(b.watchers, id)
			}
			b.mu.Unlock()
		}()
		idle := time.NewTicker(time.Minute)
		defer idle.Stop()
		for {
			select {
			case <-w.stopCh:
				return
			case <-b.sb.Ended():
				return
			case <-idle.C:
				w.mu.Lock()
				gone := time.Since(w.lastRead) > watcherIdle
				w.mu.Unlock()
				if gone {
					return
				}
			case ev, ok := <-w.aw.Events():
				if !ok {
					w.mu.Lock()
					w.failed, failed = w.ended(), true
					w.mu.Unlock()
					return
				}
				sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				fe := w.event(sctx, ev)
				cancel()
				w.mu.Lock()
				w.queue = append(w.queue, fe)
				if n := len(w.queue); n > maxQueuedEvents {
					w.queue = append(w.queue[:0], w.queue[n-maxQueuedEvents:]...)
					w.dropped = true
				}
				w.seq++
				if len(w.last) >= maxQueuedEvents {
					clear(w.last)
				}
				w.last[ev.Op+"\x00"+ev.Path] = w.seq
				close(w.arrived)
				w.arrived = make(chan struct{})
				w.mu.Unlock()
			}
		}
	}()
	return &createWatcherResponse{WatcherID: id}, nil
}

// settleWait bounds how long a write waits for the polling watchers that
// cover its file to have queued its events.
const settleWait = 2 * time.Second

// covers reports whether the watcher reports events of sandbox path p.
func (w *watcher) covers(p string) bool {
	rel, ok := strings.CutPrefix(p, w.dir+"/")
	return ok && rel != "" && (w.recursive || !strings.Contains(rel, "/"))
}

// watchMark is where each polling watcher of a box stood before a write.
type watchMark map[*watcher]uint64

// markWatchers notes the polling watchers that cover sandbox path p, and
// how many events each had queued, before a write of p.
func (b *boxState) markWatchers(p string) watchMark {
	b.mu.Lock()
	ws := make([]*watcher, 0, len(b.watchers))
	for _, w := range b.watchers {
		if w.covers(p) {
			ws = append(ws, w)
		}
	}
	b.mu.Unlock()
	m := watchMark{}
	for _, w := range ws {
		w.mu.Lock()
		m[w] = w.seq
		w.mu.Unlock()
	}
	return m
}

// settle waits, up to settleWait, until each watcher of m has queued the
// last event of the write of sandbox path p that has just returned: its
// write (a file with content) or, for an empty one, its write or mode
// change. The kernel queues a write's events before the write returns,
// but the agent relays them on its own time; without this, the Python
// SDK's get_new_events() right after files.write() could miss some (E2B's
// envd reports them synchronously).
func (m watchMark) settle(ctx context.Context, p string, empty bool) {
	if len(m) == 0 {
		return
	}
	ops := []string{agent.WatchWrite}
	if empty {
		ops = append(ops, agent.WatchChmod)
	}
	t := time.NewTimer(settleWait)
	defer t.Stop()
	for w, mark := range m {
		for {
			w.mu.Lock()
			done := false
			for _, op := range ops {
				done = done || w.last[op+"\x00"+p] > mark
			}
			arrived := w.arrived
			w.mu.Unlock()
			if done {
				break
			}
			select {
			case <-arrived:
				continue
			case <-w.stopCh:
			case <-t.C:
				return
			case <-ctx.Done():
				return
			}
			break
		}
	}
}

func (h *Handler) fsGetWatcherEvents(ctx context.Context, b *boxState, body []byte) (any, error) {
	var req watcherIDRequest
	if err := decodeMessage(body, &req); err != nil {
		return nil, err
	}
	b.mu.Lock()
	w := b.watchers[req.WatcherID]
	b.mu.Unlock()
	if w == nil {
		return nil, errorf(CodeNotFound, "watcher %q not found", req.WatcherID)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed != nil && len(w.queue) == 0 {
		return nil, w.failed
	}
	if w.dropped {
		w.dropped = false
		return nil, errorf(CodeResourceExhausted, "more than %d events were queued; the oldest were dropped", maxQueuedEvents)
	}
	w.lastRead = time.Now()
	out := getWatcherEventsResponse{Events: w.queue}
	w.queue = nil
	return &out, nil
}

func (h *Handler) fsRemoveWatcher(ctx context.Context, b *boxState, body []byte) (any, error) {
	var req watcherIDRequest
	if err := decodeMessage(body, &req); err != nil {
		return nil, err
	}
	b.mu.Lock()
	w := b.watchers[req.WatcherID]
	delete(b.watchers, req.WatcherID)
	b.mu.Unlock()
	if w == nil {
		return nil, errorf(CodeNotFound, "watcher %q not found", req.WatcherID)
	}
	w.stop()
	return &empty{}, nil
}

// rpcRequest checks the caller's user name and decodes an RPC's message.
func rpcRequest[T any](c *rpcCall, body []byte) (*T, error) {
	if e := rpcUser(c.r); e != nil {
		return nil, e
	}
	req := new(T)
	if err := decodeMessage(body, req); err != nil {
		return nil, err
	}
	return req, nil
}
