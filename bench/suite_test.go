package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestParseOnly(t *testing.T) {
	all, err := ParseOnly("")
	if err != nil || strings.Join(all, ",") != strings.Join(Keys, ",") {
		t.Errorf("ParseOnly(\"\") = %v, %v; want every key", all, err)
	}
	got, err := ParseOnly("density, cold,cold")
	if err != nil || strings.Join(got, ",") != "density,cold" {
		t.Errorf("ParseOnly = %v, %v", got, err)
	}
	if _, err := ParseOnly("cold,warp"); err == nil || !strings.Contains(err.Error(), `"warp"`) {
		t.Errorf("unknown key accepted: %v", err)
	}
}

// TestUnavailableFigure checks that a figure this build cannot measure is
// reported as unavailable with a reason, in the table and in JSON.
func TestUnavailableFigure(t *testing.T) {
	rep := Run(Config{Only: []string{"cell"}, Runs: 1})
	if len(rep.Figures) != 1 {
		t.Fatalf("figures = %+v", rep.Figures)
	}
	for _, f := range rep.Figures {
		if f.Unavailable == "" || len(f.Results) != 0 {
			t.Errorf("%s: %+v, want unavailable with a reason", f.Name, f)
		}
	}
	if rep.Machine == nil || rep.Machine.CPUs < 1 || rep.LoadBefore == "" || rep.LoadAfter == "" {
		t.Errorf("report header = %+v", rep)
	}
	var tbl bytes.Buffer
	rep.Print(&tbl)
	for _, s := range []string{"code cell", "unavailable", "airlock serve did not start", "load average"} {
		if !strings.Contains(tbl.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, tbl.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("%v\n%s", err, js.String())
	}
	if len(back.Figures) != 1 || back.Figures[0].Name != "code cell" || back.Figures[0].Unavailable == "" {
		t.Errorf("JSON round trip: %+v", back.Figures)
	}
}

func TestNotesPerFigure(t *testing.T) {
	figs := []Figure{
		{Name: "a", Results: []PeerResult{{Peer: Reference, Note: "cli"}}},
		{Name: "b", Results: []PeerResult{{Peer: Reference, Note: "in-process"}}},
		{Name: "c", Results: []PeerResult{{Peer: Reference, Note: "cli"}, {Peer: "bare", Note: "plain"}}},
	}
	var buf bytes.Buffer
	PrintTable(&buf, figs)
	out := buf.String()
	for _, s := range []string{"cli [a; c]", "in-process [b]", "bare     plain\n"} {
		if !strings.Contains(out, s) {
			t.Errorf("notes lack %q:\n%s", s, out)
		}
	}
}
