//go:build kubernetes

package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/kube/egressproxy"
)

func init() { hidden["egress-proxy"] = cmdEgressProxy }

// cmdEgressProxy runs the cluster egress proxy: `airlock egress-proxy
// --namespace airlock-sandboxes` in a Deployment (deploy/airlock/egress-proxy.yaml).
func cmdEgressProxy(args []string) int {
	fs := flag.NewFlagSet("egress-proxy", flag.ContinueOnError)
	ns := fs.String("namespace", "airlock-sandboxes", "namespace of the sandbox pods")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: the pod's service account)")
	httpAddr := fs.String("http", fmt.Sprintf(":%d", egressproxy.HTTPPort), "HTTP proxy listen address")
	socksAddr := fs.String("socks", fmt.Sprintf(":%d", egressproxy.SOCKSPort), "SOCKS5 proxy listen address (\"\" for none)")
	var maxBytes sizeFlag = 4 << 30
	fs.Var(&maxBytes, "max-bytes", "bytes each sandbox may exchange through this replica (0 for no cap)")
	maxConns := fs.Int("max-conns", 256, "concurrent connections per sandbox through this replica (0 for no cap)")
	verbose := fs.Bool("v", false, "log every connection, not only denials")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 || *ns == "" || *httpAddr == "" {
		fmt.Fprintln(os.Stderr, "usage: airlock egress-proxy [--namespace NS] [--kubeconfig FILE] [--http ADDR] [--socks ADDR]")
		return exitUsage
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	var cfg *rest.Config
	var err error
	if *kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock egress-proxy: connection to the Kubernetes API: %v\n", err)
		return exitSetup
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock egress-proxy: %v\n", err)
		return exitSetup
	}
	srv := egressproxy.New(egressproxy.Config{Egress: egress.Config{
		Logger: log,
		Limits: egress.Limits{MaxConns: *maxConns, MaxBytes: int64(maxBytes)},
		// Every connection and refusal, without secret values (a Record
		// never holds one): the cluster's network log.
		OnConnection: func(r egress.Record) {
			log.Info("connection", "sandbox", r.SandboxID, "host", r.Host, "port", r.Port, "allowed", r.Allowed,
				"reason", r.Reason, "protocol", r.Protocol, "bytes_up", r.BytesUp, "bytes_down", r.BytesDown,
				"duration_ms", r.Duration.Milliseconds())
		},
	}})
	defer srv.Close()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := egressproxy.Watch(ctx, cs, *ns, srv); err != nil {
		fmt.Fprintf(os.Stderr, "airlock egress-proxy: %v\n", err)
		return exitSetup
	}
	errc := make(chan error, 2)
	for _, l := range []struct {
		addr string
		kind egress.Kind
	}{{*httpAddr, egress.HTTP}, {*socksAddr, egress.SOCKS5}} {
		if l.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock egress-proxy: %v\n", err)
			return exitSetup
		}
		defer ln.Close()
		log.Info("listening", "kind", strings.ToLower(l.kind.String()), "addr", ln.Addr().String(), "namespace", *ns)
		go func() { errc <- srv.Serve(ln, l.kind) }()
	}
	select {
	case <-ctx.Done():
		return 0
	case err := <-errc:
		fmt.Fprintf(os.Stderr, "airlock egress-proxy: %v\n", err)
		return 1
	}
}
