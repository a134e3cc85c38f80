package agenttls

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// pooledAgent serves a Pooled on 127.0.0.1 as agent.MainListen would
// (echoAuth): a connection handed over gets an echo, standing in for the
// agent protocol, which must never be reached before enrollment.
func pooledAgent(t *testing.T, p *Pooled) (string, <-chan error) {
	t.Helper()
	return echoAuth(t, p.Authenticate)
}

func newPooled(t *testing.T, ca *CA) *Pooled {
	t.Helper()
	p, err := NewPooled(ca.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func enroller(t *testing.T, ca *CA) *Enroller {
	t.Helper()
	e, err := ca.Enroller(0)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// enrollMessage is the enrollment of b as Enroller.Enroll sends it.
func enrollMessage(t *testing.T, b *Bundle) []byte {
	t.Helper()
	msg, err := json.Marshal(b.SecretData())
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32([]byte(enrollMagic), uint32(len(msg))), msg...)
}

// result waits for one authentication result.
func result(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(time.Minute):
		t.Fatal("no authentication result")
		return nil
	}
}

// TestPooledServesNothingBeforeEnrollment: an unclaimed pooled agent hands
// no connection to the agent protocol, whatever the client holds: a
// sandbox's certificate and token of the same CA (what a claimed sandbox's
// workload can read in its own pod), an enroller of another CA, a client
// without a certificate, plain TCP, or the true enroller speaking the token
// preamble instead of an enrollment. It stays unenrolled through all of
// them.
func TestPooledServesNothingBeforeEnrollment(t *testing.T) {
	ca := newCA(t)
	p := newPooled(t, ca)
	addr, results := pooledAgent(t, p)
	other := issue(t, ca, "sb-0000000000000b01") // another sandbox's Secret, same CA

	// Dial with that sandbox's token: the agent's certificate is not a
	// sandbox's, and the agent demands a client certificate.
	if _, err := Dial(dialCtx(t), addr, creds(t, other.SandboxID, other.SecretData())); err == nil {
		t.Fatal("a token client reached an unenrolled agent")
	}
	if err := result(t, results); err == nil || errors.Is(err, ErrEnrolled) {
		t.Fatalf("token client: %v", err)
	}

	// The sandbox's own certificate as a client certificate: the CA's,
	// but for server authentication and named by a sandbox id.
	pair, err := tls.X509KeyPair(other.Cert, other.Key)
	if err != nil {
		t.Fatal(err)
	}
	for name, certs := range map[string][]tls.Certificate{
		"sandbox certificate":   {pair},
		"another CA's enroller": {enroller(t, newCA(t)).cert},
		"no certificate":        nil,
	} {
		c, err := tls.Dial("tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, Certificates: certs})
		if err == nil {
			// TLS 1.3: the server's verdict on the client certificate
			// arrives with the first read.
			c.SetDeadline(time.Now().Add(30 * time.Second))
			// The attack: enroll the unclaimed pod with a bundle the
			// attacker holds (its own sandbox's, of the same CA).
			c.Write(enrollMessage(t, other))
			var b [1]byte
			n, rerr := c.Read(b[:])
			c.Close()
			if n == 1 && b[0] == replyOK {
				t.Errorf("%s: the agent answered OK", name)
			}
			_ = rerr
		}
		if err := result(t, results); err == nil || errors.Is(err, ErrEnrolled) || !strings.Contains(err.Error(), "bootstrap handshake failed") {
			t.Errorf("%s: %v, want the bootstrap handshake refused", name, err)
		}
		if p.SandboxID() != "" {
			t.Fatalf("%s enrolled the agent as %q", name, p.SandboxID())
		}
	}

	// Plain TCP, sending an agent frame.
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	raw.Write([]byte("\x00\x00\x00\x10{\"op\":\"ping\"}...."))
	raw.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, _ := io.ReadAll(raw)
	raw.Close()
	if strings.Contains(string(got), "pong") || strings.Contains(string(got), "op") {
		t.Errorf("plain TCP got %q", got)
	}
	if err := result(t, results); err == nil {
		t.Error("plain TCP authenticated")
	}

	// The true enroller's certificate, but a token preamble instead of an
	// enrollment: refused, nothing served.
	e := enroller(t, ca)
	c, err := tls.Dial("tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, Certificates: []tls.Certificate{e.cert}})
	if err != nil {
		t.Fatal(err)
	}
	c.Write(append([]byte(preambleMagic), make([]byte, tokenBytes)...))
	c.SetDeadline(time.Now().Add(30 * time.Second))
	var b [1]byte
	if n, _ := c.Read(b[:]); n == 1 && b[0] == replyOK {
		t.Error("a token preamble was taken for an enrollment")
	}
	c.Close()
	if err := result(t, results); err == nil || errors.Is(err, ErrEnrolled) {
		t.Errorf("preamble to an unenrolled agent: %v", err)
	}
	// An enrollment with a bundle of another CA.
	foreign := issue(t, newCA(t), "sb-0000000000000b02")
	e2 := &Enroller{cert: e.cert, ca: foreign.CACert}
	if err := e2.Enroll(dialCtx(t), addr, foreign); err == nil {
		t.Error("a bundle of another CA was enrolled")
	}
	if err := result(t, results); err == nil || !strings.Contains(err.Error(), "another CA") {
		t.Errorf("foreign bundle: %v", err)
	}
	if p.SandboxID() != "" {
		t.Fatalf("enrolled as %q by a refused client", p.SandboxID())
	}
}

// TestPooledEnrollOnce: the server's enroller hands a pooled agent its
// sandbox's bundle; then the agent serves that sandbox's token holders
// only (another sandbox's token, or a dial expecting another sandbox, is
// refused), and a second enrollment, even by a true enroller with a valid
// bundle, is refused: the channel is one-time.
func TestPooledEnrollOnce(t *testing.T) {
	ca := newCA(t)
	p := newPooled(t, ca)
	addr, results := pooledAgent(t, p)
	e := enroller(t, ca)
	mine := issue(t, ca, "sb-0000000000000c01")
	if err := e.Enroll(dialCtx(t), addr, mine); err != nil {
		t.Fatal(err)
	}
	if err := result(t, results); !errors.Is(err, ErrEnrolled) {
		t.Fatalf("enrollment: %v, want ErrEnrolled", err)
	}
	if p.SandboxID() != mine.SandboxID {
		t.Fatalf("enrolled as %q", p.SandboxID())
	}

	conn, err := Dial(dialCtx(t), addr, creds(t, mine.SandboxID, mine.SecretData()))
	if err != nil {
		t.Fatalf("the owner's dial: %v", err)
	}
	if err := result(t, results); err != nil {
		t.Fatalf("the owner's authentication: %v", err)
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	conn.Write([]byte("hello"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo %q %v", buf, err)
	}
	conn.Close()

	other := issue(t, ca, "sb-0000000000000c02")
	if _, err := Dial(dialCtx(t), addr, creds(t, mine.SandboxID, map[string][]byte{CACertKey: mine.CACert, TokenKey: []byte(other.Token)})); !errors.Is(err, ErrTokenRefused) {
		t.Errorf("another sandbox's token: %v, want ErrTokenRefused", err)
	}
	if err := result(t, results); !errors.Is(err, ErrBadToken) {
		t.Errorf("agent side of a wrong token: %v", err)
	}
	if _, err := Dial(dialCtx(t), addr, creds(t, other.SandboxID, other.SecretData())); !errors.Is(err, ErrWrongName) {
		t.Errorf("a dial expecting another sandbox: %v, want ErrWrongName", err)
	}
	<-results

	// Enrolling again: refused (the agent now answers as its sandbox, so
	// the enroller's handshake or message is refused), still its sandbox.
	if err := e.Enroll(dialCtx(t), addr, other); err == nil {
		t.Error("a second enrollment succeeded")
	}
	if err := result(t, results); errors.Is(err, ErrEnrolled) || err == nil {
		t.Errorf("second enrollment, agent side: %v", err)
	}
	if p.SandboxID() != mine.SandboxID {
		t.Errorf("re-enrolled as %q", p.SandboxID())
	}
	if _, err := Dial(dialCtx(t), addr, creds(t, mine.SandboxID, mine.SecretData())); err != nil {
		t.Errorf("the owner after a refused re-enrollment: %v", err)
	}
}

// TestPooledConcurrentEnrollments: of enrollments racing to an unclaimed
// agent, exactly one wins.
func TestPooledConcurrentEnrollments(t *testing.T) {
	ca := newCA(t)
	p := newPooled(t, ca)
	addr, results := pooledAgent(t, p)
	e := enroller(t, ca)
	const n = 6
	errs := make(chan error, n)
	for i := range n {
		b := issue(t, ca, "sb-00000000000d0"+string(rune('0'+i)))
		go func() { errs <- e.Enroll(context.Background(), addr, b) }()
	}
	ok := 0
	for range n {
		if err := <-errs; err == nil {
			ok++
		}
		<-results
	}
	if ok != 1 {
		t.Errorf("%d enrollments succeeded, want exactly 1", ok)
	}
}
