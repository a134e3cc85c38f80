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
	"crypto/rand"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"time"

	"github.com/airlock-dev/airlock/internal/pki"
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
	a *pki.Authority
}

// NewCA creates a CA (ECDSA P-256) valid for validity (CAValidity if zero).
func NewCA(validity time.Duration) (*CA, error) {
	if validity <= 0 {
		validity = CAValidity
	}
	a, err := pki.NewAuthority("airlock agent CA", validity, nil)
	if err != nil {
		return nil, fmt.Errorf("agenttls: %w", err)
	}
	return &CA{a: a}, nil
}

// CertPEM returns the CA certificate in PEM form.
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.a.CertPEM...) }

// SecretData returns the data of the Secret CASecretName: the certificate
// and the private key.
func (ca *CA) SecretData() (map[string][]byte, error) {
	keyPEM, err := pki.KeyPEM(ca.a.Key)
	if err != nil {
		return nil, fmt.Errorf("agenttls: %w", err)
	}
	return map[string][]byte{CACertKey: ca.CertPEM(), CAKeyKey: keyPEM}, nil
}

// ParseCA reads a CA from the data of the Secret CASecretName.
func ParseCA(data map[string][]byte) (*CA, error) {
	a, err := pki.ParseAuthority(data[CACertKey], data[CAKeyKey])
	if err != nil {
		return nil, fmt.Errorf("agenttls: CA secret (%s, %s): %w", CACertKey, CAKeyKey, err)
	}
	return &CA{a: a}, nil
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
	leaf, err := ca.a.Issue(id, validity)
	if err != nil {
		return nil, fmt.Errorf("agenttls: %w", err)
	}
	keyPEM, err := pki.KeyPEM(leaf.Key)
	if err != nil {
		return nil, fmt.Errorf("agenttls: %w", err)
	}
	tok := make([]byte, tokenBytes)
	if _, err := rand.Read(tok); err != nil {
		return nil, fmt.Errorf("agenttls: generate token: %w", err)
	}
	return &Bundle{
		SandboxID: id,
		CACert:    ca.CertPEM(),
		Cert:      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.DER}),
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
