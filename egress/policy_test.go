package egress

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	good := []struct{ in, canon string }{
		{"pypi.org", "pypi.org"},
		{"  PyPI.Org.  ", "pypi.org"},
		{"pypi.org:443", "pypi.org:443"},
		{"*.githubusercontent.com", "*.githubusercontent.com"},
		{"*.Example.COM.:8443", "*.example.com:8443"},
		{"_acme.example.com", "_acme.example.com"},
		{"localhost", "localhost"},
		{"xn--bcher-kva.example", "xn--bcher-kva.example"},
		{"192.0.2.7", "192.0.2.7"},
		{"192.0.2.7:22", "192.0.2.7:22"},
		{"10.0.0.0/8", "10.0.0.0/8"},
		{"10.0.0.0/8:5432", "10.0.0.0/8:5432"},
		{"2001:db8::1", "2001:db8::1"},
		{"[2001:db8::1]", "2001:db8::1"},
		{"[2001:DB8::1]:443", "[2001:db8::1]:443"},
		{"fd00::/8", "fd00::/8"},
		{"[fd00::/8]:443", "[fd00::/8]:443"},
		{"::ffff:127.0.0.1", "127.0.0.1"},
		{"[::ffff:127.0.0.1]:80", "127.0.0.1:80"},
		{"::ffff:10.0.0.0/104", "10.0.0.0/8"},
	}
	for _, c := range good {
		r, err := parseRule(c.in)
		if err != nil {
			t.Errorf("parseRule(%q): %v", c.in, err)
			continue
		}
		if got := r.String(); got != c.canon {
			t.Errorf("parseRule(%q) = %q, want %q", c.in, got, c.canon)
		}
	}
	bad := []struct{ in, want string }{
		{"", "empty"},
		{"*", "network mode"},
		{"*.", "empty host name"},
		{"a.*.example.com", "whole first label"},
		{"*example.com", "whole first label"},
		{".example.com", "write *.example.com"},
		{"pypi.org:0", "1 to 65535"},
		{"pypi.org:65536", "1 to 65535"},
		{"pypi.org:https", "1 to 65535"},
		{"pypi.org:+443", "1 to 65535"},
		{":443", "missing host"},
		{"10.1.2.3/8", "did you mean 10.0.0.0/8"},
		{"10.0.0.0/33", "bad CIDR"},
		{"bücher.example", "punycode"},
		{"exa mple.com", "contains"},
		{"-bad.example", "starts or ends with '-'"},
		{"a..b", "empty label"},
		{"127.1", "numeric"},
		{"2130706433", "numeric"},
		{"0x7f.1", "numeric"},
		{"[pypi.org]:443", "brackets are only for IPv6"},
		{"[1.2.3.4]:443", "brackets are only for IPv6"},
		{"fe80::1%eth0", "zones"},
		{"[2001:db8::1]443", "want [address]:port"},
		{"[2001:db8::1", "missing ]"},
		{strings.Repeat("a", 64) + ".com", "longer than 63"},
		{strings.Repeat("abcdefgh.", 32) + "com", "longer than 253"},
	}
	for _, c := range bad {
		_, err := parseRule(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parseRule(%q) error = %v, want it to mention %q", c.in, err, c.want)
		}
	}
}

func TestValidate(t *testing.T) {
	if err := (Policy{}).Validate(); err != nil {
		t.Errorf("zero policy: %v", err)
	}
	if err := (Policy{Mode: "allowlist", Allow: []string{"pypi.org", "*.github.com", "10.0.0.0/8"}}).Validate(); err != nil {
		t.Errorf("good policy: %v", err)
	}
	err := Policy{Mode: "closed", Allow: []string{"ok.example", "bad..example"}, Deny: []string{"*"}}.Validate()
	if err == nil {
		t.Fatal("bad policy validated")
	}
	for _, want := range []string{`unknown mode "closed"`, `network.allow[1] "bad..example"`, `network.deny[0] "*"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if d := (Policy{Mode: "allowlist", Allow: []string{"["}}).Decide("pypi.org", 443); d.Allowed || !strings.Contains(d.Reason, "invalid") {
		t.Errorf("invalid policy decided %+v", d)
	}
}

func TestDecide(t *testing.T) {
	allow := Policy{
		Mode:  "allowlist",
		Allow: []string{"pypi.org", "*.githubusercontent.com", "api.example.com:443", "192.0.2.0/24", "[2001:db8::1]:443", "*.corp.example"},
		Deny:  []string{"evil.githubusercontent.com", "secret.corp.example", "192.0.2.66"},
	}
	open := Policy{Mode: "open", Deny: []string{"*.tracker.example", "198.51.100.0/24:25"}}
	cases := []struct {
		p          Policy
		host       string
		port       int
		allowed    bool
		reasonPart string
	}{
		{allow, "pypi.org", 443, true, "matches network.allow entry pypi.org"},
		{allow, "PYPI.ORG.", 80, true, "pypi.org"},
		{allow, "files.pythonhosted.org", 443, false, "denied: files.pythonhosted.org is not in network.allow; add files.pythonhosted.org to network.allow to permit it"},
		{allow, "raw.githubusercontent.com", 443, true, "*.githubusercontent.com"},
		{allow, "a.b.githubusercontent.com", 443, true, "*.githubusercontent.com"},
		{allow, "githubusercontent.com", 443, false, "not in network.allow"}, // the wildcard does not match the apex
		{allow, "xgithubusercontent.com", 443, false, "not in network.allow"},
		{allow, "evil.githubusercontent.com", 443, false, "matches network.deny entry evil.githubusercontent.com (deny wins over allow)"},
		{allow, "secret.corp.example", 443, false, "deny wins"},
		{allow, "api.example.com", 443, true, "api.example.com:443"},
		{allow, "api.example.com", 80, false, "port 80 of api.example.com is not allowed (network.allow has api.example.com:443); add api.example.com:80"},
		{allow, "192.0.2.10", 22, true, "192.0.2.0/24"},
		{allow, "192.0.2.66", 22, false, "network.deny entry 192.0.2.66"},
		{allow, "::ffff:192.0.2.66", 22, false, "network.deny entry 192.0.2.66"},
		{allow, "[2001:db8::1]", 443, true, "[2001:db8::1]:443"},
		{allow, "2001:db8::1", 80, false, "port 80"},
		{allow, "203.0.113.9", 443, false, "denied: 203.0.113.9 is not in network.allow; add 203.0.113.9"},
		{allow, "bücher.example", 443, false, "punycode"},
		{allow, "127.1", 80, false, "numeric"},
		{allow, "pypi.org", 0, false, "port 0"},
		{open, "anything.example", 443, true, `network mode "open"`},
		{open, "x.tracker.example", 443, false, "*.tracker.example"},
		{open, "198.51.100.7", 25, false, "198.51.100.0/24:25"},
		{open, "198.51.100.7", 587, true, "open"},
		{Policy{}, "pypi.org", 443, false, `network mode is "none"`},
		{Policy{Mode: "none", Allow: []string{"pypi.org"}}, "pypi.org", 443, false, `set network.mode to "allowlist" and add pypi.org:443`},
	}
	for _, c := range cases {
		d := c.p.Decide(c.host, c.port)
		if d.Allowed != c.allowed || !strings.Contains(d.Reason, c.reasonPart) {
			t.Errorf("%s Decide(%q, %d) = %+v, want allowed=%v with %q", c.p.Mode, c.host, c.port, d, c.allowed, c.reasonPart)
		}
	}
}

// TestCheckIPSpecialRanges judges special addresses on the matcher alone:
// nothing is dialed.
func TestCheckIPSpecialRanges(t *testing.T) {
	open := Policy{Mode: "open"}
	cases := []struct {
		ip   string
		what string // "" means public: allowed
	}{
		{"169.254.169.254", "cloud metadata"},
		{"169.254.1.1", "link-local"},
		{"10.0.0.1", "private address (RFC 1918)"},
		{"10.255.255.255", "RFC 1918"},
		{"172.16.0.1", "RFC 1918"},
		{"172.31.255.254", "RFC 1918"},
		{"172.32.0.1", ""},
		{"192.168.1.1", "RFC 1918"},
		{"100.64.0.1", "carrier-grade NAT"},
		{"100.127.255.254", "carrier-grade NAT"},
		{"100.128.0.1", ""},
		{"127.0.0.1", "loopback"},
		{"127.9.9.9", "loopback"},
		{"0.0.0.0", "unspecified"},
		{"0.1.2.3", "this network"},
		{"224.0.0.1", "multicast"},
		{"239.255.255.250", "multicast"},
		{"255.255.255.255", "broadcast"},
		{"240.0.0.1", "reserved"},
		{"192.0.0.8", "IETF protocol"},
		{"192.0.2.1", "documentation"},
		{"198.51.100.1", "documentation"},
		{"203.0.113.1", "documentation"},
		{"198.18.0.1", "benchmarking"},
		{"192.88.99.1", "6to4 relay"},
		{"8.8.8.8", ""},
		{"1.1.1.1", ""},
		{"::1", "loopback"},
		{"::", "unspecified"},
		{"fe80::1", "link-local"},
		{"fc00::1", "unique local"},
		{"fd12:3456::1", "unique local"},
		{"fec0::1", "site-local"},
		{"ff02::1", "multicast"},
		{"2001:db8::1", "documentation"},
		{"3fff::1", "documentation"},
		{"2001::1", "IETF protocol"},
		{"100::1", "discard-only"},
		{"::127.0.0.1", "IPv4-compatible"},
		{"4000::1", "non-global"},
		{"::ffff:127.0.0.1", "loopback"},
		{"::ffff:169.254.169.254", "cloud metadata"},
		{"::ffff:10.1.2.3", "RFC 1918"},
		{"::ffff:0.0.0.0", "unspecified"},
		{"::ffff:8.8.8.8", ""},
		{"64:ff9b::a9fe:a9fe", "NAT64 form of 169.254.169.254"},
		{"64:ff9b::7f00:1", "NAT64 form of 127.0.0.1"},
		{"64:ff9b::808:808", ""},
		{"64:ff9b:1::1", "local-use NAT64"},
		{"2002:7f00:1::1", "6to4 form of 127.0.0.1"},
		{"2002:0808:0808::1", ""},
		{"2606:4700:4700::1111", ""},
		{"2a00:1450:4001::1", ""},
	}
	for _, c := range cases {
		ip := netip.MustParseAddr(c.ip)
		for _, host := range []string{"api.example.com", c.ip} {
			d := open.CheckIP(host, 443, ip)
			if c.what == "" {
				if !d.Allowed {
					t.Errorf("CheckIP(%s, %s) = %+v, want allowed", host, c.ip, d)
				}
				continue
			}
			if d.Allowed || !strings.Contains(d.Reason, c.what) || !strings.Contains(d.Reason, "to network.allow to permit it") {
				t.Errorf("CheckIP(%s, %s) = %+v, want denied as %q", host, c.ip, d, c.what)
			}
		}
	}
}

func TestCheckIPReasonsAndExemptions(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	p := Policy{Mode: "allowlist", Allow: []string{"api.example.com"}}
	d := p.CheckIP("api.example.com", 443, lo)
	want := "denied: api.example.com resolves to 127.0.0.1, a loopback address; add 127.0.0.1 to network.allow to permit it"
	if d.Allowed || d.Reason != want {
		t.Errorf("got %+v\nwant reason %q", d, want)
	}
	d = p.CheckIP("127.0.0.1", 443, lo)
	if want := "denied: 127.0.0.1 is a loopback address; add 127.0.0.1 to network.allow to permit it"; d.Reason != want {
		t.Errorf("literal: reason %q, want %q", d.Reason, want)
	}
	d = p.CheckIP("api.example.com", 443, netip.MustParseAddr("::ffff:127.0.0.1"))
	if !strings.Contains(d.Reason, "resolves to ::ffff:127.0.0.1 (127.0.0.1), a loopback address; add 127.0.0.1 to") {
		t.Errorf("mapped: reason %q", d.Reason)
	}

	type check struct {
		ip      string
		port    int
		allowed bool
	}
	exempt := []struct {
		allow, deny []string
		checks      []check
	}{
		{[]string{"127.0.0.1"}, nil, []check{{"127.0.0.1", 80, true}, {"::ffff:127.0.0.1", 80, true}, {"127.0.0.2", 80, false}, {"::1", 80, false}}},
		{[]string{"127.0.0.0/8"}, nil, []check{{"127.0.0.2", 80, true}, {"10.0.0.1", 80, false}}},
		{[]string{"127.0.0.1:8080"}, nil, []check{{"127.0.0.1", 8080, true}, {"127.0.0.1", 8081, false}}},
		{[]string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}, nil, []check{{"10.9.9.9", 5432, true}, {"172.20.0.1", 5432, true}, {"192.168.7.7", 5432, true}, {"169.254.169.254", 80, false}}},
		// A block wider than the special range does not name it.
		{[]string{"0.0.0.0/0", "::/0"}, nil, []check{{"169.254.169.254", 80, false}, {"10.0.0.1", 80, false}, {"::1", 80, false}, {"8.8.8.8", 80, true}}},
		{[]string{"169.254.169.254"}, nil, []check{{"169.254.169.254", 80, true}, {"169.254.169.253", 80, false}}},
		{[]string{"::1"}, nil, []check{{"::1", 80, true}, {"127.0.0.1", 80, false}}},
		{[]string{"fd00::/8"}, nil, []check{{"fd00::5", 443, true}, {"fc00::5", 443, false}}},
		// Deny wins over an explicit allow.
		{[]string{"127.0.0.1"}, []string{"127.0.0.1"}, []check{{"127.0.0.1", 80, false}}},
		{[]string{"10.0.0.0/8"}, []string{"10.0.0.0/16:22"}, []check{{"10.0.1.1", 22, false}, {"10.0.1.1", 80, true}, {"10.1.0.1", 22, true}}},
		// Deny entries apply to resolved public addresses too.
		{nil, []string{"8.8.8.0/24"}, []check{{"8.8.8.8", 443, false}, {"8.8.4.4", 443, true}}},
	}
	for _, e := range exempt {
		p := Policy{Mode: "open", Allow: e.allow, Deny: e.deny}
		for _, c := range e.checks {
			d := p.CheckIP("api.example.com", c.port, netip.MustParseAddr(c.ip))
			if d.Allowed != c.allowed {
				t.Errorf("allow %v deny %v: CheckIP(%s:%d) = %+v, want allowed=%v", e.allow, e.deny, c.ip, c.port, d, c.allowed)
			}
		}
	}
}
