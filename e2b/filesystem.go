package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"airlock/agent"
)

// envd's filesystem.Filesystem service over the agent. Paths are
// translated between /home/user and the workspace (see paths.go).

// entryFor describes a sandbox file in envd's terms. Like envd, mode holds
// the permission bits and permissions the full ls-style string.
func entryFor(fi agent.FileInfo) entryInfo {
	mode := fi.Mode
	e := entryInfo{Name: fi.Name, Path: fromSandbox(fi.Path), Size: pbInt64(fi.Size), Mode: uint32(fi.Mode.Perm()),
		Owner: fi.Owner, Group: fi.Group}
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
	e := entryFor(fi)
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
	out := listDirResponse{Entries: make([]entryInfo, 0, len(list))}
	for _, fi := range list {
		out.Entries = append(out.Entries, entryFor(fi))
	}
	return &out, nil
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
	e := entryFor(fi)
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

// Directory watching. The agent has no inotify, so a watcher polls: it
// lists the directory (recursively if asked) and reports the differences
// from the previous listing as events: new paths are created, vanished ones
// removed, a changed size or modification time is a write and a changed
// mode a chmod. A rename shows as a remove and a create; changes that undo
// themselves between two polls are not seen.
const (
	watchInterval   = 250 * time.Millisecond
	maxWatchEntries = 10000
	maxWatchers     = 16
	maxQueuedEvents = 10000
	watcherIdle     = 30 * time.Minute
)

// watchState is what a poll remembers of an entry.
type watchState struct {
	typ   string
	size  int64
	mtime time.Time
	mode  os.FileMode
}

// watcher polls one directory.
type watcher struct {
	ag           *agent.Client
	dir          string
	depth        int
	includeEntry bool
	last         map[string]watchState

	// For watchers created by CreateWatcher: queued events.
	mu       sync.Mutex
	queue    []filesystemEvent
	dropped  bool
	lastRead time.Time
	failed   *Error
	stopCh   chan struct{}
	stopOnce sync.Once
}

func newWatcher(ag *agent.Client, req *watchRequest) (*watcher, *Error) {
	if req.AllowNetworkMounts {
		// Nothing in an airlock sandbox is a network mount; accepted as a
		// no-op.
		req.AllowNetworkMounts = false
	}
	dir, cerr := fileTarget(req.Path)
	if cerr != nil {
		return nil, cerr
	}
	depth := 1
	if req.Recursive {
		depth = 64
	}
	return &watcher{ag: ag, dir: dir, depth: depth, includeEntry: req.IncludeEntry,
		stopCh: make(chan struct{}), lastRead: time.Now()}, nil
}

func (w *watcher) stop() { w.stopOnce.Do(func() { close(w.stopCh) }) }

// poll lists the directory and returns the events since the last poll.
func (w *watcher) poll(ctx context.Context) ([]filesystemEvent, *Error) {
	list, err := w.ag.List(ctx, w.dir, w.depth)
	if err != nil {
		var ae *agent.Error
		if errors.As(err, &ae) && ae.Code == agent.CodeNotADirectory {
			return nil, errorf(CodeInvalidArgument, "path is not a directory: %s", fromSandbox(w.dir))
		}
		return nil, agentRPCError(err)
	}
	if len(list) > maxWatchEntries {
		return nil, errorf(CodeResourceExhausted, "%s holds more than %d entries: too many to watch by polling", fromSandbox(w.dir), maxWatchEntries)
	}
	now := make(map[string]watchState, len(list))
	infos := make(map[string]agent.FileInfo, len(list))
	for _, fi := range list {
		now[fi.Path] = watchState{typ: fi.Type, size: fi.Size, mtime: fi.ModTime, mode: fi.Mode}
		infos[fi.Path] = fi
	}
	if w.last == nil {
		w.last = now
		return nil, nil
	}
	var evs []filesystemEvent
	add := func(p string, t int32) {
		ev := filesystemEvent{Name: strings.TrimPrefix(p, w.dir+"/"), Type: pbEventType(t)}
		if fi, ok := infos[p]; ok && w.includeEntry {
			e := entryFor(fi)
			ev.Entry = &e
		}
		evs = append(evs, ev)
	}
	paths := make([]string, 0, len(now))
	for p := range now {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		cur := now[p]
		old, ok := w.last[p]
		switch {
		case !ok || old.typ != cur.typ:
			if ok {
				add(p, eventRemove)
			}
			add(p, eventCreate)
		case old.size != cur.size || !old.mtime.Equal(cur.mtime):
			add(p, eventWrite)
		case old.mode != cur.mode:
			add(p, eventChmod)
		}
	}
	var gone []string
	for p := range w.last {
		if _, ok := now[p]; !ok {
			gone = append(gone, p)
		}
	}
	sort.Strings(gone)
	for _, p := range gone {
		add(p, eventRemove)
	}
	w.last = now
	return evs, nil
}

func (h *Handler) fsWatchDir(ctx context.Context, c *rpcCall, b *boxState, body []byte, send func(any) error) error {
	if e := rpcUser(c.r); e != nil {
		return e
	}
	var req watchRequest
	if err := decodeMessage(body, &req); err != nil {
		return err
	}
	w, cerr := newWatcher(b.sb.Agent(), &req)
	if cerr != nil {
		return cerr
	}
	if _, cerr := w.poll(ctx); cerr != nil {
		return cerr
	}
	if err := send(&watchDirResponse{Start: &empty{}}); err != nil {
		return err
	}
	keep := keepaliveInterval(c.r.Header)
	lastSent := time.Now()
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-b.sb.Ended():
			return errorf(CodeUnavailable, "the sandbox ended")
		case <-t.C:
		}
		evs, cerr := w.poll(ctx)
		if cerr != nil {
			return cerr
		}
		for i := range evs {
			if err := send(&watchDirResponse{Filesystem: &evs[i]}); err != nil {
				return err
			}
			lastSent = time.Now()
		}
		if time.Since(lastSent) >= keep {
			if err := send(&watchDirResponse{Keepalive: &empty{}}); err != nil {
				return err
			}
			lastSent = time.Now()
		}
	}
}

func (h *Handler) fsCreateWatcher(ctx context.Context, c *rpcCall, b *boxState, body []byte) (any, error) {
	req, err := rpcRequest[watchRequest](c, body)
	if err != nil {
		return nil, err
	}
	w, cerr := newWatcher(b.sb.Agent(), req)
	if cerr != nil {
		return nil, cerr
	}
	if _, cerr := w.poll(ctx); cerr != nil {
		return nil, cerr
	}
	var idb [12]byte
	rand.Read(idb[:])
	id := hex.EncodeToString(idb[:])
	b.mu.Lock()
	if len(b.watchers) >= maxWatchers {
		b.mu.Unlock()
		return nil, errorf(CodeResourceExhausted, "at most %d watchers per sandbox", maxWatchers)
	}
	b.watchers[id] = w
	b.mu.Unlock()
	go func() {
		failed := false
		defer func() {
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
		t := time.NewTicker(watchInterval)
		defer t.Stop()
		for {
			select {
			case <-w.stopCh:
				return
			case <-b.sb.Ended():
				return
			case <-t.C:
			}
			w.mu.Lock()
			idle := time.Since(w.lastRead) > watcherIdle
			w.mu.Unlock()
			if idle {
				return
			}
			pctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			evs, cerr := w.poll(pctx)
			cancel()
			w.mu.Lock()
			if cerr != nil {
				w.failed, failed = cerr, true
				w.mu.Unlock()
				return
			}
			w.queue = append(w.queue, evs...)
			if n := len(w.queue); n > maxQueuedEvents {
				w.queue = append(w.queue[:0], w.queue[n-maxQueuedEvents:]...)
				w.dropped = true
			}
			w.mu.Unlock()
		}
	}()
	return &createWatcherResponse{WatcherID: id}, nil
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
	if w.failed != nil {
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
