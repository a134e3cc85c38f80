package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/airlock-dev/airlock/client"
)

// TestMicroVMEgress: a microvm sandbox, whose guest has no network
// device, reaches an allowlisted HTTPS server on 127.0.0.1 through the
// host's egress proxy (its loopback listeners carried over a virtio-serial
// port), with the credential injected by the proxy (the guest trusts the
// sandbox's CA, copied in at boot), while a host not on the allowlist is
// refused; both connections are in the network log. A sandbox without
// network gets no proxy listener.
func TestMicroVMEgress(t *testing.T) {
	e := startNetEnv(t, "--microvm-accel", "tcg")
	if _, ok := runtimeCaps(t, e.c)["microvm"]; !ok {
		t.Skip("runtime microvm is not available here")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	root := matrixRoot{name: "host default", req: func(*client.CreateRequest) {}}
	if _, err := matrixNetwork(ctx, e, "microvm", root); err != nil {
		t.Fatal(err)
	}
	sb, err := e.c.Create(ctx, client.CreateRequest{Runtime: "microvm", Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	defer e.c.Kill(context.Background(), sb.ID)
	res, err := e.c.Exec(ctx, sb.ID, client.ExecRequest{Shell: "cat < /dev/null > /dev/tcp/127.0.0.1/3128 2>&1; python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 3128), 5)' 2>&1 | tail -1", Timeout: 120})
	if err != nil {
		t.Fatal(err)
	}
	if want := "ConnectionRefusedError: [Errno 111] Connection refused\n"; len(res.Stdout) < len(want) || res.Stdout[len(res.Stdout)-len(want):] != want {
		t.Fatalf("a sandbox without network reached a proxy port: %+v", res)
	}
}
