package e2b

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/manager"
)

// A template built from the SDK may have a start command (setStartCmd),
// run in the background in every sandbox made from it, and a ready
// command, run until it succeeds before the create answers. airlock's
// images carry no such thing, so the E2B layer records them per key and
// template, bound to the built image's digest: a template rebuilt or
// replaced by other means is not given commands it was not built with.

// readyTimeout bounds waiting for a template's ready command.
const readyTimeout = 2 * time.Minute

// startSpec is a template's start and ready commands.
type startSpec struct {
	Digest   string `json:"digest"`
	StartCmd string `json:"start_cmd,omitempty"`
	ReadyCmd string `json:"ready_cmd,omitempty"`
}

// startSpecPath is where owner's template name's commands are recorded.
func (h *Handler) startSpecPath(owner, name string) string {
	sum := sha256.Sum256([]byte(owner + "\x00" + name))
	return filepath.Join(h.tmplDir, hex.EncodeToString(sum[:16])+".json")
}

// saveStartSpec records the commands of owner's template name, built as
// digest.
func (h *Handler) saveStartSpec(owner, name string, spec startSpec) error {
	p := h.startSpecPath(owner, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	b, _ := json.Marshal(spec)
	return writeFileAtomic(p, b)
}

// startSpecFor returns the commands of owner's template name if the image
// the name now resolves to is the one built with them.
func (h *Handler) startSpecFor(owner, name string) (startSpec, bool) {
	if h.tmplDir == "" || h.m.Images() == nil {
		return startSpec{}, false
	}
	b, err := os.ReadFile(h.startSpecPath(owner, name))
	if err != nil {
		return startSpec{}, false
	}
	var spec startSpec
	if json.Unmarshal(b, &spec) != nil {
		return startSpec{}, false
	}
	img, err := h.m.Images().As(owner).Get(name)
	if err != nil || img.Digest != spec.Digest {
		return startSpec{}, false
	}
	return spec, spec.StartCmd != "" || spec.ReadyCmd != ""
}

// startTemplate runs a new sandbox's start command in the background, in
// home (boxState.homeDir), and waits for its ready command to succeed. An error means the sandbox is
// not ready; the caller kills it.
func startTemplate(ctx context.Context, sb *manager.Sandbox, home string, spec startSpec) error {
	ag := sb.Agent()
	if spec.StartCmd != "" {
		p, err := ag.Exec(ctx, agent.ExecRequest{Shell: spec.StartCmd, Cwd: home, Background: true, Tag: "e2b-start"})
		if err != nil {
			return fmt.Errorf("start command: %w", err)
		}
		p.Close()
	}
	if spec.ReadyCmd == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	var last string
	for {
		p, err := ag.Exec(ctx, agent.ExecRequest{Shell: spec.ReadyCmd, Cwd: home, Tag: "e2b-ready"})
		if err == nil {
			out, stderr, _, st, cerr := p.Collect(ctx, 4096)
			p.Close()
			if cerr == nil && st.Code == 0 && st.Signal == "" {
				return nil
			}
			last = string(out) + string(stderr)
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return apiErrorf(http.StatusGatewayTimeout, "the template's ready command did not succeed within %s (last output: %q)", readyTimeout, last)
			}
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
