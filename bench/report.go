package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// PrintTable writes figs as a human-readable table: figure, peer, median,
// min, max (in the figure's unit), the number of samples, the ratio
// airlock/peer, and why a peer is missing or failed. Below the table it lists
// how each peer was invoked.
func PrintTable(w io.Writer, figs []Figure) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tpeer\tmedian\tmin\tmax\tn\tairlock/peer\tnote")
	var names []string
	notes := map[string]string{}
	for _, f := range figs {
		for _, r := range f.Results {
			if _, seen := notes[r.Peer]; !seen {
				names = append(names, r.Peer)
				notes[r.Peer] = ""
			}
			if r.Note != "" && r.Missing == "" {
				notes[r.Peer] = r.Note
			}
			var med, lo, hi, n, ratio, why string
			switch {
			case r.Missing != "":
				med, lo, hi, n, ratio = "missing", "-", "-", "0", "-"
				why = r.Missing
			case len(r.Samples) == 0:
				med, lo, hi, n, ratio = "failed", "-", "-", "0", "-"
				why = r.Error
			default:
				med = formatValue(r.Median, f.Unit)
				lo = formatValue(r.Min, f.Unit)
				hi = formatValue(r.Max, f.Unit)
				n = fmt.Sprint(len(r.Samples))
				if r.Failures > 0 {
					n += fmt.Sprintf(" (%d failed)", r.Failures)
					why = r.Error
				}
				ratio = "-"
				if r.RatioPairs > 0 {
					ratio = fmt.Sprintf("%.2f", r.Ratio)
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
				f.Name, r.Peer, med, lo, hi, n, ratio, oneLine(why))
		}
	}
	tw.Flush()
	header := false
	for _, name := range names {
		if notes[name] == "" {
			continue
		}
		if !header {
			fmt.Fprintln(w, "\nhow each peer ran:")
			header = true
		}
		fmt.Fprintf(w, "  %-8s %s\n", name, oneLine(notes[name]))
	}
}

// formatValue formats v with its unit, with a precision suited to its size.
func formatValue(v float64, unit string) string {
	var s string
	switch {
	case v >= 100:
		s = fmt.Sprintf("%.0f", v)
	case v >= 10:
		s = fmt.Sprintf("%.1f", v)
	default:
		s = fmt.Sprintf("%.2f", v)
	}
	if unit == "" {
		return s
	}
	return s + " " + unit
}

// oneLine collapses whitespace so a note fits in one table row.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// report is the JSON document written by WriteJSON.
type report struct {
	Figures []Figure `json:"figures"`
}

// WriteJSON writes figs as an indented JSON document {"figures": [...]}.
func WriteJSON(w io.Writer, figs []Figure) error {
	if figs == nil {
		figs = []Figure{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(report{Figures: figs})
}
