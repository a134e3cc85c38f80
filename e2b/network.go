package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"

	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
)

// E2B's egress settings mapped onto airlock's network policy (the egress
// proxy). The differences that matter:
//
//   - E2B sandboxes reach the internet unless told otherwise; airlock's are
//     offline unless told otherwise. A create that says nothing about the
//     network gets airlock's default, no network; allowInternetAccess: true
//     or a network section asks for egress.
//   - In E2B, allowOut entries win over denyOut entries; in airlock, deny
//     rules win. The combinations where that differs (allowOut together
//     with denyOut entries other than all traffic) are refused rather than
//     approximated.
//   - E2B's per-domain header transforms are airlock's injected secrets.

// allTraffic are the denyOut entries that mean "everything" (the SDKs'
// ALL_TRAFFIC is 0.0.0.0/0).
var allTraffic = map[string]bool{"0.0.0.0/0": true, "::/0": true}

// e2bNetwork is E2B's SandboxNetworkConfig and SandboxNetworkUpdateConfig.
type e2bNetwork struct {
	AllowOut           []string                `json:"allowOut"`
	DenyOut            []string                `json:"denyOut"`
	AllowPublicTraffic *bool                   `json:"allowPublicTraffic"`
	MaskRequestHost    *string                 `json:"maskRequestHost"`
	HTTPSPorts         []int                   `json:"httpsPorts"`
	EgressProxy        json.RawMessage         `json:"egressProxy"`
	Rules              map[string][]e2bNetRule `json:"rules"`
	AllowInternet      *bool                   `json:"allow_internet_access"`
}

// e2bNetRule is E2B's SandboxNetworkRule.
type e2bNetRule struct {
	Transform *struct {
		Headers map[string]string `json:"headers"`
	} `json:"transform"`
}

// networkFor maps E2B's settings to an airlock network policy and the
// secrets to inject. allowInternet is allow_internet_access; raw is the
// network section. replace is set for updateNetwork, which replaces the
// whole configuration (what it omits is cleared, which on E2B means
// internet access).
func networkFor(allowInternet *bool, raw json.RawMessage, replace bool) (policy.Network, []egress.Secret, error) {
	var n e2bNetwork
	if present(raw) {
		if err := json.Unmarshal(raw, &n); err != nil {
			return policy.Network{}, nil, apiErrorf(http.StatusBadRequest, "bad network: %v", err)
		}
	}
	if n.AllowInternet != nil && allowInternet == nil {
		allowInternet = n.AllowInternet
	}
	switch {
	case present(n.EgressProxy):
		return policy.Network{}, nil, apiErrorf(http.StatusBadRequest, "network.egressProxy is not supported: airlock's own egress proxy carries the traffic")
	case n.MaskRequestHost != nil, len(n.HTTPSPorts) > 0:
		return policy.Network{}, nil, apiErrorf(http.StatusBadRequest, "maskRequestHost and httpsPorts are not supported: airlock sandboxes serve no ports")
	}
	var secrets []egress.Secret
	hosts := make([]string, 0, len(n.Rules))
	for h := range n.Rules {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		for _, r := range n.Rules[h] {
			if r.Transform == nil {
				continue
			}
			names := make([]string, 0, len(r.Transform.Headers))
			for k := range r.Transform.Headers {
				names = append(names, k)
			}
			sort.Strings(names)
			for _, k := range names {
				secrets = append(secrets, egress.Secret{Host: h, Header: k, Value: r.Transform.Headers[k]})
			}
		}
	}
	// Egress rules mean egress is wanted, as on E2B, unless
	// allow_internet_access says otherwise; with neither, airlock's
	// default: no network.
	internet := replace || n.AllowOut != nil || n.DenyOut != nil
	if allowInternet != nil {
		internet = *allowInternet
	}
	denyAll := !internet
	var deny []string
	for _, d := range n.DenyOut {
		if allTraffic[d] {
			denyAll = true
		} else {
			deny = append(deny, d)
		}
	}
	switch {
	case denyAll && len(n.AllowOut) == 0:
		return policy.Network{Mode: policy.NetNone}, secrets, nil
	case denyAll:
		// Everything denied but allowOut, which wins in E2B: an allowlist.
		return policy.Network{Mode: policy.NetAllowlist, Allow: n.AllowOut}, secrets, nil
	case len(n.AllowOut) > 0 && len(deny) > 0:
		return policy.Network{}, nil, apiErrorf(http.StatusBadRequest,
			"allowOut together with denyOut entries other than 0.0.0.0/0 cannot be expressed: in airlock deny rules win over allow rules, in E2B allowOut wins; deny all traffic and list what to allow instead")
	default:
		return policy.Network{Mode: policy.NetOpen, Deny: deny}, secrets, nil
	}
}

// netRank orders network modes from least to most access.
var netRank = map[policy.NetworkMode]int{policy.NetNone: 0, policy.NetAllowlist: 1, policy.NetOpen: 2}

// ParseMaxNetwork checks a value for Config.MaxNetwork ("none",
// "allowlist" or "open").
func ParseMaxNetwork(s string) (policy.NetworkMode, error) {
	m := policy.NetworkMode(s)
	if _, ok := netRank[m]; !ok {
		return "", fmt.Errorf("unknown network mode %q (want none, allowlist or open)", s)
	}
	return m, nil
}

// networkAllowed refuses a network policy beyond Config.MaxNetwork, the
// most the server lets E2B creates and updates ask for. It refuses rather
// than narrows: an SDK that asked for internet access (as older SDKs do
// by default) would otherwise get a sandbox that silently cannot reach it.
func (h *Handler) networkAllowed(n policy.Network) error {
	max := h.cfg.MaxNetwork
	if max == "" {
		max = policy.NetOpen
	}
	if netRank[n.Mode] <= netRank[max] {
		return nil
	}
	what := map[policy.NetworkMode]string{policy.NetAllowlist: "egress to an allowlist (network.allowOut)",
		policy.NetOpen: "internet access (allowInternetAccess: true, which older e2b SDKs such as 2.45 send by default)"}[n.Mode]
	return apiErrorf(http.StatusForbidden, "this server lets E2B sandboxes have at most network %q (airlock serve --e2b-max-network), but the request asks for %s; create the sandbox with allowInternetAccess: false%s",
		max, what, map[bool]string{true: " or an allowOut list", false: ""}[max == policy.NetAllowlist])
}

// networkView describes an airlock network policy in E2B's terms, for
// getInfo: allowInternetAccess and the network section.
func networkView(ni manager.NetworkInfo) (*bool, map[string]any) {
	t, f := true, false
	allow := append([]string{}, ni.Allow...)
	switch policy.NetworkMode(ni.Mode) {
	case policy.NetOpen:
		return &t, map[string]any{"allowOut": allow, "denyOut": append([]string{}, ni.Deny...)}
	case policy.NetAllowlist:
		return nil, map[string]any{"allowOut": allow, "denyOut": []string{"0.0.0.0/0"}}
	}
	return &f, map[string]any{"allowOut": []string{}, "denyOut": []string{"0.0.0.0/0"}}
}

// updateNetwork serves PUT /sandboxes/{id}/network: it replaces the
// sandbox's egress policy. Injected headers cannot change while a sandbox
// runs.
func (h *Handler) updateNetwork(w http.ResponseWriter, r *http.Request) error {
	var raw json.RawMessage
	if err := decodeBody(r, &raw); err != nil {
		return err
	}
	if !present(raw) {
		raw = json.RawMessage(`{}`)
	}
	var probe struct {
		Rules json.RawMessage `json:"rules"`
	}
	json.Unmarshal(raw, &probe)
	if present(probe.Rules) {
		return apiErrorf(http.StatusBadRequest, "network rules (injected headers) cannot change while a sandbox runs on airlock")
	}
	// The whole configuration is replaced: omitted fields are cleared,
	// which on E2B means internet access.
	n, _, err := networkFor(nil, raw, true)
	if err != nil {
		return err
	}
	if err := h.networkAllowed(n); err != nil {
		return err
	}
	id := r.PathValue("id")
	if _, err := h.running(r, id); err != nil {
		return err
	}
	if _, err := h.m.SetNetwork(r.Context(), callerOf(r.Context()).id, id, n); err != nil {
		if errors.Is(err, manager.ErrNotFound) || errors.Is(err, manager.ErrNotRunning) {
			return apiErrorf(http.StatusNotFound, "sandbox %q not found", id)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
