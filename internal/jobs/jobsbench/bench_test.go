package jobsbench_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/broker"
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
// no-op runtime, and counted once every state replica has recorded each one's
// terminal status in its bbolt file (fsynced). "nodes=1" is one broker;
// "nodes=3" a cluster of three, streams replicated three ways and every node
// folding them into its own replica. Each runs with the brokers' default sync
// policy, "sync=always" (JetStream fsyncs each write before it acknowledges
// it), and next to it "sync=interval:2m" (nats-server's own default: fsync
// every two minutes), so one run shows what durability costs.
func BenchmarkThroughput(b *testing.B) {
	for _, nodes := range []int{1, 3} {
		for _, sync := range []broker.SyncPolicy{{}, {Interval: 2 * time.Minute}} {
			b.Run(fmt.Sprintf("nodes=%d/sync=%s", nodes, sync), func(b *testing.B) { throughput(b, nodes, sync) })
		}
	}
}

func throughput(b *testing.B, nodes int, sync broker.SyncPolicy) {
	qcfg := queue.DefaultConfig()
	qcfg.MaxQueued = 1_000_000
	var replicas []*broker.Broker
	var connect func(name string) *nats.Conn
	if nodes == 1 {
		br := testutil.Broker(b, "", qcfg, func(cfg *broker.Config) { cfg.Sync = sync })
		replicas = []*broker.Broker{br}
		connect = func(name string) *nats.Conn { return testutil.Connect(b, br, name) }
	} else {
		c := testutil.StartCluster(b, nodes, qcfg, func(_ int, cfg *broker.Config) { cfg.Sync = sync })
		replicas = c.Nodes
		connect = func(name string) *nats.Conn { return c.ConnectAll(b, name) }
	}
	for i := range 2 {
		wcfg := worker.DefaultConfig(fmt.Sprintf("bench-w%d", i))
		wcfg.Slots = 64
		wcfg.Queue = qcfg
		wcfg.FetchWait = 200 * time.Millisecond
		testutil.WorkerOn(b, connect(wcfg.ID), nopRuntime{}, wcfg)
	}
	client, err := queue.NewClient(connect("bench-submit"), qcfg.Subjects)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	base := make([]int, len(replicas))
	for i, r := range replicas {
		if base[i], err = r.Store().FinishedCount(); err != nil {
			b.Fatal(err)
		}
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
	submitted := time.Since(start)
	deadline := time.Now().Add(time.Minute + time.Duration(b.N)*time.Millisecond)
	for i, r := range replicas {
		for {
			n, err := r.Store().FinishedCount()
			if err != nil {
				b.Fatal(err)
			}
			if n-base[i] >= b.N {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("replica %d: only %d of %d jobs recorded as finished", i, n-base[i], b.N)
			}
			time.Sleep(2 * time.Millisecond)
		}
		b.Logf("replica %d has every record %s after the start (submitting took %s)", i, time.Since(start).Round(time.Millisecond), submitted.Round(time.Millisecond))
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
}
