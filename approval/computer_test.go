package approval

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestComputerRulesRefused(t *testing.T) {
	for _, bad := range []string{
		`{"require":[{"action":"computer","computer_action":"typ"}]}`,
		`{"require":[{"action":"computer","computer_action":"left_click","window_title_glob":"*Bank*"}]}`,
		`{"require":[{"action":"computer","window_title":"(","computer_action":"type"}]}`,
		`{"require":[{"action":"computer","window_title":"a","window_title_glob":"b"}]}`,
		`{"require":[{"action":"exec","window_title_glob":"*Bank*"}]}`,
		`{"require":[{"action":"exec","computer_action":"type"}]}`,
	} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%s) accepted", bad)
		}
	}
}

// TestComputerRulesMatch: a window rule matches keyboard actions into a
// window whose title matches, and (fail closed) keyboard actions whose
// window was not read; an action rule matches its action only.
func TestComputerRulesMatch(t *testing.T) {
	p, err := Parse([]byte(`{
	  "require": [{"action": "computer", "computer_action": "type", "window_title_glob": "*Bank*"},
	              {"action": "computer", "computer_action": "left_click_drag"}],
	  "deny": [{"action": "computer", "window_title": "(?i)password"}]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	win := func(action, title string) Action {
		return Action{Kind: KindComputer, ComputerAction: action, WindowTitle: title, WindowKnown: true}
	}
	for _, tc := range []struct {
		a    Action
		want string
	}{
		{win("type", "My Bank - Chromium"), "require"},
		{win("type", "Notes"), ""},
		{win("type", ""), ""},
		{win("key", "My Bank"), ""},
		{win("key", "Enter PASSWORD"), "deny"},
		{win("hold_key", "password"), "deny"},
		{win("left_click", "password"), ""},
		{Action{Kind: KindComputer, ComputerAction: "type"}, "deny"}, // title unknown: every window rule
		{Action{Kind: KindComputer, ComputerAction: "left_click_drag"}, "require"},
		{Action{Kind: KindComputer, ComputerAction: "screenshot"}, ""},
		{Action{Kind: KindExec, Argv: []string{"type"}}, ""},
	} {
		v := judge(&tc.a, p)
		got := ""
		if v.deny != nil {
			got = "deny"
		} else if v.require != nil {
			got = "require"
		}
		if got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.a, got, tc.want)
		}
	}
}

// TestComputerWindowReadOnlyWhenNeeded: the gate reads the focused
// window's title only when a rule looks at it, and refuses the action
// (fail closed, audited) when it cannot be read.
func TestComputerWindowReadOnlyWhenNeeded(t *testing.T) {
	var events []string
	audit := func(_ context.Context, _, _, action string, detail any) error {
		events = append(events, action)
		return nil
	}
	reads := 0
	bank := func(context.Context) (string, error) { reads++; return "Online Bank", nil }
	typeAct := Action{Kind: KindComputer, ComputerAction: "type", TextBytes: 6, WindowOf: bank}

	noWindowRule, _ := Parse([]byte(`{"require":[{"action":"computer","computer_action":"left_click"}]}`))
	g, _ := New(Config{Policy: noWindowRule, Audit: audit})
	if err := g.Check(context.Background(), typeAct, nil); err != nil || reads != 0 {
		t.Fatalf("no window rule: %v, %d reads", err, reads)
	}

	deny, _ := Parse([]byte(`{"deny":[{"action":"computer","window_title_glob":"*Bank*","reason":"no typing into banks"}]}`))
	g, _ = New(Config{Policy: deny, Audit: audit})
	err := g.Check(context.Background(), typeAct, nil)
	var ae *Error
	if !errors.As(err, &ae) || ae.Code != CodeDenied || !strings.Contains(ae.Msg, `"Online Bank"`) || reads != 1 {
		t.Fatalf("type into a bank: %v (%d reads)", err, reads)
	}
	if err := g.Check(context.Background(), Action{Kind: KindComputer, ComputerAction: "screenshot", WindowOf: bank}, nil); err != nil || reads != 1 {
		t.Fatalf("a screenshot: %v (%d reads)", err, reads)
	}

	events = nil
	broken := typeAct
	broken.WindowOf = func(context.Context) (string, error) { return "", errors.New("xdotool died") }
	err = g.Check(context.Background(), broken, nil)
	if !errors.As(err, &ae) || ae.Code != CodeDenied || !strings.Contains(ae.Msg, "xdotool died") {
		t.Fatalf("unreadable title: %v", err)
	}
	if len(events) != 1 || events[0] != AuditDecided {
		t.Fatalf("unreadable title audited as %v", events)
	}

	// Held, then denied by a human: the summary names the window, never the text.
	req, _ := Parse([]byte(`{"require":[{"action":"computer","computer_action":"type","window_title_glob":"*Bank*"}]}`))
	g, _ = New(Config{Policy: req, Timeout: time.Hour, Audit: audit})
	errc := make(chan error, 1)
	go func() { errc <- g.Check(context.Background(), typeAct, nil) }()
	var ps []Pending
	for ps = g.List(func(*Pending) bool { return true }); len(ps) == 0; ps = g.List(func(*Pending) bool { return true }) {
		time.Sleep(10 * time.Millisecond)
	}
	if want := `type 6 bytes of text into the window "Online Bank"`; ps[0].Summary != want {
		t.Errorf("summary %q, want %q", ps[0].Summary, want)
	}
	if err := g.Answer(ps[0].ID, Decision{Decision: Deny, By: "key:human"}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.As(err, &ae) || ae.Code != CodeDenied {
		t.Fatalf("denied: %v", err)
	}
}
