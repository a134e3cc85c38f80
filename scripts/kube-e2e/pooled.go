package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/agent"
	"github.com/airlock-dev/airlock/kube/agenttls"
)

// cmdPooled checks a warm pool's agent (`airlock agent --pool-ca`) in a
// real pod:
//
//	kube-e2e pooled ca     -state FILE -out DIR        # a CA; DIR/ca.crt for the pod's Secret
//	kube-e2e pooled enroll -state FILE -addr IP:7070
//
// enroll checks that the unenrolled agent serves nothing (another
// sandbox's credentials, a plain agent client), enrolls it as a sandbox
// with the CA's enroller, runs a command through it with that sandbox's
// credentials, and checks that a second enrollment and other credentials
// are refused.
func cmdPooled(args []string) error {
	if len(args) < 1 {
		return errors.New("usage: kube-e2e pooled ca|enroll [flags]")
	}
	fs := flag.NewFlagSet("pooled", flag.ContinueOnError)
	state := fs.String("state", "", "file holding the CA (written by ca)")
	out := fs.String("out", "", "directory to write ca.crt to (ca)")
	addr := fs.String("addr", "", "the pooled pod's IP:7070 (enroll)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "ca":
		ca, err := agenttls.NewCA(0)
		if err != nil {
			return err
		}
		data, err := ca.SecretData()
		if err != nil {
			return err
		}
		b, _ := json.Marshal(data)
		if err := os.WriteFile(*state, b, 0o600); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(*out, agenttls.CACertKey), ca.CertPEM(), 0o644)
	case "enroll":
		b, err := os.ReadFile(*state)
		if err != nil {
			return err
		}
		var data map[string][]byte
		if err := json.Unmarshal(b, &data); err != nil {
			return err
		}
		ca, err := agenttls.ParseCA(data)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		return pooledEnroll(ctx, ca, *addr)
	}
	return fmt.Errorf("pooled: unknown step %q", args[0])
}

func pooledEnroll(ctx context.Context, ca *agenttls.CA, addr string) error {
	other, err := ca.Issue("sb-e2e-other", 0)
	if err != nil {
		return err
	}
	occ, err := other.ClientCreds()
	if err != nil {
		return err
	}
	if _, err := agenttls.Dial(ctx, addr, occ); err == nil {
		return errors.New("another sandbox's credentials reached the unenrolled agent")
	}
	raw, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		return err
	}
	if _, err := agent.NewClient(raw); err == nil {
		return errors.New("a plain agent client got a hello from the unenrolled agent")
	}
	raw.Close()
	step("unenrolled pooled agent at %s: another sandbox's credentials and a plain client refused", addr)

	mine, err := ca.Issue("sb-e2e-pooled", 0)
	if err != nil {
		return err
	}
	e, err := ca.Enroller(0)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := e.Enroll(ctx, addr, mine); err != nil {
		return err
	}
	cc, err := mine.ClientCreds()
	if err != nil {
		return err
	}
	conn, err := agenttls.Dial(ctx, addr, cc)
	if err != nil {
		return fmt.Errorf("the owner's dial after enrollment: %w", err)
	}
	c, err := agent.NewClientConfig(conn, agent.Config{Home: "/workspace"})
	if err != nil {
		return err
	}
	defer c.Close()
	p, err := c.Exec(ctx, agent.ExecRequest{Shell: "echo pooled-$(id -u)"})
	if err != nil {
		return err
	}
	outb, errb, _, st, err := p.Collect(ctx, 1<<20)
	p.Close()
	if err != nil || st.Code != 0 || strings.TrimSpace(string(outb)) != "pooled-1000" {
		return fmt.Errorf("exec through the enrolled agent: %q %v, status %+v, stderr %s", outb, err, st, errb)
	}
	step("enrolled as %s and exec ran (%q) %v after the enrollment began", mine.SandboxID, strings.TrimSpace(string(outb)), time.Since(t0).Round(time.Millisecond))
	if err := e.Enroll(ctx, addr, other); err == nil {
		return errors.New("a second enrollment succeeded")
	}
	if _, err := agenttls.Dial(ctx, addr, occ); !errors.Is(err, agenttls.ErrWrongName) {
		return fmt.Errorf("another sandbox's credentials after enrollment: %v, want the wrong-name refusal", err)
	}
	step("a second enrollment and another sandbox's credentials refused")
	return nil
}
