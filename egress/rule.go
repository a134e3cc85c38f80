package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ruleKind says what a policy entry matches.
type ruleKind uint8

const (
	kindName     ruleKind = iota + 1 // one exact host name
	kindWildcard                     // every subdomain of a name, not the name itself
	kindAddr                         // one IP address
	kindPrefix                       // a CIDR block
)

// rule is one parsed entry of Policy.Allow or Policy.Deny.
type rule struct {
	kind ruleKind
	// name is the normalized host name for kindName and the parent name
	// (without "*.") for kindWildcard.
	name string
	// prefix holds the address (as a full-length prefix) for kindAddr and
	// the block for kindPrefix. IPv4-mapped IPv6 forms are stored as IPv4.
	prefix netip.Prefix
	// port restricts the rule to one destination port; 0 means any port.
	port uint16
}

// parseRule parses one policy entry: a host name ("pypi.org"), a wildcard
// ("*.githubusercontent.com"), an IP address ("192.0.2.7", "2001:db8::1")
// or a CIDR block ("10.0.0.0/8"), each optionally followed by ":port".
// IPv6 addresses and blocks take a port only inside brackets
// ("[2001:db8::1]:443", "[fd00::/8]:443").
func parseRule(s string) (rule, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return rule{}, errors.New("empty entry")
	}
	host, portStr, hasPort, err := splitRulePort(s)
	if err != nil {
		return rule{}, err
	}
	if s[0] == '[' && !strings.Contains(host, ":") {
		return rule{}, fmt.Errorf("%q: brackets are only for IPv6 addresses", s)
	}
	var r rule
	if hasPort {
		p, err := parsePort(portStr)
		if err != nil {
			return rule{}, err
		}
		r.port = p
	}
	switch {
	case host == "":
		return rule{}, errors.New("missing host before the port")
	case strings.Contains(host, "/"):
		p, err := netip.ParsePrefix(host)
		if err != nil {
			return rule{}, fmt.Errorf("bad CIDR block %q: %w", host, err)
		}
		if p.Addr().Zone() != "" {
			return rule{}, fmt.Errorf("bad CIDR block %q: zones are not allowed", host)
		}
		if p.Masked() != p {
			return rule{}, fmt.Errorf("CIDR block %q has host bits set; did you mean %s?", host, p.Masked())
		}
		r.kind, r.prefix = kindPrefix, unmapPrefix(p)
	default:
		if a, err := netip.ParseAddr(host); err == nil {
			if a.Zone() != "" {
				return rule{}, fmt.Errorf("address %q: zones are not allowed", host)
			}
			a = a.Unmap()
			r.kind, r.prefix = kindAddr, netip.PrefixFrom(a, a.BitLen())
			break
		}
		if strings.Contains(host, ":") {
			return rule{}, fmt.Errorf("%q is not a valid IPv6 address", host)
		}
		if rest, ok := strings.CutPrefix(host, "*."); ok {
			name, err := normalizeName(rest)
			if err != nil {
				return rule{}, fmt.Errorf("wildcard %q: %w", host, err)
			}
			r.kind, r.name = kindWildcard, name
			break
		}
		if strings.Contains(host, "*") {
			if host == "*" {
				return rule{}, errors.New(`a bare "*" is not a pattern; use network mode "open" to allow every name`)
			}
			return rule{}, fmt.Errorf("wildcard %q: \"*\" is only allowed as the whole first label, as in *.example.com", host)
		}
		if strings.HasPrefix(host, ".") {
			return rule{}, fmt.Errorf("%q starts with a dot: write *%s for its subdomains and %s for the name itself",
				host, host, strings.TrimPrefix(host, "."))
		}
		name, err := normalizeName(host)
		if err != nil {
			return rule{}, err
		}
		r.kind, r.name = kindName, name
	}
	return r, nil
}

// splitRulePort separates an optional ":port" from a rule.
func splitRulePort(s string) (host, port string, hasPort bool, err error) {
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", "", false, fmt.Errorf("%q: missing ]", s)
		}
		host, rest := s[1:end], s[end+1:]
		if rest == "" {
			return host, "", false, nil
		}
		if !strings.HasPrefix(rest, ":") {
			return "", "", false, fmt.Errorf("%q: want [address]:port", s)
		}
		return host, rest[1:], true, nil
	}
	switch strings.Count(s, ":") {
	case 0:
		return s, "", false, nil
	case 1:
		h, p, _ := strings.Cut(s, ":")
		return h, p, true, nil
	default:
		// A bare IPv6 address or block; a port needs brackets.
		return s, "", false, nil
	}
}

// parsePort parses a destination port in [1, 65535].
func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 || s[0] == '+' {
		return 0, fmt.Errorf("port %q: want a number from 1 to 65535", s)
	}
	return uint16(n), nil
}

// unmapPrefix writes an IPv4-mapped IPv6 block that lies inside
// ::ffff:0:0/96 as the IPv4 block it stands for, so that it matches the
// (unmapped) addresses the proxy compares it with.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p
}

// normalizeName lower-cases a host name, drops one trailing dot and checks
// its syntax. Names must be ASCII: internationalized names are written in
// their punycode form (xn--...), which is what clients put on the wire.
func normalizeName(s string) (string, error) {
	if s == "" {
		return "", errors.New("empty host name")
	}
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return "", fmt.Errorf("host name %q is not ASCII: write it in punycode (xn--...)", s)
		}
	}
	s = strings.ToLower(strings.TrimSuffix(s, "."))
	if s == "" {
		return "", errors.New("empty host name")
	}
	if len(s) > 253 {
		return "", fmt.Errorf("host name %.40q... is longer than 253 characters", s)
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" {
			return "", fmt.Errorf("host name %q has an empty label", s)
		}
		if len(l) > 63 {
			return "", fmt.Errorf("host name %q has a label longer than 63 characters", s)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("host name %q has a label that starts or ends with '-'", s)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("host name %q contains %q", s, c)
			}
		}
	}
	if last := labels[len(labels)-1]; strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") {
		// "127.1", "2130706433" and "0x7f.1" are numeric shorthands that some
		// resolvers turn into addresses; they are not names.
		return "", fmt.Errorf("%q is neither an IP address nor a host name (its last label is numeric)", s)
	}
	return s, nil
}

// String returns the canonical form of r, which parseRule maps back to r.
func (r rule) String() string {
	var host string
	switch r.kind {
	case kindName:
		host = r.name
	case kindWildcard:
		host = "*." + r.name
	case kindAddr:
		host = r.prefix.Addr().String()
	case kindPrefix:
		host = r.prefix.String()
	}
	if r.port == 0 {
		return host
	}
	if (r.kind == kindAddr || r.kind == kindPrefix) && r.prefix.Addr().Is6() {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(int(r.port))
}

// portOK reports whether r applies to destination port p.
func (r rule) portOK(p int) bool { return r.port == 0 || int(r.port) == p }

// matchName reports whether r matches the normalized host name.
func (r rule) matchName(name string) bool {
	switch r.kind {
	case kindName:
		return name == r.name
	case kindWildcard:
		return len(name) > len(r.name)+1 && strings.HasSuffix(name, r.name) && name[len(name)-len(r.name)-1] == '.'
	}
	return false
}

// matchAddr reports whether r matches the (unmapped) address a.
func (r rule) matchAddr(a netip.Addr) bool {
	return (r.kind == kindAddr || r.kind == kindPrefix) && r.prefix.Contains(a)
}

// isIPRule reports whether r is an address or CIDR rule.
func (r rule) isIPRule() bool { return r.kind == kindAddr || r.kind == kindPrefix }

// target is a destination as requested by the sandbox, normalized.
type target struct {
	name string     // normalized host name; empty for an IP literal
	addr netip.Addr // the literal as given (may be IPv4-mapped); valid only when name is empty
}

// display is how the target appears in reasons and logs.
func (t target) display() string {
	if t.name != "" {
		return t.name
	}
	return t.addr.String()
}

// parseTarget normalizes a requested host: brackets around IPv6 literals
// are dropped, names are lower-cased and lose one trailing dot.
func parseTarget(host string) (target, error) {
	h := host
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return target{}, fmt.Errorf("address %q: zones are not allowed", host)
		}
		return target{addr: a}, nil
	}
	if strings.ContainsAny(h, ":*/[]") {
		return target{}, fmt.Errorf("%q is not a valid host", host)
	}
	name, err := normalizeName(h)
	if err != nil {
		return target{}, err
	}
	return target{name: name}, nil
}
