// Command worker pulls jobs from the broker and runs each in a locked-down Podman
// or Docker container (--runtime auto|podman|docker).
package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/cmd/internal/doctorcmd"
	"github.com/mcpexec/mcpexec/cmd/internal/natsflags"
	"github.com/mcpexec/mcpexec/cmd/internal/sandboxflags"
	"github.com/mcpexec/mcpexec/cmd/internal/tracingenv"
	"github.com/mcpexec/mcpexec/internal/app"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/natsauth"
	"github.com/mcpexec/mcpexec/internal/worker"
)

func main() {
	cli.Main("worker", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Stderr) })
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "doctor" {
		return doctorcmd.Main(ctx, "worker", args[1:], os.Stdout, stderr)
	}
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	natsURL := fs.String("nats", nats.DefaultURL, "NATS URL(s) of the broker, comma-separated")
	host, _ := os.Hostname()
	id := fs.String("id", host, "worker id (labels its containers; a restarted worker with the same id removes its orphans)")
	slots := fs.Int("slots", 4, "jobs run at once")
	pool := fs.String("job-pool", jobs.DefaultPool, "job pool to take jobs from")
	grace := fs.Duration("grace", 30*time.Second, "on SIGTERM, how long running jobs may finish before they are handed back")
	httpAddr := fs.String("http", "", "serve /healthz and /metrics on HOST:PORT (optional)")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	sb := sandboxflags.Register(fs)
	nf := natsflags.Register(fs)
	if err := cli.Parse(fs, args, sandboxflags.Aliases); err != nil {
		return err
	}
	log, err := cli.Logger(stderr, *level)
	if err != nil {
		return err
	}
	tp, stopTraces, err := tracingenv.Start(ctx, "mcpexec-worker", log)
	if err != nil {
		return err
	}
	defer stopTraces() // last: after the worker's final spans
	// A named worker identity (`broker auth add worker NAME`) answers only
	// as worker id NAME: take it when no --id was given.
	if sid, ok := natsauth.IdentityOf(nf.NKeyFile); ok && natsauth.WorkerID(sid) != "" {
		if !flagSet(fs, "id") {
			*id = natsauth.WorkerID(sid)
		} else if *id != natsauth.WorkerID(sid) {
			return cli.Usagef("--id %q: the NATS identity %s answers only as worker id %q (leave --id out, or use that identity's name)", *id, sid, natsauth.WorkerID(sid))
		}
	}
	if !jobs.ValidID(*id) {
		return cli.Usagef("--id %q: use letters, digits, '-' or '_'", *id)
	}
	if *slots < 1 {
		return cli.Usagef("--slots must be at least 1, got %d", *slots)
	}
	if _, err := sb.Limits(); err != nil {
		return err
	}
	nc, err := nf.Connect(*natsURL, "mcpexec-worker-"+*id, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	rt, err := sb.Open(ctx, *id, log)
	if err != nil {
		return err
	}
	defer func() { _ = rt.Close() }() // on the way out: a failure leaves nothing to do
	m := metrics.New("worker")
	app.InstrumentRuntime(m, rt)
	cfg := worker.DefaultConfig(*id)
	cfg.Slots, cfg.Pool, cfg.Grace, cfg.Logger, cfg.Metrics, cfg.Tracing = *slots, *pool, *grace, log, m, tp
	if err := sb.ConfigureWorker(&cfg); err != nil {
		return err
	}
	w, err := worker.New(nc, rt, cfg)
	if err != nil {
		return err
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	defer w.Stop()
	if *httpAddr != "" {
		_, stopOps, err := cli.ServeOps(*httpAddr, func() error {
			if !nc.IsConnected() {
				return errors.New("not connected to NATS")
			}
			return w.Health()
		}, m.Handler(), log)
		if err != nil {
			return err
		}
		defer stopOps()
	}
	<-ctx.Done()
	log.Info("worker stopping: draining running jobs", "grace", *grace)
	return nil
}

// flagSet reports whether flag name was given (on the command line or in the
// environment).
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
