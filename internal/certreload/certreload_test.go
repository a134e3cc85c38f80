package certreload

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writePair writes a self-signed certificate for 127.0.0.1 valid from
// notBefore to notAfter, and its key, as cert.pem and key.pem in dir.
func writePair(t *testing.T, dir string, notBefore, notAfter time.Time) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "127.0.0.1"}, NotBefore: notBefore, NotAfter: notAfter,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cert.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "key.pem"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c
}

// served is the certificate a real TLS client gets from addr, trusting
// only want.
func served(t *testing.T, addr string, want *x509.Certificate) (*x509.Certificate, error) {
	pool := x509.NewCertPool()
	pool.AddCert(want)
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0], nil
}

// Reload swaps the served certificate; a failed reload (a key of another
// certificate, an expired certificate) keeps the one served.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	first := writePair(t, dir, now.Add(-time.Minute), now.Add(time.Hour))
	r, err := New(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", r.Config())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(ln)
	defer srv.Close()
	addr := ln.Addr().String()
	if got, err := served(t, addr, first); err != nil || got.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Fatalf("first: %v %v", got, err)
	}
	second := writePair(t, dir, now.Add(-time.Minute), now.Add(time.Hour))
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if got, err := served(t, addr, second); err != nil || got.SerialNumber.Cmp(second.SerialNumber) != 0 {
		t.Fatalf("after reload: %v %v", got, err)
	}

	// Another certificate's key: refused, the second pair stays.
	keep, _ := os.ReadFile(filepath.Join(dir, "key.pem"))
	other := t.TempDir()
	writePair(t, other, now, now.Add(time.Hour))
	otherKey, _ := os.ReadFile(filepath.Join(other, "key.pem"))
	os.WriteFile(filepath.Join(dir, "key.pem"), otherKey, 0o600)
	if err := r.Reload(); err == nil {
		t.Fatal("a key of another certificate was accepted")
	}
	os.WriteFile(filepath.Join(dir, "key.pem"), keep, 0o600)
	// Expired: refused.
	writePair(t, dir, now.Add(-2*time.Hour), now.Add(-time.Hour))
	if err := r.Reload(); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired certificate: %v", err)
	}
	if got, err := served(t, addr, second); err != nil || got.SerialNumber.Cmp(second.SerialNumber) != 0 {
		t.Fatalf("after failed reloads: %v %v, want the second certificate", got, err)
	}
	// Not valid yet, and half a pair: refused at New.
	writePair(t, dir, now.Add(time.Hour), now.Add(2*time.Hour))
	if _, err := New(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")); err == nil || !strings.Contains(err.Error(), "not valid before") {
		t.Fatalf("future certificate: %v", err)
	}
	if _, err := New(filepath.Join(dir, "cert.pem"), ""); err == nil {
		t.Fatal("half a pair accepted")
	}
}
