package approval

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/airlock-dev/airlock/agent"
)

// keyboardActions are the computer-use actions that send keys to the
// focused window: the ones a window title pattern looks at.
var keyboardActions = []string{agent.ActionType, agent.ActionKey, agent.ActionHoldKey}

// Keyboard reports whether the computer-use action sends keys to the
// focused window.
func Keyboard(action string) bool { return slices.Contains(keyboardActions, action) }

// compileComputer checks a rule's computer-use conditions.
func (r *Rule) compileComputer() error {
	window := r.WindowTitle != "" || r.WindowTitleGlob != ""
	if (r.ComputerAction != "" || window) && r.Action != KindComputer {
		return fmt.Errorf("computer_action and window title patterns apply to action %s only", KindComputer)
	}
	if r.WindowTitle != "" && r.WindowTitleGlob != "" {
		return errors.New("give at most one of window_title and window_title_glob")
	}
	if r.ComputerAction != "" && !slices.Contains(agent.ComputerActions, r.ComputerAction) {
		// Fail closed: a misspelt action would never match.
		return fmt.Errorf("unknown computer_action %q: give one of %s", r.ComputerAction, strings.Join(agent.ComputerActions, ", "))
	}
	if window && r.ComputerAction != "" && !Keyboard(r.ComputerAction) {
		return fmt.Errorf("a window title pattern applies to the keyboard actions (%s), not %s",
			strings.Join(keyboardActions, ", "), r.ComputerAction)
	}
	return nil
}

// needsWindow reports whether a rule looks at the focused window's title.
func (r *Rule) needsWindow() bool {
	return r.Action == KindComputer && (r.WindowTitle != "" || r.WindowTitleGlob != "")
}

// matchComputer reports whether computer rule r applies to a. A window
// pattern matches keyboard actions only, and one whose title could not be
// read (Action.WindowKnown false) always: fail closed.
func (r *Rule) matchComputer(a *Action) bool {
	if r.ComputerAction != "" && r.ComputerAction != a.ComputerAction {
		return false
	}
	if !r.needsWindow() {
		return true
	}
	if !Keyboard(a.ComputerAction) {
		return false
	}
	return !a.WindowKnown || r.re.MatchString(a.WindowTitle)
}

// resolveWindow fills in a's window title, through a.WindowOf, when a
// rule of policies would look at it.
func resolveWindow(ctx context.Context, a *Action, policies []*Policy) error {
	if a.Kind != KindComputer || a.WindowKnown || a.WindowOf == nil || !Keyboard(a.ComputerAction) {
		return nil
	}
	need := false
	for _, p := range policies {
		if p == nil {
			continue
		}
		for _, list := range [][]Rule{p.Deny, p.Require} {
			for i := range list {
				need = need || list[i].needsWindow()
			}
		}
	}
	if !need {
		return nil
	}
	title, err := a.WindowOf(ctx)
	if err != nil {
		return &Error{Code: CodeDenied, Msg: fmt.Sprintf("approval_denied: %s: the focused window's title, which the approval policy looks at, cannot be read: %v", a.Summary(), err)}
	}
	a.WindowTitle, a.WindowKnown = title, true
	return nil
}

// computerSummary describes a computer-use action for a human: never the
// text typed, only its length.
func computerSummary(a *Action, on string) string {
	var what string
	switch a.ComputerAction {
	case agent.ActionType:
		what = fmt.Sprintf("type %d bytes of text", a.TextBytes)
	case agent.ActionKey, agent.ActionHoldKey:
		what = fmt.Sprintf("press %q (%s)", a.Keys, a.ComputerAction)
	default:
		what = "do the computer-use action " + a.ComputerAction
	}
	if a.WindowKnown {
		if a.WindowTitle == "" {
			what += " with no window focused"
		} else {
			what += fmt.Sprintf(" into the window %q", a.WindowTitle)
		}
	}
	return what + on
}
