package agent

import (
	"bytes"
	"context"
)

// FrameWatch watches a directory with inotify: the agent answers Started
// once the watch is in place, then Items frames of WatchEvent lines, until
// the host resets the stream or the directory goes away (Result).
const FrameWatch FrameType = 0x40

func init() { frameNames[FrameWatch] = "watch" }

// The operations of a WatchEvent.
const (
	WatchCreate = "create" // created, or moved in
	WatchWrite  = "write"  // written to
	WatchRemove = "remove" // deleted
	WatchRename = "rename" // moved away (its new name, if watched, is a create)
	WatchChmod  = "chmod"  // mode, owner or times changed
)

// MaxWatchDirs bounds the directories one recursive watch follows.
const MaxWatchDirs = 4096

// WatchEvent is one change in a watched directory.
type WatchEvent struct {
	// Op is WatchCreate, WatchWrite, WatchRemove, WatchRename or
	// WatchChmod.
	Op string `json:"op"`
	// Path is the absolute path of what changed.
	Path string `json:"path"`
}

// watchMsg is the Watch request.
type watchMsg struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
}

// Watch is a running directory watch.
type Watch struct {
	s      *cstream
	ctx    context.Context
	cancel context.CancelFunc
	events chan WatchEvent
	err    error // set by the pump before events is closed
}

// Watch starts watching dir (relative to the agent's home if relative),
// and its subdirectories if recursive, with inotify inside the sandbox. It
// returns once the watch is in place, so that every change made after it
// returns is reported.
func (c *Client) Watch(ctx context.Context, dir string, recursive bool) (*Watch, error) {
	s, err := c.openStarted(ctx, FrameWatch, watchMsg{Path: dir, Recursive: recursive}, "watch")
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.Background())
	w := &Watch{s: s, ctx: wctx, cancel: cancel, events: make(chan WatchEvent, 64)}
	go w.pump()
	return w, nil
}

// Events returns the changes as they happen; the channel is closed when
// the watch ends (then Err says why).
func (w *Watch) Events() <-chan WatchEvent { return w.events }

// Err is why the watch ended: nil if the directory went away, ErrDetached
// after Close, or the failure. Valid once Events is closed.
func (w *Watch) Err() error { return w.err }

// Close stops the watch.
func (w *Watch) Close() {
	w.cancel()
	w.s.reset()
}

func (w *Watch) pump() {
	defer close(w.events)
	for {
		f, err := w.s.next(w.ctx)
		if err != nil {
			if w.ctx.Err() != nil {
				err = ErrDetached
			}
			w.err = err
			return
		}
		switch f.Type {
		case FrameItems:
			for _, line := range bytes.Split(bytes.TrimRight(f.Payload, "\n"), []byte{'\n'}) {
				var ev WatchEvent
				if err := decodeJSON(line, &ev); err != nil {
					w.err = protoErr("bad watch event: %v", err)
					w.s.reset()
					return
				}
				select {
				case w.events <- ev:
				case <-w.ctx.Done():
					w.err = ErrDetached
					return
				}
			}
			w.s.consumed(len(f.Payload))
		case FrameResult:
			return
		case FrameError:
			w.err = decodeError(f.Payload)
			return
		default:
			w.err = protoErr("unexpected %s frame on a watch stream", f.Type)
			w.s.reset()
			return
		}
	}
}
