// Package metrics defines the Prometheus metrics of the three processes and
// serves them. Components receive a *Metrics (nil disables recording).
package metrics

import (
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics holds every metric a process may record. A nil *Metrics records nothing,
// so components can take one optionally.
type Metrics struct {
	Registry *prometheus.Registry

	JobsSubmitted *prometheus.CounterVec   // outcome: accepted, rejected, invalid, error
	JobsFinished  *prometheus.CounterVec   // status, recorded by the state service
	WorkerJobs    *prometheus.CounterVec   // status, recorded by the worker that ran the job
	JobQueued     prometheus.Histogram     // seconds from submission to start
	JobRunning    prometheus.Histogram     // seconds in the sandbox
	JobTotal      prometheus.Histogram     // seconds from submission to the end
	ProxyCalls    *prometheus.HistogramVec // method, outcome (ok, error)
	MCPRequests   *prometheus.CounterVec   // method
	// StateResyncs counts, by stream, the times a state replica found it had
	// applied more of the stream than the stream holds (the stream lost its
	// last writes) and resynchronised.
	StateResyncs *prometheus.CounterVec

	proxyRate rate // the proxy calls over the last minute (ProxyCallsPerMinute)
}

// New returns a registry with Go and process collectors and every metric
// registered, labelled with the component name.
func New(component string) *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := prometheus.WrapRegistererWith(prometheus.Labels{"component": component}, reg)
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}
	m := &Metrics{
		Registry: reg,
		JobsSubmitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpexec_jobs_submitted_total", Help: "Job submissions by outcome.",
		}, []string{"outcome"}),
		JobsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpexec_jobs_finished_total", Help: "Jobs finished by terminal status.",
		}, []string{"status"}),
		WorkerJobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpexec_worker_jobs_total", Help: "Jobs this worker ended, by status.",
		}, []string{"status"}),
		JobQueued: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "mcpexec_job_queued_seconds", Help: "Time from submission to start.", Buckets: buckets,
		}),
		JobRunning: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "mcpexec_job_running_seconds", Help: "Time a job ran in its sandbox.", Buckets: buckets,
		}),
		JobTotal: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "mcpexec_job_total_seconds", Help: "Time from submission to the end.", Buckets: buckets,
		}),
		ProxyCalls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "mcpexec_proxy_call_seconds", Help: "Latency of sandbox proxy calls by method and outcome.", Buckets: buckets,
		}, []string{"method", "outcome"}),
		MCPRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpexec_mcp_requests_total", Help: "MCP requests by method.",
		}, []string{"method"}),
		StateResyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "mcpexec_state_replica_resyncs_total",
			Help: "Times this state replica had applied more of a stream than the stream held (the stream lost its last writes) and resynchronised.",
		}, []string{"stream"}),
	}
	f.MustRegister(m.JobsSubmitted, m.JobsFinished, m.WorkerJobs, m.JobQueued, m.JobRunning, m.JobTotal, m.ProxyCalls, m.MCPRequests, m.StateResyncs)
	return m
}

// Gauge registers a gauge whose value fn computes at scrape time (queue depth,
// warm pool size).
func (m *Metrics) Gauge(name, help string, fn func() float64) {
	if m == nil {
		return
	}
	m.replace(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, fn))
}

// replace registers c, replacing an earlier collector of the same name (a
// component restarted in the same process).
func (m *Metrics) replace(c prometheus.Collector) {
	if err := m.Registry.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			m.Registry.Unregister(are.ExistingCollector)
			m.Registry.MustRegister(c)
			return
		}
		panic(err)
	}
}

// Counter registers a counter whose value fn reads at scrape time (container
// starts and failures kept by a runtime).
func (m *Metrics) Counter(name, help string, fn func() float64) {
	if m == nil {
		return
	}
	m.replace(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, fn))
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}

// Submitted counts a submission outcome.
func (m *Metrics) Submitted(outcome string) {
	if m != nil {
		m.JobsSubmitted.WithLabelValues(outcome).Inc()
	}
}

// Finished records a finished job: its status and its three durations.
func (m *Metrics) Finished(status string, submitted, started, finished time.Time) {
	if m == nil {
		return
	}
	m.JobsFinished.WithLabelValues(status).Inc()
	if !submitted.IsZero() && !started.IsZero() {
		m.JobQueued.Observe(started.Sub(submitted).Seconds())
	}
	if !started.IsZero() {
		m.JobRunning.Observe(finished.Sub(started).Seconds())
	}
	if !submitted.IsZero() {
		m.JobTotal.Observe(finished.Sub(submitted).Seconds())
	}
}

// WorkerJob counts a job a worker ended.
func (m *Metrics) WorkerJob(status string) {
	if m != nil {
		m.WorkerJobs.WithLabelValues(status).Inc()
	}
}

// ProxyCall records one proxy call.
func (m *Metrics) ProxyCall(method string, err error, d time.Duration) {
	if m == nil {
		return
	}
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.ProxyCalls.WithLabelValues(method, outcome).Observe(d.Seconds())
	m.proxyRate.add(time.Now())
}

// StateResync counts a state replica's resynchronisation with stream.
func (m *Metrics) StateResync(stream string) {
	if m != nil {
		m.StateResyncs.WithLabelValues(stream).Inc()
	}
}

// MCPRequest counts one MCP request.
func (m *Metrics) MCPRequest(method string) {
	if m != nil {
		m.MCPRequests.WithLabelValues(method).Inc()
	}
}
