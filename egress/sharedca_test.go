package egress

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
)

// TestSharedSandboxCA: two proxies (replicas of the cluster proxy) given
// the same SandboxCA both intercept with it, so a sandbox trusting that one
// CA gets its secret injected through either; a CA that is not
// name-constrained, or whose key does not match, is refused.
func TestSharedSandboxCA(t *testing.T) {
	u := startUpstreams(t)
	sb := injectSandbox("secure.test")
	ca, err := NewSandboxCA("sb-shared", sb.Secrets, 0)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(fmt.Sprint(ca), "PRIVATE") {
		t.Fatal("SandboxCA prints its key")
	}
	sb.CA = ca
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM)
	for i := 0; i < 2; i++ {
		tp := startProxy(t, u, sb)
		if got := string(tp.p.CACertPEM(tp.id)); got != string(ca.CertPEM) {
			t.Fatalf("replica %d uses another CA", i)
		}
		code, body, _ := tp.get(t, roots, fmt.Sprintf("https://secure.test:%d/auth", u.httpsPort))
		if code != 200 || body != "authorized\n" {
			t.Fatalf("replica %d: %d %q", i, code, body)
		}
	}

	other, _ := NewSandboxCA("sb-other", sb.Secrets, 0)
	p := New(Config{})
	defer p.Close()
	bad := injectSandbox("secure.test")
	bad.CA = &SandboxCA{CertPEM: ca.CertPEM, KeyPEM: other.KeyPEM}
	if err := p.AddSandbox("sb-bad", bad); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("mismatched key: %v", err)
	}
	tc := newTestCA(t) // an unconstrained CA, with its own key
	der, _ := x509.MarshalPKCS8PrivateKey(tc.key)
	bad.CA = &SandboxCA{CertPEM: tc.pem, KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})}
	if err := p.AddSandbox("sb-bad2", bad); err == nil || !strings.Contains(err.Error(), "name-constrained") {
		t.Fatalf("unconstrained CA: %v", err)
	}
}
