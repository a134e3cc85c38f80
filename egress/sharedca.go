package egress

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"
)

// SandboxCA is a sandbox's interception CA in PEM form: the certificate
// and its PKCS#8 private key. A proxy run as several replicas (the cluster
// egress proxy) gets it from outside (Sandbox.CA), so that every replica,
// and a replica restarted, signs with the CA the sandbox trusts. Its String
// form hides the key.
type SandboxCA struct {
	CertPEM []byte
	KeyPEM  []byte
}

// String describes the CA without its key.
func (c *SandboxCA) String() string { return "egress.SandboxCA{key:[redacted]}" }

// GoString describes the CA without its key.
func (c *SandboxCA) GoString() string { return c.String() }

// NewSandboxCA creates the CA that AddSandbox would create for a sandbox
// with these secrets (constrained to their hosts), valid for validity (30
// days if zero), for use as Sandbox.CA.
func NewSandboxCA(sandboxID string, secrets []Secret, validity time.Duration) (*SandboxCA, error) {
	secs, err := compileSecrets(secrets)
	if err != nil {
		return nil, fmt.Errorf("egress: sandbox CA for %q: %w", sandboxID, err)
	}
	if validity <= 0 {
		validity = 30 * 24 * time.Hour
	}
	rules := make([]rule, len(secs))
	for i, sec := range secs {
		rules[i] = sec.host
	}
	a, err := newAuthority(sandboxID, rules, validity)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(a.key)
	if err != nil {
		return nil, fmt.Errorf("egress: encode CA key: %w", err)
	}
	return &SandboxCA{CertPEM: a.certPEM, KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})}, nil
}

// parseAuthority loads a CA made by NewSandboxCA. It must be a CA whose
// names are constrained, as NewSandboxCA makes them, and its key must
// match.
func parseAuthority(c *SandboxCA) (*authority, error) {
	cb, _ := pem.Decode(c.CertPEM)
	kb, _ := pem.Decode(c.KeyPEM)
	if cb == nil || cb.Type != "CERTIFICATE" || kb == nil || kb.Type != "PRIVATE KEY" {
		return nil, errors.New("CA: want a PEM CERTIFICATE and a PEM PRIVATE KEY")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.IsCA || !cert.PermittedDNSDomainsCritical || len(cert.PermittedDNSDomains) == 0 {
		return nil, errors.New("CA certificate: not a name-constrained CA (make it with NewSandboxCA)")
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("CA key: does not match the certificate")
	}
	return &authority{cert: cert, certDER: cb.Bytes, certPEM: pem.EncodeToMemory(cb), key: key, leaves: make(map[string]*tls.Certificate)}, nil
}
