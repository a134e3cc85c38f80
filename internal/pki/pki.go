// Package pki makes the small ECDSA P-256 certificate authorities airlock
// runs itself (the egress proxy's per-sandbox interception CAs, the
// Kubernetes backend's agent CA) and the server certificates they sign, and
// reads and writes their PEM forms.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"time"
)

// backdate is how far before now certificates start, for clocks that lag.
const backdate = time.Hour

// Authority is a CA: its certificate (parsed, DER and PEM) and key.
type Authority struct {
	Cert    *x509.Certificate
	CertDER []byte
	CertPEM []byte
	Key     *ecdsa.PrivateKey
}

// NewAuthority creates a self-signed CA named commonName, valid for
// validity, that signs only leaf certificates (path length zero).
// constrain, if not nil, edits the template before it is signed (name
// constraints).
func NewAuthority(commonName string, validity time.Duration, constrain func(*x509.Certificate)) (*Authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"airlock"}, CommonName: commonName},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	if constrain != nil {
		constrain(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: sign CA certificate: %w", err)
	}
	return newAuthority(der, key)
}

// ParseAuthority reads a CA from its PEM certificate and PEM PKCS#8 key,
// checking that it is a CA and that the key is the certificate's.
func ParseAuthority(certPEM, keyPEM []byte) (*Authority, error) {
	cert, err := ParseCertPEM(certPEM)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, errors.New("pki: not a CA certificate")
	}
	key, err := ParseKeyPEM(keyPEM)
	if err != nil {
		return nil, err
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("pki: the key does not match the CA certificate")
	}
	return newAuthority(cert.Raw, key)
}

func newAuthority(der []byte, key *ecdsa.PrivateKey) (*Authority, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse CA certificate: %w", err)
	}
	return &Authority{Cert: cert, CertDER: der, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Key: key}, nil
}

// Leaf is a server certificate signed by an Authority.
type Leaf struct {
	DER  []byte
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// Issue signs a server certificate for host, a DNS name or an IP literal
// (its only name), valid for validity but never past the CA itself.
func (a *Authority) Issue(host string, validity time.Duration) (*Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate key for %s: %w", host, err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notAfter := now.Add(validity)
	if notAfter.After(a.Cert.NotAfter) {
		notAfter = a.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"airlock"}, CommonName: host},
		NotBefore:    now.Add(-backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = []net.IP{ip.AsSlice()}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, &key.PublicKey, a.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: sign certificate for %s: %w", host, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse certificate for %s: %w", host, err)
	}
	return &Leaf{DER: der, Cert: cert, Key: key}, nil
}

// KeyPEM encodes a key as a PEM PKCS#8 PRIVATE KEY block.
func KeyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("pki: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseKeyPEM reads an ECDSA key from a PEM PKCS#8 PRIVATE KEY block.
func ParseKeyPEM(p []byte) (*ecdsa.PrivateKey, error) {
	b, _ := pem.Decode(p)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, errors.New("pki: no PEM PRIVATE KEY block")
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: parse key: %w", err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("pki: key is %T, want ECDSA", k)
	}
	return ek, nil
}

// ParseCertPEM reads a certificate from a PEM CERTIFICATE block.
func ParseCertPEM(p []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(p)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("pki: no PEM CERTIFICATE block")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: parse certificate: %w", err)
	}
	return c, nil
}

// randomSerial is a random positive 127-bit serial number.
func randomSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("pki: certificate serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}
