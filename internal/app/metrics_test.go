package app_test

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/app"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/process"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestEmbeddedMetrics runs the embedded default with metrics on and checks that
// one job shows up in every layer's metrics, without double counting.
func TestEmbeddedMetrics(t *testing.T) {
	m := metrics.New("frontend")
	wcfg := worker.DefaultConfig("metrics-worker")
	wcfg.Metrics, wcfg.Logger = m, testutil.Logger(t)
	stack, err := app.StartFrontend(context.Background(), app.FrontendConfig{
		DataDir:  t.TempDir(),
		Frontend: frontend.Config{ID: "metrics-fe", Limits: jobs.DefaultLimits(), Metrics: m},
		Worker:   wcfg,
		NewRuntime: func(context.Context) (sandbox.Runtime, error) {
			return process.New()
		},
		Metrics: m,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Close)
	rec, err := stack.Frontend.Run(context.Background(), &jobs.Job{Code: "print(1)"}, nil)
	if err != nil || rec.Status != jobs.StatusSuccess {
		t.Fatalf("run: %v %+v", err, rec)
	}
	want := []string{
		`mcpexec_jobs_submitted_total{component="frontend",outcome="accepted"} 1`,
		`mcpexec_worker_jobs_total{component="frontend",status="success"} 1`,
		`mcpexec_jobs_finished_total{component="frontend",status="success"} 1`,
		`mcpexec_job_total_seconds_count{component="frontend"} 1`,
		`mcpexec_queue_depth 0`,
		`mcpexec_audit_entries_dropped_total 0`,
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rr := httptest.NewRecorder()
		m.Handler().ServeHTTP(rr, httptest.NewRequest("GET", "/metrics", nil))
		body, _ := io.ReadAll(rr.Body)
		var missing []string
		for _, w := range want {
			if !strings.Contains(string(body), w) {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics lack %q", missing)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
