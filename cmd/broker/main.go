// Command broker runs the mcpexec broker: an embedded NATS server with JetStream,
// the job and event streams, and the state service on a bbolt file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/mcpexec/mcpexec/cmd/internal/tracingenv"
	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/natsauth"
	"github.com/mcpexec/mcpexec/internal/queue"
)

func main() {
	cli.Main("broker", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Stderr) })
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "auth" {
		return authCmd(args[1:], os.Stdout, stderr)
	}
	if len(args) > 0 && args[0] == "backup" {
		return backupCmd(ctx, args[1:], os.Stdout, stderr)
	}
	if len(args) > 0 && args[0] == "audit" {
		return auditCmd(args[1:], os.Stdout, stderr)
	}
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	data := fs.String("data", "./data/broker", "directory of the JetStream store and the state file")
	listen := fs.String("listen", "127.0.0.1:4222", "NATS client listen address HOST:PORT")
	httpAddr := fs.String("http", "", "serve /healthz and /metrics on HOST:PORT (optional)")
	maxQueued := fs.Int64("max-queued", queue.DefaultConfig().MaxQueued, "pending jobs held before new ones are rejected")
	queuedMaxAge := fs.Duration("queued-max-age", queue.DefaultQueuedMaxAge, "a job no worker took within this is removed from the queue and recorded as rejected (at least 10m, at most 168h)")
	auditRetention := fs.Duration("audit-retention", queue.DefaultAuditRetention, "how long the audit trail of proxied tool calls keeps an entry (the audit stream's max age; replicas prune theirs too); at least 10m")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	fl := registerFleetFlags(fs)
	if err := cli.Parse(fs, args, nil); err != nil {
		return err
	}
	log, err := cli.Logger(stderr, *level)
	if err != nil {
		return err
	}
	tp, stopTraces, err := tracingenv.Start(ctx, "mcpexec-broker", log)
	if err != nil {
		return err
	}
	defer stopTraces() // last: after the state service's final spans
	if *maxQueued < 1 {
		return cli.Usagef("--max-queued must be at least 1")
	}
	qcfg := queue.DefaultConfig()
	qcfg.MaxQueued, qcfg.QueuedMaxAge, qcfg.AuditMaxAge = *maxQueued, *queuedMaxAge, *auditRetention
	if err := qcfg.Validate(); err != nil {
		return cli.Usagef("--queued-max-age %s, --audit-retention %s: %v", *queuedMaxAge, *auditRetention, err)
	}
	m := metrics.New("broker")
	bcfg := broker.Config{DataDir: *data, Listen: *listen, Queue: qcfg, Logger: log, Metrics: m, Tracing: tp}
	if err := fl.apply(&bcfg, log); err != nil {
		return err
	}
	b, err := broker.Start(ctx, bcfg)
	if err != nil {
		return err
	}
	defer func() { _ = b.Close() }() // Close always returns nil
	log.Info("broker ready", "nats", b.ClientURL(), "data", *data, "cluster", bcfg.Cluster.Name,
		"replicas", bcfg.Queue.Replicas, "state_service", b.StateService(), "sync", b.Sync().String(), "group_sync", b.GroupSync())
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
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			if err := b.Reload(); err != nil {
				log.Error("reload refused: still serving the configuration it had", "err", err)
			} else {
				log.Info("reloaded the NATS configuration", "file", bcfg.Security.ConfigFile)
			}
			continue
		case <-ctx.Done():
		}
		break
	}
	log.Info("broker stopping")
	return nil
}

const authUsage = `usage:
  broker auth init [--force] DIR   write DIR/nats.conf (one NKey user per identity, each with only
                                   its role's subjects and its own inbox) and the seed files
                                   DIR/broker.nk, DIR/frontend.nk, DIR/worker.nk and DIR/admin.nk,
                                   and DIR/route.secret, the password of the routes between brokers
  broker auth add ROLE NAME DIR    mint another identity of ROLE (worker or frontend, one per host)
                                   as DIR/ROLE-NAME.nk and rewrite DIR/nats.conf (a worker
                                   identity runs as worker id NAME, and answers for no other)
  broker auth remove ROLE [NAME] DIR
                                   revoke an identity: delete its seed and rewrite DIR/nats.conf
Brokers take a rewritten nats.conf when they reload (kill -HUP) or restart.`

// authCmd is `broker auth init|add|remove`.
func authCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "add" || args[0] == "remove") {
		return authIdentityCmd(args, stdout, stderr)
	}
	fs := flag.NewFlagSet("broker auth init", flag.ContinueOnError)
	fs.SetOutput(stderr)
	force := fs.Bool("force", false, "replace existing credentials")
	fs.Usage = func() {
		fmt.Fprintln(stderr, authUsage)
		fs.PrintDefaults()
	}
	if len(args) == 0 || args[0] != "init" {
		fs.Usage()
		return cli.Usagef("broker auth: want `broker auth init DIR`, `broker auth add ROLE NAME DIR` or `broker auth remove ROLE [NAME] DIR`")
	}
	if err := fs.Parse(args[1:]); err != nil {
		return &cli.UsageError{Err: err}
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return cli.Usagef("broker auth init: want exactly one directory, got %d arguments", fs.NArg())
	}
	dir := fs.Arg(0)
	files, err := natsauth.Init(dir, jobs.Subjects{}, *force)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s\n\nServe and connect with:\n", strings.Join(files, ", "))
	fmt.Fprintf(stdout, "  broker   --nats-config %s --listen 0.0.0.0:4222\n", filepath.Join(dir, natsauth.ConfigName))
	fmt.Fprintf(stdout, "  worker   --nats nats://BROKER:4222 --nats-nkey %s\n", natsauth.SeedFile(dir, natsauth.RoleWorker))
	fmt.Fprintf(stdout, "  frontend --nats nats://BROKER:4222 --nats-nkey %s\n", natsauth.SeedFile(dir, natsauth.RoleFrontend))
	fmt.Fprintf(stdout, "Copy %s, %s and %s to every broker node (a cluster's routes authenticate with %[3]s),\nand each other seed file only to the hosts of its role.\n",
		natsauth.ConfigName, filepath.Base(natsauth.SeedFile(dir, natsauth.RoleBroker)), natsauth.RouteSecretName)
	return nil
}

// authIdentityCmd is `broker auth add ROLE NAME DIR` and `broker auth remove ROLE [NAME] DIR`.
func authIdentityCmd(args []string, stdout, stderr io.Writer) error {
	verb, rest := args[0], args[1:]
	var id natsauth.Identity
	var dir string
	switch {
	case verb == "add" && len(rest) == 3:
		id, dir = natsauth.Identity{Role: rest[0], Name: rest[1]}, rest[2]
	case verb == "remove" && len(rest) == 2:
		id, dir = natsauth.Identity{Role: rest[0]}, rest[1]
	case verb == "remove" && len(rest) == 3:
		id, dir = natsauth.Identity{Role: rest[0], Name: rest[1]}, rest[2]
	default:
		fmt.Fprintln(stderr, authUsage)
		return cli.Usagef("broker auth %s: wrong number of arguments (%d)", verb, len(rest))
	}
	if verb == "remove" {
		if err := natsauth.Remove(dir, id, jobs.Subjects{}); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "revoked %s; reload the brokers (kill -HUP) to refuse it\n", id)
		return nil
	}
	f, err := natsauth.Add(dir, id, jobs.Subjects{})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s; reload the brokers (kill -HUP) to accept it, then use --nats-nkey %s on that host\n", f, f)
	return nil
}
