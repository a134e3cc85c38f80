package server

import (
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlock-dev/airlock/manager"
)

// Metrics are the Prometheus series of GET /metrics (docs/operations.md):
// histograms of sandbox operations labelled by runtime and status, of HTTP
// requests labelled by route pattern, and the counters airlock has always
// exported, under their old names.
type Metrics struct {
	reg *prometheus.Registry
	ops map[string]*prometheus.HistogramVec
	// http times every request by method, route pattern and status code.
	http *prometheus.HistogramVec
}

// opBuckets suit operations from milliseconds (a native exec) to minutes
// (a gvisor create that pulls its image, a long foreground exec).
var opBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// egressBuckets suit proxied connections, from a refused one (instant) to
// an hour-long download.
var egressBuckets = []float64{.01, .05, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600}

// NewMetrics makes the registry; give it to manager.Config.Observe (its
// Observe method) and to Config.Metrics.
func NewMetrics() *Metrics {
	mt := &Metrics{reg: prometheus.NewRegistry(), ops: map[string]*prometheus.HistogramVec{}}
	mt.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, o := range []struct{ op, name, help string }{
		{"create", "airlock_sandbox_create_duration_seconds", "Time to create a sandbox (API, E2B and MCP creates), by runtime and status."},
		{"pause", "airlock_sandbox_pause_duration_seconds", "Time to pause a sandbox, by runtime and status."},
		{"resume", "airlock_sandbox_resume_duration_seconds", "Time to resume a sandbox, by runtime and status."},
		{"exec", "airlock_exec_duration_seconds", "Duration of POST /v1/sandboxes/{id}/exec requests (a foreground exec: until the command ended), by runtime and status."},
		{"cell", "airlock_cell_duration_seconds", "Duration of POST /v1/sandboxes/{id}/code requests (one code cell), by runtime and status."},
		{"egress", "airlock_egress_connection_duration_seconds", "Duration of connections through the egress proxy, by runtime and status (allowed or denied)."},
	} {
		b := opBuckets
		if o.op == "egress" {
			b = egressBuckets
		}
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: o.name, Help: o.help, Buckets: b}, []string{"runtime", "status"})
		mt.reg.MustRegister(h)
		mt.ops[o.op] = h
	}
	mt.http = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "airlock_http_request_duration_seconds",
		Help: "Duration of HTTP requests by method, route pattern (never the raw path) and status code.", Buckets: opBuckets},
		[]string{"method", "route", "code"})
	mt.reg.MustRegister(mt.http)
	return mt
}

// Observe records a manager operation (manager.Config.Observe).
func (mt *Metrics) Observe(o manager.Observation) {
	if h := mt.ops[o.Op]; h != nil {
		h.WithLabelValues(o.Runtime, o.Status).Observe(o.Duration.Seconds())
	}
}

// observeOp records an operation the server times itself (exec, cell).
func (mt *Metrics) observeOp(op, runtime, status string, d time.Duration) {
	mt.Observe(manager.Observation{Op: op, Runtime: runtime, Status: status, Duration: d})
}

// registerLegacy exports the counters of airlock before client_golang,
// under the same names, read from s when scraped.
func (s *Server) registerLegacy() {
	gauge := func(name, help string, f func() int64) {
		s.prom.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return float64(f()) }))
	}
	counter := func(name, help string, labels prometheus.Labels, f func() int64) {
		s.prom.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(f()) }))
	}
	c := func(f func(manager.Counters) int64) func() int64 { return func() int64 { return f(s.m.Counters()) } }
	a := func(f func(manager.Anomalies) int64) func() int64 { return func() int64 { return f(s.m.Anomalies()) } }
	gauge("airlock_sandboxes_running", "Sandboxes running now.", c(func(c manager.Counters) int64 { return c.Running }))
	gauge("airlock_pool_idle", "Ready sandboxes in the warm pool.", func() int64 { return int64(s.m.PoolIdle()) })
	counter("airlock_sandboxes_created_total", "Sandboxes created.", nil, c(func(c manager.Counters) int64 { return c.Created }))
	counter("airlock_sandboxes_killed_total", "Sandboxes killed on request or shutdown.", nil, c(func(c manager.Counters) int64 { return c.Killed }))
	counter("airlock_sandboxes_expired_total", "Sandboxes killed by their TTL.", nil, c(func(c manager.Counters) int64 { return c.Expired }))
	counter("airlock_sandboxes_lost_total", "Sandboxes lost across a server restart.", nil, c(func(c manager.Counters) int64 { return c.Lost }))
	counter("airlock_sandboxes_reattached_total", "Sandboxes reattached after a server restart.", nil, c(func(c manager.Counters) int64 { return c.Reattached }))
	counter("airlock_sandbox_create_errors_total", "Failed sandbox creations.", nil, c(func(c manager.Counters) int64 { return c.CreateErrors }))
	counter("airlock_execs_total", "Processes started through the API.", nil, s.execs.Load)
	counter("airlock_sandbox_oom_kills_total", "Processes the out-of-memory killer killed in sandboxes (audited as anomaly.oom_kill).", nil,
		a(func(a manager.Anomalies) int64 { return a.OOMKills }))
	counter("airlock_sandbox_pids_limit_hits_total", "Forks refused at a sandbox's pids limit, a fork storm's sign (audited as anomaly.pids_limit).", nil,
		a(func(a manager.Anomalies) int64 { return a.PidsLimitHits }))
	counter("airlock_egress_denied_total", "Connections the egress proxy refused (audited as anomaly.egress_denied).", nil,
		a(func(a manager.Anomalies) int64 { return a.EgressDenied }))
	counter("airlock_http_requests_total", "HTTP requests received.", nil, s.requests.Load)
	counter("airlock_http_errors_total", "HTTP error responses.", prometheus.Labels{"class": "4xx"}, s.errors4xx.Load)
	counter("airlock_http_errors_total", "HTTP error responses.", prometheus.Labels{"class": "5xx"}, s.errors5xx.Load)
}

// prometheus serves GET /metrics in Prometheus' text format (or
// OpenMetrics, if the scraper asks for it).
func (s *Server) prometheus(w http.ResponseWriter, r *http.Request) error {
	s.promHandler.ServeHTTP(w, r)
	return nil
}

// handler serves the registry; a failing collector answers 500
// rather than a partial scrape that would look like a reset.
func (mt *Metrics) handler() http.Handler {
	return promhttp.HandlerFor(mt.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError})
}

// timedOps are the routes whose requests are an operation of their own.
var timedOps = map[string]string{
	"POST /v1/sandboxes/{id}/exec": "exec",
	"POST /v1/sandboxes/{id}/code": "cell",
}

// methodLabel bounds the method label to the methods the API uses.
func methodLabel(m string) string {
	switch m = strings.ToUpper(m); m {
	case "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS":
		return m
	}
	return "other"
}
