// Package agenttls secures the connection from an airlock server to the
// agent of a sandbox that runs as a Kubernetes pod.
//
// The server reaches each agent over the pod network at <pod IP>:7070. The
// pod IP says nothing about who answers (IPs are reused, and any pod of the
// cluster could listen there), so both ends prove themselves:
//
//   - the agent presents a TLS 1.3 certificate issued by the cluster's own CA
//     (NewCA, kept in the Secret "airlock-ca") whose only name is the
//     sandbox's id (a DNS SAN): the client verifies the chain against that CA
//     and the name against the sandbox it meant to reach, whatever the IP;
//   - the client then sends a preamble holding the sandbox's random token,
//     which the agent compares in constant time before it reads a single
//     frame of the agent protocol. A client without the token gets a one-byte
//     refusal and a closed connection, nothing else.
//
// The CA, the leaf certificate and the token of a sandbox live in its Secret
// "airlock-<id>-tls" (Bundle.SecretData), mounted read-only into the pod at
// /airlock-tls (LoadServer reads it there).
package agenttls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Names of the Kubernetes objects and their keys.
const (
	// CASecretName is the Secret holding the cluster CA, in the server's
	// namespace (keys CACertKey and CAKeyKey).
	CASecretName = "airlock-ca"
	// CAKeyKey holds the CA's private key (PKCS#8 PEM) in the CA Secret.
	CAKeyKey = "ca.key"
	// CACertKey holds the CA certificate (PEM), in both Secrets.
	CACertKey = "ca.crt"
	// CertKey holds the agent's certificate (PEM) in a sandbox Secret.
	CertKey = "tls.crt"
	// KeyKey holds the agent's private key (PKCS#8 PEM) in a sandbox Secret.
	KeyKey = "tls.key"
	// TokenKey holds the sandbox's token (hex) in a sandbox Secret.
	TokenKey = "token"
)

// AgentPort is the TCP port the agent listens on in a sandbox pod.
const AgentPort = 7070

// SecretName returns the name of the per-sandbox Secret of sandbox id.
func SecretName(id string) string { return "airlock-" + id + "-tls" }

// Validity defaults.
const (
	// CAValidity is how long a new cluster CA is valid.
	CAValidity = 10 * 365 * 24 * time.Hour
	// LeafValidity is how long a sandbox certificate is valid by default.
	LeafValidity = 365 * 24 * time.Hour
)

// tokenBytes is the size of a sandbox token.
const tokenBytes = 32

// CA is the cluster's certificate authority for agent certificates.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
}

// NewCA creates a CA (ECDSA P-256) valid for validity (CAValidity if zero).
func NewCA(validity time.Duration) (*CA, error) {
	if validity <= 0 {
		validity = CAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("agenttls: generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"airlock"}, CommonName: "airlock agent CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("agenttls: sign CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("agenttls: parse CA certificate: %w", err)
	}
	return &CA{cert: cert, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}, nil
}

// CertPEM returns the CA certificate in PEM form.
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.certPEM...) }

// SecretData returns the data of the Secret CASecretName: the certificate
// and the private key.
func (ca *CA) SecretData() (map[string][]byte, error) {
	keyPEM, err := marshalKey(ca.key)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{CACertKey: ca.CertPEM(), CAKeyKey: keyPEM}, nil
}

// ParseCA reads a CA from the data of the Secret CASecretName.
func ParseCA(data map[string][]byte) (*CA, error) {
	cert, err := parseCert(data[CACertKey])
	if err != nil {
		return nil, fmt.Errorf("agenttls: CA secret %s: %w", CACertKey, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("agenttls: CA secret %s: not a CA certificate", CACertKey)
	}
	key, err := parseKey(data[CAKeyKey])
	if err != nil {
		return nil, fmt.Errorf("agenttls: CA secret %s: %w", CAKeyKey, err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("agenttls: CA secret: the key does not match the certificate")
	}
	return &CA{cert: cert, certPEM: append([]byte(nil), data[CACertKey]...), key: key}, nil
}

// Bundle is what one sandbox's Secret holds.
type Bundle struct {
	// SandboxID is the name the certificate is issued to.
	SandboxID string
	// CACert, Cert and Key are PEM.
	CACert, Cert, Key []byte
	// Token is the sandbox's random token, hex.
	Token string
}

// Issue creates the certificate and token of sandbox id, valid for validity
// (LeafValidity if zero). The id must be a valid DNS label or name, as
// sandbox ids are: it is the certificate's only name.
func (ca *CA) Issue(id string, validity time.Duration) (*Bundle, error) {
	if err := checkName(id); err != nil {
		return nil, err
	}
	if validity <= 0 {
		validity = LeafValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("agenttls: generate key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notAfter := now.Add(validity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"airlock"}, CommonName: id},
		DNSNames:     []string{id},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("agenttls: sign certificate for %q: %w", id, err)
	}
	keyPEM, err := marshalKey(key)
	if err != nil {
		return nil, err
	}
	tok := make([]byte, tokenBytes)
	if _, err := rand.Read(tok); err != nil {
		return nil, fmt.Errorf("agenttls: generate token: %w", err)
	}
	return &Bundle{
		SandboxID: id,
		CACert:    ca.CertPEM(),
		Cert:      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:       keyPEM,
		Token:     hex.EncodeToString(tok),
	}, nil
}

// SecretData returns the data of the sandbox's Secret (SecretName): keys
// ca.crt, tls.crt, tls.key and token.
func (b *Bundle) SecretData() map[string][]byte {
	return map[string][]byte{
		CACertKey: append([]byte(nil), b.CACert...),
		CertKey:   append([]byte(nil), b.Cert...),
		KeyKey:    append([]byte(nil), b.Key...),
		TokenKey:  []byte(b.Token),
	}
}

// ClientCreds returns what a server needs to dial the sandbox.
func (b *Bundle) ClientCreds() (*ClientCreds, error) {
	return NewClientCreds(b.SandboxID, b.SecretData())
}

// String describes b without its key or token.
func (b *Bundle) String() string { return fmt.Sprintf("agenttls.Bundle{SandboxID:%q}", b.SandboxID) }

// GoString describes b without its key or token.
func (b *Bundle) GoString() string { return b.String() }

func randomSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("agenttls: serial number: %w", err)
	}
	return s, nil
}

func marshalKey(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("agenttls: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func parseKey(p []byte) (*ecdsa.PrivateKey, error) {
	b, _ := pem.Decode(p)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, errors.New("no PEM PRIVATE KEY block")
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse key: %w", err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("key is %T, want ECDSA", k)
	}
	return ek, nil
}

func parseCert(p []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(p)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	return c, nil
}

// checkName accepts a DNS name of lower-case labels (RFC 1123).
func checkName(id string) error {
	if id == "" || len(id) > 253 {
		return fmt.Errorf("agenttls: sandbox id %q is not a DNS name (1 to 253 characters)", id)
	}
	label := 0
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			label++
		case c == '-' && label > 0 && i+1 < len(id) && id[i+1] != '.':
			label++
		case c == '.' && label > 0:
			label = 0
			continue
		default:
			return fmt.Errorf("agenttls: sandbox id %q is not a DNS name (lower-case letters, digits, inner '-' and '.')", id)
		}
		if label > 63 {
			return fmt.Errorf("agenttls: sandbox id %q has a label longer than 63 characters", id)
		}
	}
	if label == 0 {
		return fmt.Errorf("agenttls: sandbox id %q ends with '.'", id)
	}
	return nil
}
