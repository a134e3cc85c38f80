package egress

import (
	"net/netip"
)

// specialRange is an address block the proxy refuses to reach unless the
// policy's allow list names an address or block inside it.
type specialRange struct {
	block netip.Prefix
	what  string // completes "X is ..."
}

func mustRanges(pairs ...string) []specialRange {
	out := make([]specialRange, 0, len(pairs)/2)
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, specialRange{netip.MustParsePrefix(pairs[i]), pairs[i+1]})
	}
	return out
}

// special4 lists the IPv4 blocks that are not public unicast destinations
// (IANA IPv4 Special-Purpose Address Registry, RFC 6890 and successors).
// More specific entries come first: the first match names the address.
var special4 = mustRanges(
	"0.0.0.0/32", "the unspecified address (it reaches the proxy's own host)",
	"0.0.0.0/8", `a "this network" address (0.0.0.0/8)`,
	"10.0.0.0/8", "a private address (RFC 1918)",
	"100.64.0.0/10", "a carrier-grade NAT shared address (100.64.0.0/10)",
	"127.0.0.0/8", "a loopback address",
	"169.254.169.254/32", "the cloud metadata service address (link-local)",
	"169.254.0.0/16", "a link-local address",
	"172.16.0.0/12", "a private address (RFC 1918)",
	"192.0.0.0/24", "an IETF protocol assignment address (192.0.0.0/24)",
	"192.0.2.0/24", "a documentation address (TEST-NET-1)",
	"192.88.99.0/24", "a deprecated 6to4 relay anycast address",
	"192.168.0.0/16", "a private address (RFC 1918)",
	"198.18.0.0/15", "a benchmarking address (198.18.0.0/15)",
	"198.51.100.0/24", "a documentation address (TEST-NET-2)",
	"203.0.113.0/24", "a documentation address (TEST-NET-3)",
	"224.0.0.0/4", "a multicast address",
	"255.255.255.255/32", "the limited broadcast address",
	"240.0.0.0/4", "a reserved address (240.0.0.0/4)",
)

// special6 lists the IPv6 blocks that are not public unicast destinations.
// IPv4-mapped addresses (::ffff:0:0/96) never reach this table: they are
// unmapped and judged as IPv4. NAT64 (64:ff9b::/96) and 6to4 (2002::/16)
// addresses are judged by the IPv4 address they embed, in classify.
var special6 = mustRanges(
	"::/128", "the unspecified address (it reaches the proxy's own host)",
	"::1/128", "a loopback address",
	"::/96", "a deprecated IPv4-compatible address (::/96)",
	"64:ff9b:1::/48", "a local-use NAT64 address (64:ff9b:1::/48)",
	"100::/64", "a discard-only address (100::/64)",
	"2001::/23", "an IETF protocol assignment address (2001::/23, includes Teredo)",
	"2001:db8::/32", "a documentation address (2001:db8::/32)",
	"3fff::/20", "a documentation address (3fff::/20)",
	"fc00::/7", "a unique local (private) address (fc00::/7)",
	"fe80::/10", "a link-local address (fe80::/10)",
	"fec0::/10", "a deprecated site-local address (fec0::/10)",
	"ff00::/8", "a multicast address",
	// Everything outside 2000::/3 is unassigned or reserved for other uses.
	"::/3", "a reserved, non-global address",
	"4000::/2", "a reserved, non-global address",
	"8000::/1", "a reserved, non-global address",
)

var (
	nat64WKP  = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// classification says why an address is special.
type classification struct {
	// what completes "X is ..." or "X resolves to A, ...".
	what string
	// block is the special block the address lies in. An allow entry
	// exempts the address only if it lies entirely inside this block, so
	// "0.0.0.0/0" does not open the metadata service.
	block netip.Prefix
}

// classify reports whether a is a special (non-public) destination. a must
// already be unmapped.
func classify(a netip.Addr) (classification, bool) {
	if a.Is4() {
		for _, r := range special4 {
			if r.block.Contains(a) {
				return classification{r.what, r.block}, true
			}
		}
		return classification{}, false
	}
	// NAT64 and 6to4 carry an IPv4 address; judge that one.
	if nat64WKP.Contains(a) {
		b := a.As16()
		return classifyEmbedded(a, netip.AddrFrom4([4]byte(b[12:16])), 96, "the NAT64 form of ")
	}
	if sixToFour.Contains(a) {
		b := a.As16()
		return classifyEmbedded(a, netip.AddrFrom4([4]byte(b[2:6])), 16, "the 6to4 form of ")
	}
	for _, r := range special6 {
		if r.block.Contains(a) {
			return classification{r.what, r.block}, true
		}
	}
	return classification{}, false
}

// classifyEmbedded judges an IPv6 address a that embeds the IPv4 address
// v4 at bit offset off.
func classifyEmbedded(a, v4 netip.Addr, off int, form string) (classification, bool) {
	c, ok := classify(v4)
	if !ok {
		return classification{}, false
	}
	blk, _ := a.Prefix(off + c.block.Bits())
	return classification{form + v4.String() + ", " + c.what, blk}, true
}
