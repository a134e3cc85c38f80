package agenttls

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlock-dev/airlock/internal/pki"
)

// Enrollment: the agent of a pooled pod (a warm pool's, made before the
// sandbox it will serve exists) starts with the cluster CA's certificate
// alone, so it cannot mount that sandbox's Secret. Once the pod is claimed,
// a server hands it the sandbox's certificate, key and token over a
// one-time bootstrap channel:
//
//   - the pooled agent (Pooled) answers TLS 1.3 with a throwaway self-signed
//     certificate and demands a client certificate of the cluster CA whose
//     only name is EnrollName and whose use is client authentication. Only
//     a server can present one: it is issued from the CA's key, which lives
//     in the Secret airlock-ca and is never mounted in a pod. A sandbox's own
//     certificate (server authentication, named by its id) does not pass,
//     so a claimed sandbox cannot enroll another pooled pod;
//   - the server (Enroller.Enroll) sends the sandbox's Bundle, which must be
//     of the same CA; the agent checks it as LoadServer does, answers
//     replyOK and from then on is exactly an agent started with that
//     Secret: token or nothing. A second enrollment is refused.
//
// Before enrollment the agent serves nothing: no frame of the agent
// protocol, whatever the client presents.

// EnrollName is the only name on an enroller's certificate. It is not a
// sandbox id (ids are sb- and hex digits; .invalid is reserved).
const EnrollName = "enroll.airlock.invalid"

// enrollMagic starts an enrollment message: the magic, a big-endian uint32
// length, then that many bytes of JSON (the Bundle's Secret data).
const enrollMagic = "ALE1"

// maxEnrollment bounds an enrollment message.
const maxEnrollment = 64 << 10

// ErrEnrolled is what Pooled.Authenticate returns for the connection that
// enrolled it: the enrollment succeeded, and that connection ends there
// (the server dials again with the token).
var ErrEnrolled = errors.New("enrolled")

// ErrEnrollRefused is what Enroller.Enroll wraps when the pooled agent
// answered the enrollment with a refusal (it is enrolled already, or the
// bundle is not of its CA): trying again will not help.
var ErrEnrollRefused = errors.New("the agent refused the enrollment")

// ErrAlreadyEnrolled reports an enrollment of an agent that has one.
var ErrAlreadyEnrolled = errors.New("the agent is already enrolled")

// Enroller is a server's credential to enroll pooled agents.
type Enroller struct {
	cert tls.Certificate
	ca   []byte // the CA certificate, PEM
}

// Enroller issues a client certificate named EnrollName, valid for
// validity (a day if zero), for this process to enroll pooled agents.
func (ca *CA) Enroller(validity time.Duration) (*Enroller, error) {
	if validity <= 0 {
		validity = 24 * time.Hour
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("agenttls: enroller key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("agenttls: enroller serial: %w", err)
	}
	now := time.Now()
	notAfter := now.Add(validity)
	if notAfter.After(ca.a.Cert.NotAfter) {
		notAfter = ca.a.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"airlock"}, CommonName: EnrollName},
		DNSNames:     []string{EnrollName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.a.Cert, &key.PublicKey, ca.a.Key)
	if err != nil {
		return nil, fmt.Errorf("agenttls: sign the enroller certificate: %w", err)
	}
	return &Enroller{cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, ca: ca.CertPEM()}, nil
}

// Enroll connects to the pooled agent at addr and hands it b. It cannot
// tell which pooled pod answers at addr (a pooled agent has no identity of
// its own): the caller must take addr from the API server's record of the
// claimed pod. ctx bounds the exchange (HandshakeTimeout if it has no
// deadline).
func (e *Enroller) Enroll(ctx context.Context, addr string, b *Bundle) error {
	fail := func(err error) error {
		return fmt.Errorf("agenttls: enroll %s as sandbox %q: %w", addr, b.SandboxID, err)
	}
	if !bytes.Equal(bytes.TrimSpace(b.CACert), bytes.TrimSpace(e.ca)) {
		return fail(errors.New("the bundle is of another CA than the enroller"))
	}
	msg, err := json.Marshal(b.SecretData())
	if err != nil {
		return fail(err)
	}
	ctx, cancel := handshakeContext(ctx)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fail(err)
	}
	defer raw.Close()
	// The pooled agent's certificate is self-signed and throwaway: there
	// is nothing to verify it against (see the doc comment).
	conn := tls.Client(raw, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true,
		Certificates: []tls.Certificate{e.cert}})
	if err := conn.HandshakeContext(ctx); err != nil {
		return fail(fmt.Errorf("TLS handshake: %w", err))
	}
	dl, _ := ctx.Deadline()
	conn.SetDeadline(dl)
	out := make([]byte, 0, len(enrollMagic)+4+len(msg))
	out = append(out, enrollMagic...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(msg)))
	out = append(out, msg...)
	if _, err := conn.Write(out); err != nil {
		return fail(fmt.Errorf("sending the enrollment: %w", err))
	}
	var reply [1]byte
	if _, err := io.ReadFull(conn, reply[:]); err != nil {
		return fail(fmt.Errorf("%w (closed: %v)", ErrEnrollRefused, err))
	}
	if reply[0] != replyOK {
		return fail(ErrEnrollRefused)
	}
	return nil
}

// Pooled is the agent's side before and after enrollment.
type Pooled struct {
	caPEM []byte
	boot  *tls.Config

	mu  sync.Mutex
	srv *Server
}

// LoadPooled reads the cluster CA's certificate (ca.crt) from dir.
func LoadPooled(dir string) (*Pooled, error) {
	b, err := os.ReadFile(filepath.Join(dir, CACertKey))
	if err != nil {
		return nil, fmt.Errorf("agenttls: %w", err)
	}
	return NewPooled(b)
}

// NewPooled returns a pooled agent's side that only an enroller of the CA
// whose certificate is caPEM can enroll.
func NewPooled(caPEM []byte) (*Pooled, error) {
	ca, err := pki.ParseCertPEM(caPEM)
	if err != nil {
		return nil, fmt.Errorf("agenttls: pool %s: %w", CACertKey, err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	// A throwaway identity for the bootstrap handshake.
	self, err := pki.NewAuthority("airlock pooled agent", 7*24*time.Hour, nil)
	if err != nil {
		return nil, fmt.Errorf("agenttls: pooled agent key: %w", err)
	}
	leaf, err := self.Issue("pooled.airlock.invalid", 7*24*time.Hour)
	if err != nil {
		return nil, fmt.Errorf("agenttls: pooled agent certificate: %w", err)
	}
	boot := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{leaf.DER}, PrivateKey: leaf.Key}},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    roots,
		VerifyPeerCertificate: func(_ [][]byte, chains [][]*x509.Certificate) error {
			if len(chains) == 0 || len(chains[0]) == 0 {
				return errors.New("no verified client certificate")
			}
			c := chains[0][0]
			if len(c.DNSNames) != 1 || c.DNSNames[0] != EnrollName || len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
				return fmt.Errorf("the client certificate is not an enroller's (names %v)", c.DNSNames)
			}
			return nil
		},
	}
	return &Pooled{caPEM: caPEM, boot: boot}, nil
}

// SandboxID is the sandbox the agent was enrolled as ("" before).
func (p *Pooled) SandboxID() string {
	if s := p.server(); s != nil {
		return s.SandboxID()
	}
	return ""
}

func (p *Pooled) server() *Server {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.srv
}

// Authenticate is Server.Authenticate once enrolled. Before, it accepts
// only an enrollment (see Enroller) and returns ErrEnrolled for the
// connection that carried it, or an error for anything else; either way
// it has closed raw, and no connection is ever handed to the agent
// protocol before enrollment.
func (p *Pooled) Authenticate(raw net.Conn) (net.Conn, error) {
	if s := p.server(); s != nil {
		return s.Authenticate(raw)
	}
	peer := raw.RemoteAddr().String()
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(HandshakeTimeout))
	conn := tls.Server(raw, p.boot)
	if err := conn.Handshake(); err != nil {
		return nil, fmt.Errorf("agenttls: client %s: not enrolled yet, and the bootstrap handshake failed: %w", peer, err)
	}
	refuse := func(err error) (net.Conn, error) {
		conn.Write([]byte{replyRefused})
		conn.Close()
		return nil, fmt.Errorf("agenttls: client %s: enrollment refused: %w", peer, err)
	}
	var hdr [len(enrollMagic) + 4]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		return refuse(fmt.Errorf("reading the enrollment: %w", err))
	}
	if string(hdr[:len(enrollMagic)]) != enrollMagic {
		return refuse(errors.New("not an enrollment message"))
	}
	n := binary.BigEndian.Uint32(hdr[len(enrollMagic):])
	if n == 0 || n > maxEnrollment {
		return refuse(fmt.Errorf("enrollment of %d bytes", n))
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(conn, body); err != nil {
		return refuse(fmt.Errorf("reading the enrollment: %w", err))
	}
	var data map[string][]byte
	if err := json.Unmarshal(body, &data); err != nil {
		return refuse(fmt.Errorf("enrollment: %w", err))
	}
	if !bytes.Equal(bytes.TrimSpace(data[CACertKey]), bytes.TrimSpace(p.caPEM)) {
		return refuse(errors.New("the bundle is of another CA"))
	}
	srv, err := NewServer(data)
	if err != nil {
		return refuse(err)
	}
	p.mu.Lock()
	if p.srv != nil {
		p.mu.Unlock()
		return refuse(ErrAlreadyEnrolled)
	}
	p.srv = srv
	p.mu.Unlock()
	if _, err := conn.Write([]byte{replyOK}); err != nil {
		// Enrolled all the same: the server's next dial with the token
		// works, or its enrollment attempt fails and it gives the pod up.
		conn.Close()
		return nil, fmt.Errorf("agenttls: enrolled as sandbox %s, but the reply to %s failed: %w", srv.SandboxID(), peer, err)
	}
	conn.Close()
	return nil, fmt.Errorf("agenttls: %w as sandbox %s by %s; that connection ends, clients dial with the token", ErrEnrolled, srv.SandboxID(), peer)
}
