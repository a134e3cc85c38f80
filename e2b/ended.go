package e2b

import (
	"context"
	"time"

	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/store"
)

// endWait bounds how long a failed call waits for its sandbox to be
// recorded as ended: the agent's connection closes as a kill begins, a
// moment before the manager has recorded it.
const endWait = 2 * time.Second

// sandboxEnded explains a lost agent connection by the sandbox's end, as
// E2B's SDK users expect to be told: "the sandbox sb-... was killed". It
// returns "" if the sandbox has not ended within endWait (the connection
// was lost for another reason).
func (h *Handler) sandboxEnded(ctx context.Context, sb *manager.Sandbox) string {
	t := time.NewTimer(endWait)
	defer t.Stop()
	select {
	case <-sb.Ended():
	case <-t.C:
		return ""
	case <-ctx.Done():
		return ""
	}
	what := "ended"
	if in, err := h.m.Get(context.WithoutCancel(ctx), sb.Owner(), sb.ID); err == nil {
		switch in.State {
		case store.StateKilled:
			what = "was killed"
		case store.StateExpired:
			what = "timed out (its timeout ended; extend it with setTimeout)"
		case store.StateLost, store.StateExited:
			what = "ended unexpectedly (" + in.EndReason + ")"
		}
	}
	return "the sandbox " + sb.ID + " " + what
}
