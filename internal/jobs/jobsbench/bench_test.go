package jobsbench_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// nopRuntime finishes every job at once with success.
type nopRuntime struct{}

func (nopRuntime) Run(context.Context, sandbox.Job, sandbox.Host) (sandbox.Result, error) {
	return sandbox.Result{Status: sandbox.StatusSuccess, Stdout: "ok\n"}, nil
}
func (nopRuntime) Close() error { return nil }

var _ sandbox.Runtime = nopRuntime{}

// BenchmarkThroughput measures jobs submitted, run and recorded per second: b.N
// jobs are submitted in batches through JetStream, run by two workers with a
// no-op runtime, and counted once the state service has recorded each one's
// terminal status in bbolt (fsynced).
func BenchmarkThroughput(b *testing.B) {
	qcfg := queue.DefaultConfig()
	qcfg.MaxQueued = 1_000_000
	br := testutil.Broker(b, "", qcfg)
	for i := range 2 {
		wcfg := worker.DefaultConfig(fmt.Sprintf("bench-w%d", i))
		wcfg.Slots = 64
		wcfg.Queue = qcfg
		wcfg.FetchWait = 200 * time.Millisecond
		testutil.Worker(b, br, nopRuntime{}, wcfg)
	}
	client, err := queue.NewClient(testutil.Connect(b, br, "bench-submit"), qcfg.Subjects)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	base, err := br.Store().FinishedCount()
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	const batch = 500
	for lo := 0; lo < b.N; lo += batch {
		n := min(batch, b.N-lo)
		js := make([]*jobs.Job, n)
		for i := range js {
			js[i] = &jobs.Job{Code: "pass"}
			if err := js[i].Normalize(jobs.DefaultLimits(), time.Now()); err != nil {
				b.Fatal(err)
			}
		}
		for i, err := range client.SubmitMany(ctx, js) {
			if err != nil {
				b.Fatalf("submit %s: %v", js[i].ID, err)
			}
		}
	}
	deadline := time.Now().Add(time.Minute + time.Duration(b.N)*time.Millisecond)
	for {
		n, err := br.Store().FinishedCount()
		if err != nil {
			b.Fatal(err)
		}
		if n-base >= b.N {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d jobs recorded as finished", n-base, b.N)
		}
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
}
