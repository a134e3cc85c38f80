// Package runtime defines what every isolation tier reports about the layers
// it enforces. Each runtime (native, gvisor, ...) translates a policy.Policy;
// none invents its own knobs.
package runtime

// Layer is one isolation mechanism and how it was (or was not) applied.
type Layer struct {
	// Name is the mechanism: "userns", "pidns", "cgroup", "seccomp", "landlock"...
	Name string `json:"name"`
	// State is "ok", "degraded" or "missing".
	State string `json:"state"`
	// Detail says how: "cgroup v1 (memory,pids,cpu)", "ABI 6", "strict, 61 rules".
	Detail string `json:"detail,omitempty"`
}

// Layer states.
const (
	StateOK       = "ok"
	StateDegraded = "degraded"
	StateMissing  = "missing"
)

// Enforced lists the layers applied to one sandbox, in the order applied.
type Enforced []Layer

// Get returns the layer with the given name and whether it is present.
func (e Enforced) Get(name string) (Layer, bool) {
	for _, l := range e {
		if l.Name == name {
			return l, true
		}
	}
	return Layer{}, false
}
