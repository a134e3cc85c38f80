package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-dev/airlock/egress"
	"github.com/airlock-dev/airlock/manager"
	"github.com/airlock-dev/airlock/policy"
	"github.com/airlock-dev/airlock/runtime/native"
)

// overrideResolver answers the names given with --resolve from a fixed
// table (like curl --resolve) and every other name with the system
// resolver.
type overrideResolver struct {
	static egress.StaticResolver
}

// LookupIP implements egress.Resolver.
func (r overrideResolver) LookupIP(ctx context.Context, host string) ([]net.IP, error) {
	if _, ok := r.static[strings.TrimSuffix(strings.ToLower(host), ".")]; ok {
		return r.static.LookupIP(ctx, host)
	}
	return net.DefaultResolver.LookupIP(ctx, "ip", host)
}

// parseResolve turns repeated NAME=IP[,IP...] flags into a resolver; nil
// when there are none (the proxy then uses the system resolver).
func parseResolve(flags []string) (egress.Resolver, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	static := egress.StaticResolver{}
	for _, f := range flags {
		name, ips, ok := strings.Cut(f, "=")
		name = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(name)), ".")
		if !ok || name == "" || ips == "" {
			return nil, fmt.Errorf("--resolve %q: want NAME=IP[,IP...]", f)
		}
		for _, s := range strings.Split(ips, ",") {
			ip := net.ParseIP(strings.Trim(strings.TrimSpace(s), "[]"))
			if ip == nil {
				return nil, fmt.Errorf("--resolve %q: %q is not an IP address", f, s)
			}
			static[name] = append(static[name], ip)
		}
	}
	return overrideResolver{static: static}, nil
}

// loadRoots returns a pool of the system roots plus the PEM certificates
// in files (--upstream-ca); nil when files is empty.
func loadRoots(files []string) (*x509.CertPool, error) {
	if len(files) == 0 {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("--upstream-ca: %w", err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--upstream-ca %s: no PEM certificate in it", f)
		}
	}
	return pool, nil
}

// egressFlags are the proxy flags of airlock serve.
type egressFlags struct {
	resolve, upstreamCA listFlag
	maxConns            int
	maxBytes            string
}

func (f *egressFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.resolve, "resolve", "NAME=IP[,IP...]: the egress proxy resolves NAME to these addresses instead of asking DNS (repeatable, like curl --resolve)")
	fs.Var(&f.upstreamCA, "upstream-ca", "PEM file of extra CA certificates that the egress proxy trusts when it verifies a server before injecting a secret (repeatable)")
	fs.IntVar(&f.maxConns, "egress-max-conns", 64, "concurrent proxied connections per sandbox (0: no cap)")
	fs.StringVar(&f.maxBytes, "egress-max-bytes", "4G", "bytes a sandbox may exchange through the egress proxy over its lifetime, e.g. 512M (0: no cap)")
}

// config turns the flags into the manager's egress configuration.
func (f *egressFlags) config() (manager.EgressConfig, error) {
	var c manager.EgressConfig
	var err error
	if c.Resolver, err = parseResolve(f.resolve); err != nil {
		return c, err
	}
	if c.RootCAs, err = loadRoots(f.upstreamCA); err != nil {
		return c, err
	}
	if f.maxConns < 0 {
		return c, errors.New("--egress-max-conns must not be negative")
	}
	c.Limits.MaxConns = f.maxConns
	if f.maxBytes != "" && f.maxBytes != "0" {
		if c.Limits.MaxBytes, err = policy.ParseSize(f.maxBytes); err != nil {
			return c, fmt.Errorf("--egress-max-bytes: %w", err)
		}
	}
	return c, nil
}

// netFlags are the network flags of airlock run.
type netFlags struct {
	net, secrets listFlag
	egress       egressFlags
}

func (f *netFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.net, "net", "network access: allow:HOST[,HOST...], deny:HOST[,HOST...], open or none (repeatable; default none). HOST is a name, *.wildcard, IP or CIDR, with an optional :PORT")
	fs.Var(&f.secrets, "secret", "HOST:HEADER:VALUE: the proxy adds this header to requests for HOST; the program never sees VALUE (repeatable). VALUE env:NAME reads the host's environment variable NAME")
	fs.Var(&f.egress.resolve, "resolve", "NAME=IP[,IP...]: the egress proxy resolves NAME to these addresses (repeatable, like curl --resolve)")
	fs.Var(&f.egress.upstreamCA, "upstream-ca", "PEM file of extra CA certificates trusted when verifying a server before injecting a secret (repeatable)")
}

// network parses the --net flags; Mode none when there are none.
func (f *netFlags) network() (policy.Network, error) {
	n := policy.Network{Mode: policy.NetNone}
	none, open, lists := false, false, false
	for _, v := range f.net {
		kind, hosts, _ := strings.Cut(v, ":")
		switch kind {
		case "none":
			none = true
		case "open":
			open = true
		case "allow", "deny":
			if hosts == "" {
				return n, fmt.Errorf("--net %q: want %s:HOST[,HOST...]", v, kind)
			}
			lists = true
			for _, h := range strings.Split(hosts, ",") {
				if h = strings.TrimSpace(h); h == "" {
					continue
				}
				if kind == "allow" {
					n.Allow = append(n.Allow, h)
				} else {
					n.Deny = append(n.Deny, h)
				}
			}
		default:
			return n, fmt.Errorf("--net %q: want allow:HOSTS, deny:HOSTS, open or none", v)
		}
	}
	switch {
	case none && (open || lists):
		return n, errors.New("--net none cannot be combined with other --net flags")
	case open:
		n.Mode = policy.NetOpen
	case lists:
		n.Mode = policy.NetAllowlist
	}
	if err := (egress.Policy{Mode: string(n.Mode), Allow: n.Allow, Deny: n.Deny}).Validate(); err != nil {
		return n, fmt.Errorf("--net: %w", err)
	}
	return n, nil
}

// parseSecret parses HOST:HEADER:VALUE. HOST may carry a port
// ("api.example.com:443") or be a bracketed IPv6 address; VALUE may contain
// colons; VALUE env:NAME is read from the environment.
func parseSecret(s string) (egress.Secret, error) {
	bad := fmt.Errorf("--secret %q: want HOST:HEADER:VALUE", redactSecretFlag(s))
	var host, rest string
	if strings.HasPrefix(s, "[") {
		i := strings.Index(s, "]")
		if i < 0 {
			return egress.Secret{}, bad
		}
		host, rest = s[:i+1], s[i+1:]
		if !strings.HasPrefix(rest, ":") {
			return egress.Secret{}, bad
		}
		rest = rest[1:]
	} else {
		var ok bool
		if host, rest, ok = strings.Cut(s, ":"); !ok {
			return egress.Secret{}, bad
		}
	}
	// A port: the field after the host is all digits.
	if p, after, ok := strings.Cut(rest, ":"); ok && p != "" && strings.Trim(p, "0123456789") == "" {
		host, rest = host+":"+p, after
	}
	header, value, ok := strings.Cut(rest, ":")
	if !ok || host == "" || header == "" || value == "" {
		return egress.Secret{}, bad
	}
	if name, ok := strings.CutPrefix(value, "env:"); ok {
		v, set := os.LookupEnv(name)
		if !set || v == "" {
			return egress.Secret{}, fmt.Errorf("--secret for %s: environment variable %s is not set", host, name)
		}
		value = v
	}
	return egress.Secret{Host: host, Header: header, Value: value}, nil
}

// redactSecretFlag hides the value part of a --secret flag in messages.
func redactSecretFlag(s string) string {
	if i := strings.LastIndex(s, ":"); i >= 0 {
		return s[:i+1] + "[redacted]"
	}
	return "[redacted]"
}

// runNet is the egress of one airlock run: an in-process proxy serving the
// listeners opened inside the sandbox, and the sandbox's CA files.
type runNet struct {
	proxy *egress.Proxy
	dir   string // temporary trust store files; "" without secrets
}

// setupRunNet prepares the egress of a one-shot run: it adds the proxy
// environment (and, with secrets, the trust store mounts and variables) to
// p, sets cfg.ID and cfg.Listen and hooks opts.OnListeners to serve the
// listeners. It returns nil when the run has no network. Call close after
// the run.
func (f *netFlags) setupRunNet(p *policy.Policy, cfg *native.Config, opts *native.RunOptions) (*runNet, error) {
	n, err := f.network()
	if err != nil {
		return nil, err
	}
	var secrets []egress.Secret
	for _, s := range f.secrets {
		sec, err := parseSecret(s)
		if err != nil {
			return nil, err
		}
		secrets = append(secrets, sec)
	}
	ec, err := f.egress.config()
	if err != nil {
		return nil, err
	}
	if n.Mode == policy.NetNone {
		if len(secrets) > 0 {
			return nil, errors.New("--secret needs --net allow:HOST or --net open")
		}
		return nil, nil
	}
	p.Network = n
	cfg.ID = native.NewRunID() // a run- id: swept if this launcher crashes
	// Denials and failures are printed once, below; the proxy's own log
	// would repeat them.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rn := &runNet{proxy: egress.New(egress.Config{Resolver: ec.Resolver, RootCAs: ec.RootCAs, Logger: quiet, OnConnection: func(r egress.Record) {
		if !r.Allowed || strings.Contains(r.Reason, "; cannot ") {
			fmt.Fprintf(os.Stderr, "airlock: network: %s\n", r.Reason)
		}
	}})}
	if err := rn.proxy.AddSandbox(cfg.ID, egress.Sandbox{Policy: egress.Policy{Mode: string(n.Mode), Allow: n.Allow, Deny: n.Deny}, Secrets: secrets}); err != nil {
		rn.close()
		return nil, err
	}
	for _, kv := range egress.ProxyEnv(3128, 1080) {
		k, v, _ := strings.Cut(kv, "=")
		p.SetEnv(k, v)
	}
	if len(secrets) > 0 {
		if err := rn.writeTrust(cfg.ID, p); err != nil {
			rn.close()
			return nil, err
		}
	}
	cfg.Listen = []string{manager.ProxyHTTPAddr, manager.ProxySOCKSAddr}
	prev := opts.OnListeners
	opts.OnListeners = func(id string, ls []net.Listener) {
		for i, l := range ls {
			kind := egress.HTTP
			if i == 1 {
				kind = egress.SOCKS5
			}
			go rn.proxy.Serve(l, id, kind)
		}
		if prev != nil {
			prev(id, ls)
		}
	}
	return rn, nil
}

// writeTrust writes the run's CA alone and combined with the host bundle
// into a temporary directory and binds them into p.
func (rn *runNet) writeTrust(id string, p *policy.Policy) error {
	dir, err := os.MkdirTemp("", "airlock-net-")
	if err != nil {
		return fmt.Errorf("trust store: %w", err)
	}
	rn.dir = dir
	// The sandbox user must be able to read the files through the bind.
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("trust store: %w", err)
	}
	ca := rn.proxy.CACertPEM(id)
	bundle, err := os.ReadFile(manager.CABundlePath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("trust store: %w", err)
	}
	if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
		bundle = append(bundle, '\n')
	}
	bundle = append(bundle, ca...)
	caFile, bundleFile := filepath.Join(dir, "egress-ca.pem"), filepath.Join(dir, "ca-certificates.crt")
	if err := os.WriteFile(caFile, ca, 0o644); err != nil {
		return fmt.Errorf("trust store: %w", err)
	}
	if err := os.WriteFile(bundleFile, bundle, 0o644); err != nil {
		return fmt.Errorf("trust store: %w", err)
	}
	p.Filesystem.Mounts = append(p.Filesystem.Mounts,
		policy.Mount{Source: bundleFile, Target: manager.CABundlePath}, policy.Mount{Source: caFile, Target: manager.CAPath})
	for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"} {
		p.SetEnv(k, manager.CABundlePath)
	}
	p.SetEnv("NODE_EXTRA_CA_CERTS", manager.CAPath)
	return nil
}

// close stops the proxy and removes the temporary files.
func (rn *runNet) close() {
	if rn == nil {
		return
	}
	rn.proxy.Close()
	if rn.dir != "" {
		os.RemoveAll(rn.dir)
	}
}
