package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// higherIsBetter reports whether more of unit is better (rates), as opposed
// to times and sizes.
func higherIsBetter(unit string) bool { return strings.HasSuffix(unit, "/s") }

// verdict says whether airlock's ratio over a peer is better or worse for
// airlock, so the ratio column reads the same way for every unit.
func verdict(ratio float64, unit string) string {
	switch {
	case ratio == 1:
		return "same"
	case (ratio < 1) != higherIsBetter(unit):
		return "better"
	default:
		return "worse"
	}
}

// PrintTable writes figs as a human-readable table: figure, peer, median,
// min, max (in the figure's unit), the number of samples, the ratio
// airlock/peer, and why a peer is missing or failed. Below the table it lists
// how each peer was invoked.
func PrintTable(w io.Writer, figs []Figure) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tpeer\tmedian\tmin\tmax\tn\tairlock/peer\tnote")
	var names []string
	notes := map[string][]peerNote{} // distinct notes per peer, in order
	for _, f := range figs {
		if f.Unavailable != "" {
			fmt.Fprintf(tw, "%s\t-\tunavailable\t-\t-\t0\t-\t%s\n", f.Name, oneLine(f.Unavailable))
			continue
		}
		for _, r := range f.Results {
			if _, seen := notes[r.Peer]; !seen {
				names = append(names, r.Peer)
				notes[r.Peer] = nil
			}
			if r.Note != "" && r.Missing == "" {
				notes[r.Peer] = addNote(notes[r.Peer], r.Note, f.Name)
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
				if r.RatioPairs > 0 && r.Peer != Reference {
					ratio = fmt.Sprintf("%.2f %s", r.Ratio, verdict(r.Ratio, f.Unit))
				} else if r.RatioPairs > 0 {
					ratio = fmt.Sprintf("%.2f", r.Ratio)
				}
				if r.Detail != "" {
					why = strings.TrimPrefix(why+"; "+r.Detail, "; ")
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
				f.Name, r.Peer, med, lo, hi, n, ratio, oneLine(why))
		}
	}
	tw.Flush()
	for _, f := range figs {
		if f.Note != "" {
			fmt.Fprintf(w, "\n%s: %s\n", f.Name, oneLine(f.Note))
		}
	}
	header := false
	for _, name := range names {
		ns := notes[name]
		for _, n := range ns {
			if !header {
				fmt.Fprintln(w, "\nhow each peer ran:")
				header = true
			}
			text := oneLine(n.note)
			if len(ns) > 1 {
				text += " [" + strings.Join(n.figures, "; ") + "]"
			}
			fmt.Fprintf(w, "  %-8s %s\n", name, text)
		}
	}
}

// peerNote is one way a peer ran and the figures it ran that way in.
type peerNote struct {
	note    string
	figures []string
}

// addNote records that a peer ran as note in figure fig.
func addNote(ns []peerNote, note, fig string) []peerNote {
	for i := range ns {
		if ns[i].note == note {
			ns[i].figures = append(ns[i].figures, fig)
			return ns
		}
	}
	return append(ns, peerNote{note: note, figures: []string{fig}})
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

// Machine describes the host a report was measured on.
type Machine struct {
	// CPUs is the number of CPUs the process may use (nproc).
	CPUs int `json:"cpus"`
	// Kernel is the kernel release (uname -r).
	Kernel string `json:"kernel"`
	// MemTotalMiB is the host's memory.
	MemTotalMiB int64 `json:"mem_total_mib"`
	// Go is the Go version the binary was built with.
	Go string `json:"go"`
	// Root says whether the bench ran as root.
	Root bool `json:"root"`
	// Cgroups describes the cgroup layout (v1, v2 or hybrid).
	Cgroups string `json:"cgroups"`
}

// Report is one run of the bench suite: the machine, the load around the
// run, and the figures.
type Report struct {
	// Command is the command line that produced the report.
	Command []string `json:"command,omitempty"`
	// Machine is the host, when known.
	Machine *Machine `json:"machine,omitempty"`
	// Started is when the run began.
	Started time.Time `json:"started,omitzero"`
	// DurationS is how long the run took, in seconds.
	DurationS float64 `json:"duration_s,omitempty"`
	// LoadBefore and LoadAfter are the 1, 5 and 15 minute load averages
	// before and after the run, to judge how noisy the machine was.
	LoadBefore string `json:"load_before,omitempty"`
	LoadAfter  string `json:"load_after,omitempty"`
	// Figures are the measured (or unavailable) figures, in order.
	Figures []Figure `json:"figures"`
}

// WriteJSON writes figs as an indented JSON document {"figures": [...]}.
func WriteJSON(w io.Writer, figs []Figure) error {
	return (&Report{Figures: figs}).WriteJSON(w)
}

// WriteJSON writes the report as an indented JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	out := *r
	if out.Figures == nil {
		out.Figures = []Figure{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// Print writes the report for humans: the machine and the load around the
// run, then the table (see PrintTable).
func (r *Report) Print(w io.Writer) {
	if len(r.Command) > 0 {
		fmt.Fprintf(w, "command:      %s\n", strings.Join(r.Command, " "))
	}
	if m := r.Machine; m != nil {
		fmt.Fprintf(w, "machine:      %d CPUs, kernel %s, %d MiB, %s, cgroups %s, root %v\n",
			m.CPUs, m.Kernel, m.MemTotalMiB, m.Go, m.Cgroups, m.Root)
	}
	if r.LoadBefore != "" || r.LoadAfter != "" {
		fmt.Fprintf(w, "load average: before %s, after %s\n", r.LoadBefore, r.LoadAfter)
	}
	if r.DurationS > 0 {
		fmt.Fprintf(w, "duration:     %.0f s\n", r.DurationS)
	}
	fmt.Fprintln(w)
	PrintTable(w, r.Figures)
}
