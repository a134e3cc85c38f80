// Package certreload holds a TLS server certificate read from a PEM
// certificate file and a PEM key file, and reads them again on request
// (airlock serve does on SIGHUP) without dropping a connection: handshakes
// after a successful Reload present the new certificate; a Reload that
// fails keeps the old one and says why.
package certreload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Reloader serves the certificate of CertFile and KeyFile.
type Reloader struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

// New reads the pair; it fails if either file is unreadable, the key is
// not the certificate's, or the certificate has expired or is not yet
// valid.
func New(certFile, keyFile string) (*Reloader, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("certreload: both a certificate file and a key file are required")
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload reads the files again and, if they hold a valid pair, serves it
// from the next handshake on. On error the previous pair stays.
func (r *Reloader) Reload() error {
	c, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("certreload: %w", err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return fmt.Errorf("certreload: %s: %w", r.certFile, err)
	}
	now := time.Now()
	if now.After(leaf.NotAfter) {
		return fmt.Errorf("certreload: %s expired at %s", r.certFile, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if now.Before(leaf.NotBefore) {
		return fmt.Errorf("certreload: %s is not valid before %s", r.certFile, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	c.Leaf = leaf
	r.cur.Store(&c)
	return nil
}

// Leaf is the certificate served now.
func (r *Reloader) Leaf() *x509.Certificate { return r.cur.Load().Leaf }

// GetCertificate implements tls.Config.GetCertificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cur.Load(), nil
}

// Config is a server tls.Config (TLS 1.2 or later) serving the pair.
func (r *Reloader) Config() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.GetCertificate}
}
