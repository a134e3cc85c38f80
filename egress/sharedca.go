package egress

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/airlock-dev/airlock/internal/pki"
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
	keyPEM, err := pki.KeyPEM(a.Key)
	if err != nil {
		return nil, fmt.Errorf("egress: CA for %q: %w", sandboxID, err)
	}
	return &SandboxCA{CertPEM: a.CertPEM, KeyPEM: keyPEM}, nil
}

// parseAuthority loads a CA made by NewSandboxCA. It must be a CA whose
// names are constrained, as NewSandboxCA makes them, and its key must
// match.
func parseAuthority(c *SandboxCA) (*authority, error) {
	a, err := pki.ParseAuthority(c.CertPEM, c.KeyPEM)
	if err != nil {
		return nil, err
	}
	if !a.Cert.PermittedDNSDomainsCritical || len(a.Cert.PermittedDNSDomains) == 0 {
		return nil, errors.New("CA certificate: not a name-constrained CA (make it with NewSandboxCA)")
	}
	return &authority{Authority: a, leaves: make(map[string]*tls.Certificate)}, nil
}
