package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
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
	cert    *x509.Certificate
	certDER []byte
	certPEM []byte
	key     *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// newAuthority creates a CA for sandboxID valid for validity, constrained
// to the given secret rules.
func newAuthority(sandboxID string, rules []rule, validity time.Duration) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress: generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"airlock"}, CommonName: "airlock egress CA for sandbox " + truncate(sandboxID, 40)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
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
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("egress: create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("egress: parse CA certificate: %w", err)
	}
	return &authority{
		cert:    cert,
		certDER: der,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:     key,
		leaves:  make(map[string]*tls.Certificate),
	}, nil
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
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress: generate key for %s: %w", host, err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(leafLifetime)
	if notAfter.After(a.cert.NotAfter) {
		notAfter = a.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = []net.IP{ip.AsSlice()}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, fmt.Errorf("egress: sign certificate for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("egress: parse certificate for %s: %w", host, err)
	}
	c := &tls.Certificate{Certificate: [][]byte{der, a.certDER}, PrivateKey: key, Leaf: leaf}
	if len(a.leaves) >= maxLeaves {
		clear(a.leaves) // a wildcard secret can mint one leaf per subdomain
	}
	a.leaves[host] = c
	return c, nil
}

func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("egress: certificate serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
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
