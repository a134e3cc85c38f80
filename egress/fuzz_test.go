package egress

import (
	"strings"
	"testing"
)

// FuzzParseRule checks that parseRule never panics, that every rule it
// accepts has a canonical form that parses back to the same rule, and that
// names come out normalized.
func FuzzParseRule(f *testing.F) {
	for _, s := range []string{
		"pypi.org", "PyPI.org.", "pypi.org:443", "*.githubusercontent.com", "*.x.y:1",
		"192.0.2.7", "192.0.2.7:22", "10.0.0.0/8", "10.0.0.0/8:5432", "2001:db8::1",
		"[2001:db8::1]:443", "fd00::/8", "[fd00::/8]:443", "::ffff:127.0.0.1", "::ffff:10.0.0.0/104",
		"*", "*.", ".a", "a..b", "[", "[]:1", "127.1", "bücher.de", "fe80::1%eth0", "a:b:c",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := parseRule(s)
		if err != nil {
			return
		}
		canon := r.String()
		r2, err := parseRule(canon)
		if err != nil {
			t.Fatalf("parseRule(%q) = %q, which does not parse: %v", s, canon, err)
		}
		if r2 != r {
			t.Fatalf("parseRule(%q) = %#v, but its canonical form %q parses to %#v", s, r, canon, r2)
		}
		if r2.String() != canon {
			t.Fatalf("canonical form of %q is not stable: %q then %q", s, canon, r2.String())
		}
		switch r.kind {
		case kindName, kindWildcard:
			if r.name != strings.ToLower(r.name) || strings.HasSuffix(r.name, ".") || r.name == "" {
				t.Fatalf("parseRule(%q): name %q is not normalized", s, r.name)
			}
			if r.matchName(r.name) != (r.kind == kindName) {
				t.Fatalf("parseRule(%q): matchName of its own name is wrong for kind %d", s, r.kind)
			}
			if r.kind == kindWildcard && !r.matchName("sub."+r.name) && len(r.name) < 250 {
				t.Fatalf("parseRule(%q): wildcard does not match a subdomain", s)
			}
		case kindAddr, kindPrefix:
			if r.prefix.Addr().Is4In6() && r.prefix.Bits() >= 96 || r.prefix.Masked() != r.prefix {
				t.Fatalf("parseRule(%q): prefix %s is not canonical", s, r.prefix)
			}
			if !r.matchAddr(r.prefix.Addr()) {
				t.Fatalf("parseRule(%q): rule does not match its own address", s)
			}
		default:
			t.Fatalf("parseRule(%q): kind %d", s, r.kind)
		}
	})
}
