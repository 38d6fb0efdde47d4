package metrics

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestMetricsExposed(t *testing.T) {
	m := New("worker")
	now := time.Now()
	m.Finished("success", now.Add(-3*time.Second), now.Add(-2*time.Second), now)
	m.Submitted("accepted")
	m.ProxyCall("call_tool", errors.New("x"), time.Millisecond)
	m.MCPRequest("tools/call")
	m.StateResync("MCPEXEC_MEMORY")
	depth := 7.0
	m.Gauge("mcpexec_queue_depth", "Pending jobs.", func() float64 { return 1 })
	m.Gauge("mcpexec_queue_depth", "Pending jobs.", func() float64 { return depth }) // replaces
	m.Counter("mcpexec_container_starts_total", "Containers started.", func() float64 { return 3 })

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`mcpexec_jobs_finished_total{component="worker",status="success"} 1`,
		`mcpexec_job_total_seconds_count{component="worker"} 1`,
		`mcpexec_job_queued_seconds_sum{component="worker"} 1`,
		`mcpexec_jobs_submitted_total{component="worker",outcome="accepted"} 1`,
		`mcpexec_proxy_call_seconds_count{component="worker",method="call_tool",outcome="error"} 1`,
		`mcpexec_mcp_requests_total{component="worker",method="tools/call"} 1`,
		`mcpexec_state_replica_resyncs_total{component="worker",stream="MCPEXEC_MEMORY"} 1`,
		`mcpexec_queue_depth 7`,
		`mcpexec_container_starts_total 3`,
		`go_goroutines`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestNilMetricsRecordNothing(t *testing.T) {
	var m *Metrics
	m.Finished("success", time.Now(), time.Now(), time.Now())
	m.Submitted("accepted")
	m.ProxyCall("x", nil, 0)
	m.MCPRequest("x")
	m.StateResync("x")
	m.Gauge("g", "h", func() float64 { return 0 })
}
