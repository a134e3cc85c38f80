package agenttls

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/internal/pki"
)

// The token preamble: the client sends preambleMagic and the raw token; the
// agent answers one byte, replyOK or replyRefused (then closes).
const (
	preambleMagic = "ALT1"
	preambleLen   = len(preambleMagic) + tokenBytes
	replyOK       = 'K'
	replyRefused  = 'R'
)

// HandshakeTimeout bounds the TLS handshake plus the token exchange, on
// both ends, when the context has no earlier deadline.
const HandshakeTimeout = 10 * time.Second

// Errors of Dial and Server.Authenticate, wrapped with their context.
var (
	// ErrUntrusted reports that the agent's certificate is not signed by
	// the cluster CA.
	ErrUntrusted = errors.New("the agent's certificate is not signed by the cluster CA")
	// ErrWrongName reports that the agent's certificate is valid but
	// issued to another sandbox.
	ErrWrongName = errors.New("the agent's certificate names another sandbox")
	// ErrTokenRefused reports that the agent refused the client's token.
	ErrTokenRefused = errors.New("the agent refused the token")
	// ErrBadToken reports, on the agent's side, a client whose preamble
	// does not carry the sandbox's token.
	ErrBadToken = errors.New("wrong or missing token")
)

// ClientCreds is what a server needs to dial one sandbox's agent. Its
// String form hides the token.
type ClientCreds struct {
	sandboxID string
	roots     *x509.CertPool
	token     []byte
}

// NewClientCreds builds the credentials for sandbox id from Secret data
// holding at least ca.crt and token (the sandbox's Secret has both).
func NewClientCreds(id string, data map[string][]byte) (*ClientCreds, error) {
	if err := checkName(id); err != nil {
		return nil, err
	}
	ca, err := pki.ParseCertPEM(data[CACertKey])
	if err != nil {
		return nil, fmt.Errorf("agenttls: credentials of %q: %s: %w", id, CACertKey, err)
	}
	tok, err := parseToken(data[TokenKey])
	if err != nil {
		return nil, fmt.Errorf("agenttls: credentials of %q: %w", id, err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return &ClientCreds{sandboxID: id, roots: roots, token: tok}, nil
}

// SandboxID is the name the agent's certificate must carry.
func (c *ClientCreds) SandboxID() string { return c.sandboxID }

// String describes c without its token.
func (c *ClientCreds) String() string {
	return fmt.Sprintf("agenttls.ClientCreds{SandboxID:%q}", c.sandboxID)
}

// GoString describes c without its token.
func (c *ClientCreds) GoString() string { return c.String() }

// Dial connects to the agent at addr (host:port, usually the pod IP and
// 7070), verifies with TLS 1.3 that it holds a certificate of the cluster
// CA for creds' sandbox, and authenticates with the sandbox's token. The
// returned connection carries the agent protocol: pass it to
// agent.NewClient. ctx bounds the dial and the handshake (HandshakeTimeout
// if it has no deadline); it does not affect the connection afterwards.
func Dial(ctx context.Context, addr string, creds *ClientCreds) (net.Conn, error) {
	if creds == nil {
		return nil, errors.New("agenttls: dial: no credentials")
	}
	fail := func(err error) error {
		return fmt.Errorf("agenttls: dial sandbox %q at %s: %w", creds.sandboxID, addr, err)
	}
	ctx, cancel := handshakeContext(ctx)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fail(err)
	}
	conn := tls.Client(raw, &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    creds.roots,
		ServerName: creds.sandboxID,
	})
	if err := conn.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fail(classify(err))
	}
	dl, _ := ctx.Deadline()
	conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	pre := make([]byte, 0, preambleLen)
	pre = append(append(pre, preambleMagic...), creds.token...)
	if _, err := conn.Write(pre); err != nil {
		conn.Close()
		return nil, fail(fmt.Errorf("sending the token: %w", err))
	}
	var reply [1]byte
	if _, err := io.ReadFull(conn, reply[:]); err != nil {
		conn.Close()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fail(fmt.Errorf("%w (the agent closed the connection)", ErrTokenRefused))
		}
		return nil, fail(fmt.Errorf("reading the token reply: %w", err))
	}
	if reply[0] != replyOK {
		conn.Close()
		return nil, fail(ErrTokenRefused)
	}
	if !stop() {
		conn.Close()
		return nil, fail(ctx.Err())
	}
	conn.SetDeadline(time.Time{})
	return conn, nil
}

// handshakeContext is ctx, bounded by HandshakeTimeout if it has no
// deadline.
func handshakeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, HandshakeTimeout)
}

// classify names the cause of a failed client handshake.
func classify(err error) error {
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	var ce x509.CertificateInvalidError
	switch {
	case errors.As(err, &ua):
		return fmt.Errorf("TLS handshake: %w: %v", ErrUntrusted, err)
	case errors.As(err, &he):
		return fmt.Errorf("TLS handshake: %w: %v", ErrWrongName, err)
	case errors.As(err, &ce):
		return fmt.Errorf("TLS handshake: the agent's certificate is invalid: %w", err)
	}
	return fmt.Errorf("TLS handshake (is a TLS agent listening there?): %w", err)
}

// Server is the agent's side: its certificate and the token it expects.
type Server struct {
	sandboxID string
	config    *tls.Config
	token     []byte
}

// LoadServer reads the sandbox Secret's files from dir (ca.crt, tls.crt,
// tls.key, token). It checks that the certificate chains to ca.crt, so that
// a mismatched Secret fails at start, naming the cause.
func LoadServer(dir string) (*Server, error) {
	data := make(map[string][]byte)
	for _, k := range []string{CACertKey, CertKey, KeyKey, TokenKey} {
		b, err := os.ReadFile(filepath.Join(dir, k))
		if err != nil {
			return nil, fmt.Errorf("agenttls: %w", err)
		}
		data[k] = b
	}
	return NewServer(data)
}

// NewServer is LoadServer for Secret data already in memory.
func NewServer(data map[string][]byte) (*Server, error) {
	pair, err := tls.X509KeyPair(data[CertKey], data[KeyKey])
	if err != nil {
		return nil, fmt.Errorf("agenttls: %s and %s: %w", CertKey, KeyKey, err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("agenttls: %s: %w", CertKey, err)
		}
	}
	ca, err := pki.ParseCertPEM(data[CACertKey])
	if err != nil {
		return nil, fmt.Errorf("agenttls: %s: %w", CACertKey, err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return nil, fmt.Errorf("agenttls: %s does not verify against %s: %w", CertKey, CACertKey, err)
	}
	if len(leaf.DNSNames) != 1 {
		return nil, fmt.Errorf("agenttls: %s names %d hosts, want the sandbox id alone", CertKey, len(leaf.DNSNames))
	}
	tok, err := parseToken(data[TokenKey])
	if err != nil {
		return nil, fmt.Errorf("agenttls: %w", err)
	}
	return &Server{
		sandboxID: leaf.DNSNames[0],
		config:    &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair}},
		token:     tok,
	}, nil
}

// SandboxID is the name on the server's certificate.
func (s *Server) SandboxID() string { return s.sandboxID }

// Authenticate performs the server side of the handshake on a connection
// just accepted: TLS 1.3 with the sandbox's certificate, then the token
// preamble, compared in constant time. On success it returns the TLS
// connection, ready for the agent protocol; on failure it has closed raw
// and nothing beyond the handshake and a one-byte refusal was sent.
// HandshakeTimeout bounds the whole exchange.
func (s *Server) Authenticate(raw net.Conn) (net.Conn, error) {
	peer := raw.RemoteAddr().String()
	raw.SetDeadline(time.Now().Add(HandshakeTimeout))
	conn := tls.Server(raw, s.config)
	if err := conn.Handshake(); err != nil {
		raw.Close()
		return nil, fmt.Errorf("agenttls: client %s: TLS handshake: %w", peer, err)
	}
	buf := make([]byte, preambleLen)
	n, err := io.ReadFull(conn, buf)
	if err == nil && subtle.ConstantTimeCompare(buf[:len(preambleMagic)], []byte(preambleMagic)) == 1 &&
		subtle.ConstantTimeCompare(buf[len(preambleMagic):], s.token) == 1 {
		if _, err := conn.Write([]byte{replyOK}); err != nil {
			conn.Close()
			return nil, fmt.Errorf("agenttls: client %s: sending the token reply: %w", peer, err)
		}
		raw.SetDeadline(time.Time{})
		return conn, nil
	}
	conn.Write([]byte{replyRefused})
	conn.Close()
	if err != nil {
		return nil, fmt.Errorf("agenttls: client %s: %w: read %d of %d preamble bytes: %v", peer, ErrBadToken, n, preambleLen, err)
	}
	return nil, fmt.Errorf("agenttls: client %s: %w", peer, ErrBadToken)
}

func parseToken(p []byte) ([]byte, error) {
	s := strings.TrimSpace(string(p))
	if s == "" {
		return nil, fmt.Errorf("%s: empty", TokenKey)
	}
	tok, err := hex.DecodeString(s)
	if err != nil || len(tok) != tokenBytes {
		return nil, fmt.Errorf("%s: want %d hex digits", TokenKey, 2*tokenBytes)
	}
	return tok, nil
}
