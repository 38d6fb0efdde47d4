// Command broker runs the mcpexec broker: an embedded NATS server with JetStream,
// the job and event streams, and the state service on a bbolt file.
package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/queue"
)

func main() {
	cli.Main("broker", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Stderr) })
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	data := fs.String("data", "./data/broker", "directory of the JetStream store and the state file")
	listen := fs.String("listen", "127.0.0.1:4222", "NATS client listen address HOST:PORT")
	httpAddr := fs.String("http", "", "serve /healthz and /metrics on HOST:PORT (optional)")
	maxQueued := fs.Int64("max-queued", queue.DefaultConfig().MaxQueued, "pending jobs held before new ones are rejected")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	fl := registerFleetFlags(fs)
	if err := cli.Parse(fs, args, nil); err != nil {
		return err
	}
	log, err := cli.Logger(stderr, *level)
	if err != nil {
		return err
	}
	if *maxQueued < 1 {
		return cli.Usagef("--max-queued must be at least 1")
	}
	qcfg := queue.DefaultConfig()
	qcfg.MaxQueued = *maxQueued
	m := metrics.New("broker")
	bcfg := broker.Config{DataDir: *data, Listen: *listen, Queue: qcfg, Logger: log, Metrics: m}
	if err := fl.apply(&bcfg, log); err != nil {
		return err
	}
	b, err := broker.Start(ctx, bcfg)
	if err != nil {
		return err
	}
	defer b.Close()
	log.Info("broker ready", "nats", b.ClientURL(), "data", *data, "cluster", bcfg.Cluster.Name,
		"replicas", bcfg.Queue.Replicas, "state_service", b.StateService())
	if *httpAddr != "" {
		_, stopOps, err := cli.ServeOps(*httpAddr, func() error {
			if !b.Server().JetStreamEnabled() {
				return errors.New("JetStream is not enabled")
			}
			return nil
		}, m.Handler(), log)
		if err != nil {
			return err
		}
		defer stopOps()
	}
	<-ctx.Done()
	log.Info("broker stopping")
	return nil
}
