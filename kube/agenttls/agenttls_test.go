package agenttls

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// echoAgent serves a Server on 127.0.0.1: every authenticated connection
// gets an echo of what it sends (standing in for the agent protocol), and
// every authentication result goes to the returned channel.
func echoAgent(t *testing.T, s *Server) (string, <-chan error) {
	t.Helper()
	return echoAuth(t, s.Authenticate)
}

// echoAuth is echoAgent for any Authenticate (a Server's or a Pooled's).
func echoAuth(t *testing.T, authenticate func(net.Conn) (net.Conn, error)) (string, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	results := make(chan error, 16)
	go func() {
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				conn, err := authenticate(raw)
				results <- err
				if err != nil {
					return
				}
				defer conn.Close()
				io.Copy(conn, conn)
			}()
		}
	}()
	return ln.Addr().String(), results
}

func newCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA(0)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t *testing.T, ca *CA, id string) *Bundle {
	t.Helper()
	b, err := ca.Issue(id, 0)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func server(t *testing.T, b *Bundle) *Server {
	t.Helper()
	s, err := NewServer(b.SecretData())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func creds(t *testing.T, id string, data map[string][]byte) *ClientCreds {
	t.Helper()
	c, err := NewClientCreds(id, data)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func dialCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestDialEcho(t *testing.T) {
	ca := newCA(t)
	b := issue(t, ca, "sb-0123456789abcdef")
	addr, results := echoAgent(t, server(t, b))
	cc, err := b.ClientCreds()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := Dial(dialCtx(t), addr, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := <-results; err != nil {
		t.Fatalf("server side: %v", err)
	}
	if tc, ok := conn.(*tls.Conn); !ok || tc.ConnectionState().Version != tls.VersionTLS13 {
		t.Fatalf("connection is %T, want TLS 1.3", conn)
	}
	msg := []byte("frame bytes")
	if _, err := conn.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo %q, %v", got, err)
	}
	if s := cc.String() + b.String(); strings.Contains(s, b.Token) {
		t.Fatalf("String shows the token: %s", s)
	}
}

func TestDialRefusals(t *testing.T) {
	ca := newCA(t)
	b := issue(t, ca, "sb-a")
	addr, results := echoAgent(t, server(t, b))

	other := issue(t, newCA(t), "sb-a")    // same name, another CA
	sibling := issue(t, ca, "sb-b")        // same CA, another sandbox
	wrongTok := issue(t, ca, "sb-a").Token // a valid token of another issue
	data := func(caPEM []byte, tok string) map[string][]byte {
		return map[string][]byte{CACertKey: caPEM, TokenKey: []byte(tok)}
	}
	cases := []struct {
		name      string
		creds     *ClientCreds
		want      error
		serverErr string
	}{
		{"wrong CA", creds(t, "sb-a", data(other.CACert, b.Token)), ErrUntrusted, "TLS handshake"},
		{"wrong name", creds(t, "sb-b", data(sibling.CACert, b.Token)), ErrWrongName, "TLS handshake"},
		{"wrong token", creds(t, "sb-a", data(b.CACert, wrongTok)), ErrTokenRefused, ErrBadToken.Error()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, err := Dial(dialCtx(t), addr, c.creds)
			if err == nil {
				conn.Close()
				t.Fatal("dial succeeded")
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("error %v, want %v", err, c.want)
			}
			if !strings.Contains(err.Error(), `sandbox "`+c.creds.SandboxID()+`"`) {
				t.Fatalf("error does not name the sandbox: %v", err)
			}
			serr := <-results
			if serr == nil || !strings.Contains(serr.Error(), c.serverErr) {
				t.Fatalf("server side: %v, want %q", serr, c.serverErr)
			}
		})
	}
}

// TestRawClientsGetNothing talks to the agent side without Dial: a TLS
// client that sends no token, one that sends an agent frame instead, and a
// plain TCP client. None of them gets anything back but the refusal byte
// (or a TLS alert), and the echo behind authentication never answers.
func TestRawClientsGetNothing(t *testing.T) {
	ca := newCA(t)
	b := issue(t, ca, "sb-a")
	addr, results := echoAgent(t, server(t, b))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b.CACert)
	tlsDial := func() *tls.Conn {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "sb-a"})
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		return c
	}

	t.Run("no token", func(t *testing.T) {
		c := tlsDial()
		defer c.Close()
		c.CloseWrite() // says nothing at all
		got, _ := io.ReadAll(c)
		if string(got) != string(rune(replyRefused)) {
			t.Fatalf("got %q, want only the refusal", got)
		}
		if err := <-results; !errors.Is(err, ErrBadToken) {
			t.Fatalf("server side: %v", err)
		}
	})
	t.Run("frame instead of token", func(t *testing.T) {
		c := tlsDial()
		defer c.Close()
		// An agent hello frame, 40 bytes: more than the preamble.
		frame := append([]byte{0, 0, 0, 32, 1, 0, 0, 0, 0}, []byte(`{"version":1,"home":"/workspace"}`)...)
		c.Write(frame)
		got, _ := io.ReadAll(c)
		if string(got) != string(rune(replyRefused)) {
			t.Fatalf("got %q, want only the refusal", got)
		}
		if err := <-results; !errors.Is(err, ErrBadToken) {
			t.Fatalf("server side: %v", err)
		}
	})
	t.Run("plain TCP", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		payload := []byte("ALT1" + strings.Repeat("x", 32) + "echo me")
		c.Write(payload)
		got, _ := io.ReadAll(c)
		if bytes.Contains(got, []byte("echo me")) || bytes.Contains(got, []byte{replyOK}) && len(got) == 1 {
			t.Fatalf("plain client got %q", got)
		}
		if err := <-results; err == nil || !strings.Contains(err.Error(), "TLS handshake") {
			t.Fatalf("server side: %v", err)
		}
	})
}

// TestDialPlainServer dials something that does not speak TLS.
func TestDialPlainServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhello"))
			c.Close()
		}
	}()
	b := issue(t, newCA(t), "sb-a")
	cc, _ := b.ClientCreds()
	_, err = Dial(dialCtx(t), ln.Addr().String(), cc)
	if err == nil || !strings.Contains(err.Error(), "TLS handshake") {
		t.Fatalf("error %v, want a TLS handshake failure", err)
	}
}

func TestCASecretRoundTrip(t *testing.T) {
	ca := newCA(t)
	data, err := ca.SecretData()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseCA(data)
	if err != nil {
		t.Fatal(err)
	}
	// A leaf issued by the parsed CA verifies against the original.
	b := issue(t, back, "sb-x")
	addr, results := echoAgent(t, server(t, b))
	conn, err := Dial(dialCtx(t), addr, creds(t, "sb-x", map[string][]byte{CACertKey: ca.CertPEM(), TokenKey: []byte(b.Token)}))
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	<-results

	other, _ := newCA(t).SecretData()
	if _, err := ParseCA(map[string][]byte{CACertKey: data[CACertKey], CAKeyKey: other[CAKeyKey]}); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("mismatched key: %v", err)
	}
	if _, err := ParseCA(map[string][]byte{CACertKey: data[CACertKey]}); err == nil {
		t.Fatal("missing key accepted")
	}
}

func TestLoadServer(t *testing.T) {
	ca := newCA(t)
	b := issue(t, ca, "sb-files")
	dir := t.TempDir()
	for k, v := range b.SecretData() {
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	s, err := LoadServer(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.SandboxID() != "sb-files" {
		t.Fatalf("sandbox id %q", s.SandboxID())
	}
	// A certificate of another CA than ca.crt fails at load.
	other := issue(t, newCA(t), "sb-files")
	os.WriteFile(filepath.Join(dir, CertKey), other.Cert, 0o400)
	os.WriteFile(filepath.Join(dir, KeyKey), other.Key, 0o400)
	if _, err := LoadServer(dir); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Fatalf("foreign certificate: %v", err)
	}
	os.Remove(filepath.Join(dir, TokenKey))
	if _, err := LoadServer(dir); err == nil || !strings.Contains(err.Error(), TokenKey) {
		t.Fatalf("missing token: %v", err)
	}
}

func TestIssueNames(t *testing.T) {
	ca := newCA(t)
	for _, bad := range []string{"", "Sb-A", "sb_a", "-sb", "sb-", "a..b", "sb.", strings.Repeat("a", 64)} {
		if _, err := ca.Issue(bad, 0); err == nil {
			t.Errorf("Issue(%q) succeeded", bad)
		}
	}
	for _, good := range []string{"sb-0123456789abcdef", "a", "x.y-z"} {
		if _, err := ca.Issue(good, 0); err != nil {
			t.Errorf("Issue(%q): %v", good, err)
		}
	}
	if _, err := NewClientCreds("sb-a", map[string][]byte{CACertKey: ca.CertPEM(), TokenKey: []byte("abcd")}); err == nil {
		t.Error("short token accepted")
	}
}
