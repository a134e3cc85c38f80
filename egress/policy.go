package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Network modes.
const (
	// ModeNone refuses every connection. The empty mode means the same.
	ModeNone = "none"
	// ModeAllowlist lets through only names and addresses in Policy.Allow.
	ModeAllowlist = "allowlist"
	// ModeOpen lets through every public destination not in Policy.Deny.
	ModeOpen = "open"
)

// Policy says where a sandbox may connect.
//
// Allow and Deny entries are host names ("pypi.org"), wildcards
// ("*.githubusercontent.com": every subdomain at any depth, but not
// githubusercontent.com itself), IP addresses ("192.0.2.7", "2001:db8::1")
// or CIDR blocks ("10.0.0.0/8"), each optionally followed by ":port"
// ("pypi.org:443", "[2001:db8::1]:443"; IPv6 needs the brackets for a port).
// Names are compared case-insensitively, without a trailing dot, in their
// ASCII (punycode) form.
//
// Deny always wins over Allow. Name entries decide names; address entries
// decide IP literals and, in Allow, exempt addresses from the special-range
// refusal (see CheckIP). A name is never admitted because of the address it
// resolves to.
type Policy struct {
	// Mode is "none" (or empty), "allowlist" or "open".
	Mode string `json:"mode"`
	// Allow lists what allowlist mode lets through, and the special
	// addresses any mode may reach.
	Allow []string `json:"allow,omitempty"`
	// Deny lists what is refused in every mode.
	Deny []string `json:"deny,omitempty"`
}

// Decision is the verdict on one destination.
type Decision struct {
	// Allowed says whether the connection may go ahead.
	Allowed bool
	// Reason says which rule decided and, for a denial, how to change the
	// policy to permit the connection.
	Reason string
}

// matcher is a parsed Policy.
type matcher struct {
	mode        string
	allow, deny []rule
}

// Validate reports every malformed entry of p, one error per entry.
func (p Policy) Validate() error {
	_, err := p.compile()
	return err
}

func (p Policy) compile() (*matcher, error) {
	var errs []error
	m := &matcher{mode: p.Mode}
	switch p.Mode {
	case "":
		m.mode = ModeNone
	case ModeNone, ModeAllowlist, ModeOpen:
	default:
		errs = append(errs, fmt.Errorf("network.mode: unknown mode %q (want none, allowlist or open)", p.Mode))
	}
	parse := func(list string, in []string) []rule {
		out := make([]rule, 0, len(in))
		for i, s := range in {
			r, err := parseRule(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("network.%s[%d] %q: %w", list, i, s, err))
				continue
			}
			out = append(out, r)
		}
		return out
	}
	m.allow = parse("allow", p.Allow)
	m.deny = parse("deny", p.Deny)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

// Decide judges a requested destination before it is resolved: host is a
// name or an IP literal (IPv6 with or without brackets), port the
// destination port. An allowed name must still pass CheckIP for every
// address it resolves to; an allowed IP literal must pass CheckIP for itself.
func (p Policy) Decide(host string, port int) Decision {
	m, err := p.compile()
	if err != nil {
		return Decision{Reason: "denied: the network policy is invalid: " + oneLine(err)}
	}
	t, err := parseTarget(host)
	if err != nil {
		return Decision{Reason: fmt.Sprintf("denied: %v", err)}
	}
	return m.decide(t, port)
}

// CheckIP judges one address that host (the requested name, or the literal
// itself) resolved to. It refuses addresses matching a Deny entry and
// special addresses: loopback, private (RFC 1918, fc00::/7), link-local
// (169.254.0.0/16 with the metadata service 169.254.169.254, fe80::/10),
// carrier-grade NAT (100.64.0.0/10), multicast, unspecified, broadcast,
// documentation, benchmarking and other reserved blocks, in any IPv4-mapped,
// NAT64 or 6to4 form, unless an Allow entry that lies inside the special
// block names the address ("127.0.0.1", "10.0.0.0/8"; "0.0.0.0/0" does not
// count).
func (p Policy) CheckIP(host string, port int, ip netip.Addr) Decision {
	m, err := p.compile()
	if err != nil {
		return Decision{Reason: "denied: the network policy is invalid: " + oneLine(err)}
	}
	t, err := parseTarget(host)
	if err != nil {
		return Decision{Reason: fmt.Sprintf("denied: %v", err)}
	}
	return m.checkIP(t, port, ip)
}

func (m *matcher) decide(t target, port int) Decision {
	if port < 1 || port > 65535 {
		return Decision{Reason: fmt.Sprintf("denied: port %d is not a valid destination port", port)}
	}
	what := t.display()
	hostPort := joinHostPort(what, port)
	if m.mode == ModeNone {
		return Decision{Reason: fmt.Sprintf(`denied: network mode is "none"; set network.mode to "allowlist" and add %s to network.allow to permit it`, hostPort)}
	}
	a := t.addr.Unmap()
	match := func(r rule) bool {
		if t.name != "" {
			return r.matchName(t.name)
		}
		return r.matchAddr(a)
	}
	for _, r := range m.deny {
		if match(r) && r.portOK(port) {
			return Decision{Reason: fmt.Sprintf("denied: %s matches network.deny entry %s (deny wins over allow); remove that entry to permit it", hostPort, r)}
		}
	}
	if m.mode == ModeOpen {
		return Decision{Allowed: true, Reason: fmt.Sprintf(`allowed: %s (network mode "open")`, hostPort)}
	}
	var wrongPort []string
	for _, r := range m.allow {
		if !match(r) {
			continue
		}
		if r.portOK(port) {
			return Decision{Allowed: true, Reason: fmt.Sprintf("allowed: %s matches network.allow entry %s", hostPort, r)}
		}
		wrongPort = append(wrongPort, r.String())
	}
	if len(wrongPort) > 0 {
		return Decision{Reason: fmt.Sprintf("denied: port %d of %s is not allowed (network.allow has %s); add %s to network.allow to permit it",
			port, what, strings.Join(wrongPort, ", "), hostPort)}
	}
	return Decision{Reason: fmt.Sprintf("denied: %s is not in network.allow; add %s to network.allow to permit it", what, suggest(t, port))}
}

// suggest is the allow entry a denial proposes.
func suggest(t target, port int) string {
	if t.name != "" {
		return t.name
	}
	return t.addr.Unmap().String()
}

func (m *matcher) checkIP(t target, port int, ip netip.Addr) Decision {
	a := ip.Unmap()
	shown := ip.String()
	if ip.Is4In6() {
		shown += " (" + a.String() + ")"
	}
	var subject string // "X resolves to A," or "A is"
	if t.name != "" {
		subject = fmt.Sprintf("%s resolves to %s,", t.name, shown)
	} else {
		subject = shown + " is"
	}
	for _, r := range m.deny {
		if r.matchAddr(a) && r.portOK(port) {
			return Decision{Reason: fmt.Sprintf("denied: %s which matches network.deny entry %s (deny wins over allow); remove that entry to permit it", subject, r)}
		}
	}
	c, special := classify(a)
	if !special {
		return Decision{Allowed: true, Reason: fmt.Sprintf("allowed: %s a public address", subject)}
	}
	for _, r := range m.allow {
		if r.isIPRule() && r.portOK(port) && r.prefix.Contains(a) &&
			r.prefix.Bits() >= c.block.Bits() && c.block.Contains(r.prefix.Addr()) {
			return Decision{Allowed: true, Reason: fmt.Sprintf("allowed: %s %s, named by network.allow entry %s", subject, c.what, r)}
		}
	}
	return Decision{Reason: fmt.Sprintf("denied: %s %s; add %s to network.allow to permit it", subject, c.what, a)}
}

// joinHostPort formats host and port, bracketing IPv6 literals.
func joinHostPort(host string, port int) string {
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(port)
}

// oneLine joins a multi-line (errors.Join) message with "; ".
func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}
