package egress

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/internal/pki"
)

// leafLifetime bounds how long a minted host certificate is valid; leaves
// are re-minted when less than leafRenew of it remains.
const (
	leafLifetime = 24 * time.Hour
	leafRenew    = time.Hour
	maxLeaves    = 1024
)

// authority is a sandbox's own certificate authority. It signs leaf
// certificates for the hosts that have a credential injection rule and for
// nothing else: its name constraints permit only those hosts, so a client
// that enforces constraints rejects anything else it might sign.
type authority struct {
	*pki.Authority

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// newAuthority creates a CA for sandboxID valid for validity, constrained
// to the given secret rules.
func newAuthority(sandboxID string, rules []rule, validity time.Duration) (*authority, error) {
	a, err := pki.NewAuthority("airlock egress CA for sandbox "+truncate(sandboxID, 40), validity, func(tmpl *x509.Certificate) {
		tmpl.PermittedDNSDomainsCritical = true
		for _, r := range rules {
			switch r.kind {
			case kindName:
				tmpl.PermittedDNSDomains = append(tmpl.PermittedDNSDomains, r.name)
			case kindWildcard:
				tmpl.PermittedDNSDomains = append(tmpl.PermittedDNSDomains, "."+r.name)
			case kindAddr:
				tmpl.PermittedIPRanges = append(tmpl.PermittedIPRanges, prefixNet(r.prefix))
			}
		}
		if len(tmpl.PermittedDNSDomains) == 0 {
			// An empty permitted list means "any"; permit only the reserved
			// .invalid domain (RFC 6761) instead, which names nothing.
			tmpl.PermittedDNSDomains = []string{"invalid"}
		}
		if len(tmpl.PermittedIPRanges) == 0 {
			tmpl.ExcludedIPRanges = []*net.IPNet{
				{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
				{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	return &authority{Authority: a, leaves: make(map[string]*tls.Certificate)}, nil
}

// leaf returns a certificate for host (a normalized name or an IP
// literal), minting and caching it on first use.
func (a *authority) leaf(host string) (*tls.Certificate, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if c, ok := a.leaves[host]; ok && now.Add(leafRenew).Before(c.Leaf.NotAfter) {
		return c, nil
	}
	l, err := a.Issue(host, leafLifetime)
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	c := &tls.Certificate{Certificate: [][]byte{l.DER, a.CertDER}, PrivateKey: l.Key, Leaf: l.Cert}
	if len(a.leaves) >= maxLeaves {
		clear(a.leaves) // a wildcard secret can mint one leaf per subdomain
	}
	a.leaves[host] = c
	return c, nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
