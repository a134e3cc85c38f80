// Package computer performs computer-use actions on sandboxes for airlock's
// front ends (the HTTP API's /computer route and the MCP computer tool):
// the action is audited first (no record, no action),
// then done by the sandbox's agent (agent.ComputerAction). A sandbox of
// the desktop image whose display is not running yet gets it started
// first: the image's /usr/local/bin/airlock-desktop, run as a background
// process of the sandbox like any other.
package computer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/approval"
	"github.com/airlock-dev/airlock/manager"
)

// Action is the audit action of a computer-use call ("computer.left_click").
func Action(a agent.ComputerAction) string { return "computer." + a.Action }

// StartScript is the desktop image's start script.
const StartScript = "/usr/local/bin/airlock-desktop"

// StartTimeout bounds the wait for a started desktop's display.
const StartTimeout = 90 * time.Second

// Detail is what the audit log records of an action: never the text
// typed (it may be a secret), only its length.
func Detail(via string, a agent.ComputerAction) map[string]any {
	d := map[string]any{"via": via, "action": a.Action}
	if a.Coordinate != nil {
		d["coordinate"] = []int{a.Coordinate.X, a.Coordinate.Y}
	}
	if a.StartCoordinate != nil {
		d["start_coordinate"] = []int{a.StartCoordinate.X, a.StartCoordinate.Y}
	}
	switch a.Action {
	case agent.ActionType:
		d["text_bytes"] = len(a.Text)
	case agent.ActionKey, agent.ActionHoldKey:
		d["keys"] = a.Text
	}
	return d
}

var starting singleflight.Group

// Do performs a on sb, starting the desktop first if the image has one and
// its display is not running. The caller has audited the action.
func Do(ctx context.Context, sb *manager.Sandbox, a agent.ComputerAction) (*agent.ComputerResult, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	res, err := sb.Agent().Computer(ctx, a)
	if !noDisplay(err) || a.Display != "" && a.Display != ":0" {
		return res, err
	}
	if _, serr := sb.Agent().Stat(ctx, StartScript); serr != nil {
		return nil, fmt.Errorf("%w (this sandbox's image has no %s: create it from the desktop image, or start an X display on :0 yourself)", err, StartScript)
	}
	if _, err, _ := starting.Do(sb.ID, func() (any, error) { return nil, start(ctx, sb) }); err != nil {
		return nil, err
	}
	return sb.Agent().Computer(ctx, a)
}

// Warm starts the desktop of sb if its image has one (StartScript) and
// waits for its display: what a warm pool does to a desktop image's
// sandboxes before handing them out, so that the first action does not
// wait for X and the session to start. A sandbox whose image has no
// desktop is left as it is.
func Warm(ctx context.Context, sb *manager.Sandbox) error {
	if _, err := sb.Agent().Stat(ctx, StartScript); err != nil {
		return nil
	}
	_, err, _ := starting.Do(sb.ID, func() (any, error) { return nil, start(ctx, sb) })
	return err
}

func noDisplay(err error) bool {
	var ae *agent.Error
	return errors.As(err, &ae) && ae.Code == agent.CodeNoDisplay
}

// start runs the start script in the background and waits for the
// display to answer.
func start(ctx context.Context, sb *manager.Sandbox) error {
	probe := agent.ComputerAction{Action: agent.ActionScreenSize}
	if _, err := sb.Agent().Computer(ctx, probe); !noDisplay(err) {
		return err // another call started it meanwhile
	}
	p, err := sb.Agent().Exec(ctx, agent.ExecRequest{Argv: []string{StartScript}, Background: true, Tag: "airlock-desktop"})
	if err != nil {
		return fmt.Errorf("starting the desktop: %w", err)
	}
	p.Close() // detach: it keeps running
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	for {
		_, err := sb.Agent().Computer(ctx, probe)
		if !noDisplay(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the desktop's display did not come up in %v: %w", StartTimeout, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ApprovalAction describes a for the approval policy (package approval)
// on sb. A rule that looks at the focused window's title has it read
// (action active_window) and a then made to expect that very window
// (agent.ComputerAction.ExpectWindow): an action approved, or let
// through, for one window does nothing if another has the focus by the
// time it acts. The caller sets Owner and Via.
func ApprovalAction(sb *manager.Sandbox, a *agent.ComputerAction) approval.Action {
	act := approval.Action{Kind: approval.KindComputer, Sandbox: sb.ID, ComputerAction: a.Action}
	switch a.Action {
	case agent.ActionType:
		act.TextBytes = len(a.Text)
	case agent.ActionKey, agent.ActionHoldKey:
		act.Keys = a.Text
	}
	act.WindowOf = func(ctx context.Context) (string, error) {
		res, err := Do(ctx, sb, agent.ComputerAction{Action: agent.ActionActiveWindow, Display: a.Display})
		if err != nil {
			return "", err
		}
		if res.Window == nil {
			return "", errors.New("the agent answered no window")
		}
		w := *res.Window
		a.ExpectWindow = &w
		return w.Title, nil
	}
	return act
}
