package app_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/app"
	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestLazyStartRetries: an embedded stack whose runtime fails to open is
// answered "not ready" with the cause and the advice at once (not after a
// wait), retried in the background, and runs jobs once a start succeeds. Its
// embedded broker runs with the sync policy asked for.
func TestLazyStartRetries(t *testing.T) {
	var attempts atomic.Int32
	cfg := app.FrontendConfig{
		DataDir:    t.TempDir(),
		Frontend:   frontend.Config{ID: "lazy-fe", Limits: jobs.DefaultLimits()},
		Worker:     worker.DefaultConfig("lazy-w"),
		Logger:     testutil.Logger(t),
		BrokerSync: broker.SyncPolicy{Interval: time.Minute},
		NewRuntime: func(context.Context) (sandbox.Runtime, error) {
			if attempts.Add(1) == 1 {
				return nil, errors.New("podman is not installed")
			}
			return testutil.NewFakeRuntime(8), nil
		},
	}
	cfg.Worker.Queue = queue.DefaultConfig()
	l := app.StartLazily(cfg, func(err error) string { return "install it" })
	t.Cleanup(l.Close)
	// The first start fails: a call waits for that, not for StartWait.
	start := time.Now()
	_, err := l.Run(context.Background(), &jobs.Job{Code: "x"}, nil)
	if !app.IsNotReady(err) || !strings.Contains(err.Error(), "podman is not installed") || !strings.Contains(err.Error(), "to fix it: install it") {
		t.Fatalf("first call: %v", err)
	}
	if time.Since(start) >= app.StartWait {
		t.Fatalf("a failed start kept the call waiting %s", time.Since(start))
	}
	if err := l.Health(context.Background()); !app.IsNotReady(err) {
		t.Fatalf("health before the stack runs: %v", err)
	}
	select {
	case <-l.Ready():
	case <-time.After(time.Minute):
		t.Fatal("the retried start did not succeed within a minute")
	}
	rec, err := l.Run(context.Background(), &jobs.Job{Code: "ran"}, nil)
	if err != nil || rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "ran" {
		t.Fatalf("a job once ready: %+v %v", rec, err)
	}
	if n := attempts.Load(); n != 2 {
		t.Fatalf("%d starts, want 2", n)
	}
	s, err := l.Stack()
	if err != nil {
		t.Fatal(err)
	}
	if jsc := s.Broker.Server().JetStreamConfig(); jsc.SyncAlways || jsc.SyncInterval != time.Minute {
		t.Fatalf("embedded broker: sync_always %v, sync_interval %s; want interval:1m", jsc.SyncAlways, jsc.SyncInterval)
	}
}

// TestLazyCloseWhileRetrying: Close ends a start that keeps failing.
func TestLazyCloseWhileRetrying(t *testing.T) {
	l := app.StartLazily(lazyConfig(t, "lazy2", func(context.Context) (sandbox.Runtime, error) { return nil, errors.New("never") }), nil)
	if _, err := l.Submit(context.Background(), &jobs.Job{Code: "x"}); !app.IsNotReady(err) {
		t.Fatalf("submit: %v", err)
	}
	l.Close()
}
