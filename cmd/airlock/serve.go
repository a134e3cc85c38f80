package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/airlock-dev/airlock/computer"
	"github.com/airlock-dev/airlock/e2b"
	"github.com/airlock-dev/airlock/internal/config"
	"github.com/airlock-dev/airlock/internal/connlimit"
	"github.com/airlock-dev/airlock/internal/hostcheck"
	"github.com/airlock-dev/airlock/internal/statelock"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/mcp"
	"github.com/airlock-dev/airlock/policy"
	rt "github.com/airlock-dev/airlock/runtime"
	"github.com/airlock-dev/airlock/runtime/native/cgroups"
	"github.com/airlock-dev/airlock/server"
	"github.com/airlock-dev/airlock/volume"
)

func init() { hidden["serve"] = cmdServe }

const serveUsage = `usage: airlock serve --listen ADDR --state-dir DIR [flags]

Serves the HTTP API (api/openapi.yaml). Requests need "Authorization: Bearer
al_..." with a key from 'airlock keys create'; --no-auth is only accepted on a
loopback address. Every flag can also be set in a TOML file (--config, by
default /etc/airlock/config.toml if it exists; flags given here win); see
docs/operations.md for the file, TLS, logs and metrics.
`

// cmdServe runs the HTTP API server.
func cmdServe(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	listen := fs.String("listen", "127.0.0.1:7070", "address to listen on (host:port; port 0 picks a free one)")
	stateDir := fs.String("state-dir", "", "state directory: database, agent sockets (required)")
	dbURL := databaseURLFlag(fs)
	noAuth := fs.Bool("no-auth", false, "disable authentication (only on a loopback listener)")
	maxSB := fs.Int("max-sandboxes", 100, "sandboxes this server runs at once")
	agentBin := fs.String("agent-binary", "", agentBinaryUsage)
	allowDegraded := fs.Bool("allow-degraded", false, "start sandboxes even when cgroups are unavailable (no memory/pids/cpu limits)")
	defTimeout := fs.Duration("default-timeout", 15*time.Minute, "TTL of a sandbox created without a timeout")
	maxTimeout := fs.Duration("max-timeout", 24*time.Hour, "largest TTL a client may ask for")
	var snapQuota sizeFlag
	fs.Var(&snapQuota, "snapshot-quota", "disk all gvisor snapshot images (POST /v1/sandboxes/{id}/snapshots) may use together, e.g. 20G (0: 8 GiB)")
	reap := fs.Duration("reap-interval", time.Second, "how often expired sandboxes are looked for")
	grace := fs.Duration("agent-grace", 10*time.Minute, "how long a sandbox waits for the server to come back after losing its connection")
	keep := fs.Bool("keep-on-shutdown", false, "on SIGTERM leave sandboxes running for the next server to reattach (default: kill them)")
	maxFile := sizeFlag(server.MaxFileBody)
	fs.Var(&maxFile, "max-file-bytes", "largest file upload, e.g. 512M, 1G")
	mcpIdle := fs.Duration("mcp-idle", mcp.DefaultSessionTimeout, "end an MCP-over-HTTP session (/mcp), and kill its sandbox, after this long without a request; a client that comes back sooner with its Mcp-Session-Id keeps both")
	poolSize := fs.Int("pool", 0, "ready sandboxes kept warm for creates that ask for no custom limits, env, secrets or network (counted in --max-sandboxes); with --backend kubernetes, the pods of each pooled profile's SandboxWarmPool in the cluster")
	var poolImages listFlag
	fs.Var(&poolImages, "pool-image", "also keep --pool ready sandboxes of this published image of the image store (repeatable); a desktop image's are warmed with their desktop started (docs/computer-use.md)")
	poolPython := fs.Bool("pool-python", false, "pooled sandboxes' default Python context has run 'import numpy as np' and 'import pandas as pd' (contexts created later start empty)")
	relayDomain := fs.String("relay-domain", "", "serve sandbox pages the dashboard shows (a desktop's noVNC) on origins of their own, l-ID.DOMAIN: the DNS name *.DOMAIN must reach this server; best a registrable domain of its own (docs/computer-use.md). \"localhost\" works for a browser on this machine")
	e2bDomain := fs.String("e2b-domain", "", "route requests for PORT-SANDBOXID.DOMAIN to that port of that sandbox, and give DOMAIN to E2B SDKs as the sandboxes' domain (getHost); the DNS name *.DOMAIN must reach this server")
	e2bMaxNet := fs.String("e2b-max-network", "open", "the most network an E2B create may ask for: none, allowlist or open (older E2B SDKs, such as e2b 2.45, ask for open by default; more is refused with a 403)")
	var cl connFlags
	cl.register(fs)
	defRuntime := fs.String("default-runtime", "native", "runtime of sandboxes created without one (API, E2B and MCP creates): native, gvisor, microvm or wasm (docs/gvisor.md, docs/microvm.md; GET /v1/info lists what each can do)")
	var ef egressFlags
	ef.register(fs)
	var kf kubeFlags
	kf.register(fs)
	applyMicroVM := microvmFlags(fs)
	var imf imageServeFlags
	imf.register(fs)
	var cf ceilingFlags
	cf.register(fs, "the host's: its RAM, its CPUs, 32768 processes")
	var af approvalFlags
	af.register(fs)
	var of opsFlags
	of.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fmt.Print(serveUsage)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n%s", err, serveUsage)
		return exitUsage
	}
	configFile, err := of.applyConfig(fs, config.DefaultPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return exitUsage
	}
	// Flag combinations are refused before anything is opened or started.
	if len(poolImages) > 0 && *poolSize <= 0 {
		fmt.Fprintln(os.Stderr, "airlock serve: --pool-image needs --pool N (how many of each to keep)")
		return exitUsage
	}
	if len(poolImages) > 0 && *kf.backend == "kubernetes" {
		fmt.Fprintln(os.Stderr, "airlock serve: --pool-image is not available with --backend kubernetes (the cluster's warm pool holds the default image only)")
		return exitUsage
	}
	slogger, err := of.logger(os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return exitUsage
	}
	// Every line the server writes, its own and the log package's of any
	// library, goes through slogger: one format.
	slog.SetDefault(slogger)
	logger := slog.NewLogLogger(slogger.Handler(), slog.LevelInfo)
	if configFile != "" {
		slogger.Info("configuration read", "file", configFile)
	}
	certs, err := of.tls()
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return exitUsage
	}
	if *stateDir == "" {
		fmt.Fprintln(os.Stderr, "airlock serve: --state-dir is required")
		return exitUsage
	}
	if err := requireStaticBuild(); err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return exitSetup
	}
	egressCfg, err := ef.config()
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return exitUsage
	}
	if err := af.load(); err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return exitUsage
	}
	if err := applyMicroVM(); err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return exitUsage
	}
	rtm, err := selectRuntime(*defRuntime)
	if kf.enabled() {
		// A tier of the cluster (a RuntimeClass), checked by the backend.
		rtm, err = policy.Runtime(*defRuntime), nil
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: --default-runtime: %s\n", oneLine(err))
		return exitUsage
	}
	e2bNet, err := e2b.ParseMaxNetwork(*e2bMaxNet)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: --e2b-max-network: %v\n", err)
		return exitUsage
	}
	maxConns, nofile, err := cl.check()
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return exitUsage
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return 1
	}
	if *noAuth {
		if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
			ln.Close()
			fmt.Fprintf(os.Stderr, "airlock serve: --no-auth is only allowed on a loopback address, not %s\n", ln.Addr())
			return exitUsage
		}
	}
	if info := cgroups.Detect(); (info.Version == 0 || info.Reason != "") && !*allowDegraded && !kf.enabled() {
		ln.Close()
		fmt.Fprintf(os.Stderr, "airlock serve: cgroups unavailable (%s): memory, pids and cpu limits cannot be enforced; refusing to start without --allow-degraded\n", info.Reason)
		return exitSetup
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: locate own binary: %v\n", err)
		return 1
	}
	lean, err := leanAgent(self, *agentBin, logger.Printf)
	if err != nil {
		ln.Close()
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return exitSetup
	}
	// One server per state directory: a second one would reattach (and
	// break) the first one's sandboxes.
	if err := os.MkdirAll(*stateDir, 0o700); err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return 1
	}
	lock, err := statelock.Acquire(*stateDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return 1
	}
	defer lock.Release()
	st, err := openStore(*stateDir, *dbURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return 1
	}
	defer st.Close()
	if d := st.SharedDatabase(); d != "" {
		logger.Printf("API keys, audit log and network log in %s", d)
	}
	images, registries, err := imf.open(*stateDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return 1
	}
	volumes, err := volume.Open(filepath.Join(*stateDir, "volumes"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return 1
	}
	backend, err := kf.open(logger.Printf, *poolSize)
	if err == nil && backend != nil && *poolPython {
		err = errors.New("--pool-python: not available with --backend kubernetes")
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return exitUsage
	}
	metrics := server.NewMetrics()
	m, err := manager.Open(manager.Config{Backend: backend, StateDir: *stateDir, Store: st, Images: images, Volumes: volumes, AgentBinary: self, LeanAgent: lean, MaxSandboxes: *maxSB,
		AllowDegraded: *allowDegraded, DefaultTimeout: *defTimeout, MaxTimeout: *maxTimeout, ReapInterval: *reap,
		AgentGrace: *grace, KeepOnShutdown: *keep, Logf: logger.Printf, Egress: egressCfg, Ceilings: cf.ceilings(),
		DefaultRuntime: rtm, SnapshotQuota: int64(snapQuota), Observe: metrics.Observe})
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return 1
	}
	warmImage := func(ctx context.Context, sb *manager.Sandbox, _ string) error { return computer.Warm(ctx, sb) }
	pool := manager.PoolConfig{Size: *poolSize, WarmPython: *poolPython, Images: poolImages, WarmImage: warmImage}
	if backend != nil {
		pool.Size = 0 // the cluster keeps the warm pool (kube.Backend.EnsurePools)
	}
	if err := m.StartPool(pool); err != nil {
		m.Close()
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return 1
	}
	gate, err := af.gate(m, st, *stateDir, logger.Printf)
	if err != nil {
		m.Close()
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return 1
	}
	srv, err := server.New(server.Config{Manager: m, Store: st, NoAuth: *noAuth, Version: version,
		Images: images, ImageRegistries: registries, Approvals: gate, Approvers: af.approvers, WebhookSecret: af.secret,
		MaxFileBytes: int64(maxFile), MCPIdle: *mcpIdle, E2BMaxNetwork: e2bNet, E2BDomain: *e2bDomain, RelayDomain: *relayDomain, Logger: slogger, Metrics: metrics, Layers: func() rt.Enforced { l, _ := doctor(); return l }})
	if err != nil {
		m.Close()
		fmt.Fprintf(os.Stderr, "airlock serve: %v\n", err)
		return 1
	}
	hs := &http.Server{Handler: connlimit.BodyIdle(srv, cl.bodyIdle), ReadHeaderTimeout: cl.header, IdleTimeout: cl.idle,
		MaxHeaderBytes: 64 << 10, ErrorLog: logger}
	logger.Printf("connections: at most %d (descriptor limit %d, half kept for sandboxes), %d per client address", maxConns, nofile, cl.perAddr)
	// What on this host forbids sandboxes, said once at start (airlock
	// doctor has the same lines): creates would fail or lack a layer.
	for _, f := range hostcheck.Diagnose() {
		logger.Printf("WARNING: host: %s; fix: %s", f.Problem, f.Fix)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	scheme := "http"
	if certs != nil {
		scheme = "https"
		hs.TLSConfig = certs.Config()
		stopHUP := make(chan struct{})
		defer close(stopHUP)
		reloadOnHUP(certs, slogger, stopHUP)
	}
	go func() {
		cln := connlimit.Listen(ln, connlimit.Config{Max: maxConns, PerAddr: cl.perAddr, Logf: logger.Printf})
		if certs != nil {
			errc <- hs.ServeTLS(cln, "", "")
			return
		}
		errc <- hs.Serve(cln)
	}()
	slogger.Info("listening", "url", scheme+"://"+ln.Addr().String())
	// Tests and scripts read this line to learn the port.
	fmt.Printf("airlock: listening on %s://%s\n", scheme, ln.Addr())
	code := 0
	select {
	case <-ctx.Done():
		logger.Printf("shutting down")
	case err := <-errc:
		logger.Printf("serve: %v", err)
		code = 1
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gate.Close() // pending approvals end denied, so their requests return
	hs.Shutdown(sctx)
	m.Close()
	return code
}
