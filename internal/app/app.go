// Package app assembles the parts into the processes: a front-end that either
// joins a fleet over NATS or embeds a broker and one worker (the embedded default).
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// RuntimeFactory opens the sandbox runtime of an embedded worker.
type RuntimeFactory func(ctx context.Context) (sandbox.Runtime, error)

// FrontendConfig configures a front-end process.
type FrontendConfig struct {
	NATSURL    string // "" embeds a broker and a worker
	NATSOpts   []nats.Option
	DataDir    string            // embedded broker's data
	BrokerAddr string            // embedded broker's TCP listener; "" for in-process only
	BrokerSync broker.SyncPolicy // embedded broker's sync policy (zero: always)
	Frontend   frontend.Config
	Worker     worker.Config // embedded worker
	NewRuntime RuntimeFactory
	Logger     *slog.Logger
	Metrics    *metrics.Metrics // nil: no metrics
}

// Stack is a running front-end with whatever it embeds.
type Stack struct {
	Broker   *broker.Broker     // nil when joining a fleet
	Worker   *worker.Worker     // nil when joining a fleet
	Runtime  sandbox.Runtime    // nil when joining a fleet
	Frontend *frontend.Frontend // always set
	conns    []*nats.Conn
}

// StartFrontend starts a front-end as configured.
func StartFrontend(ctx context.Context, cfg FrontendConfig) (_ *Stack, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Stack{}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	var nc *nats.Conn
	if cfg.NATSURL == "" {
		s.Broker, err = broker.Start(ctx, broker.Config{
			DataDir: filepath.Join(cfg.DataDir, "broker"),
			Listen:  cfg.BrokerAddr,
			Sync:    cfg.BrokerSync,
			Queue:   cfg.Worker.Queue,
			Logger:  cfg.Logger.With("component", "broker"),
			Metrics: cfg.Metrics,
			Tracing: cfg.Frontend.Tracing, // one process, one provider
		})
		if err != nil {
			return nil, err
		}
		if nc, err = s.Broker.Connect("mcpexec-frontend"); err != nil {
			return nil, fmt.Errorf("connect front-end: %w", err)
		}
		s.conns = append(s.conns, nc)
		if cfg.NewRuntime == nil {
			return nil, errors.New("embedded mode needs a sandbox runtime")
		}
		if s.Runtime, err = cfg.NewRuntime(ctx); err != nil {
			return nil, err
		}
		InstrumentRuntime(cfg.Metrics, s.Runtime)
		wnc, err := s.Broker.Connect("mcpexec-worker")
		if err != nil {
			return nil, fmt.Errorf("connect worker: %w", err)
		}
		s.conns = append(s.conns, wnc)
		// The front-end and the worker reach this process's broker in
		// process: their barriers go to its Barrier directly.
		cfg.Worker.LocalBarrier, cfg.Frontend.LocalBarrier = s.Broker.Barrier(), s.Broker.Barrier()
		// And the worker's proxy calls reach the front-end's responder in
		// process (proxy.Local).
		local := &proxy.Local{}
		cfg.Worker.LocalProxy, cfg.Frontend.LocalProxy = local, local
		if s.Worker, err = worker.New(wnc, s.Runtime, cfg.Worker); err != nil {
			return nil, err
		}
		if err := s.Worker.Start(ctx); err != nil {
			return nil, err
		}
	} else {
		opts := append([]nats.Option{nats.Name("mcpexec-frontend"), nats.MaxReconnects(-1)}, cfg.NATSOpts...)
		if nc, err = nats.Connect(cfg.NATSURL, opts...); err != nil {
			return nil, fmt.Errorf("connect to NATS at %s: %w (is the broker running? start it with `broker`)", cfg.NATSURL, err)
		}
		s.conns = append(s.conns, nc)
	}
	if s.Frontend, err = frontend.New(nc, cfg.Frontend); err != nil {
		return nil, err
	}
	if err := s.Frontend.Start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Close stops everything in reverse order. It is idempotent.
func (s *Stack) Close() {
	if s.Frontend != nil {
		s.Frontend.Stop()
	}
	if s.Worker != nil {
		s.Worker.Stop()
		s.Worker = nil
	}
	if s.Runtime != nil {
		_ = s.Runtime.Close() // closing on the way out: a failure leaves nothing to do
		s.Runtime = nil
	}
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
	if s.Broker != nil {
		_ = s.Broker.Close() // closing on the way out: a failure leaves nothing to do
		s.Broker = nil
	}
}

// InstrumentRuntime exports rt's sandbox counters (container starts and failures,
// warm pool size) when it reports them.
func InstrumentRuntime(m *metrics.Metrics, rt sandbox.Runtime) {
	sr, ok := rt.(sandbox.StatsReporter)
	if m == nil || !ok {
		return
	}
	m.Counter("mcpexec_container_starts_total", "Sandbox containers started.", func() float64 { return float64(sr.Stats().Started) })
	m.Counter("mcpexec_container_start_failures_total", "Sandbox containers that failed to start.", func() float64 { return float64(sr.Stats().StartFailures) })
	m.Gauge("mcpexec_warm_pool_size", "Started sandboxes waiting for a job.", func() float64 { return float64(sr.Stats().Warm) })
	m.Counter("mcpexec_direct_execs_total", "Jobs whose code went straight to the process waiting for it in a warm sandbox.",
		func() float64 { return float64(sr.Stats().Direct) })
}
