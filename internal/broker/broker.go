// Package broker runs the embedded NATS server with JetStream, creates the
// streams, and hosts the state service on its bbolt file.
package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/state/boltstore"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/natsauth"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
)

// MaxPayload is the largest NATS message the broker accepts: results carry up to
// 1 MiB of each output stream, proxy results up to the 16 MiB frame limit.
const MaxPayload = 24 << 20

// Config configures a Broker.
type Config struct {
	DataDir string // JetStream store and state file live here
	Listen  string // host:port for NATS clients; "" means no TCP listener
	Queue   queue.Config
	Logger  *slog.Logger

	// ServerName names this node; the nodes of a cluster need distinct names
	// ("": "mcpexec", or host-and-route-port in a cluster).
	ServerName string
	Cluster    ClusterConfig // zero: a single node
	// Sync is when JetStream fsyncs its writes (zero: before it acknowledges
	// each one).
	Sync     SyncPolicy
	Security Security // zero: no authentication, no TLS
	// NoState runs no state replica on this node (by default every node runs
	// one, folding the replicated streams into its own file).
	NoState bool
	// RebuildState deletes this node's state file at start: the replica is
	// rebuilt from the streams.
	RebuildState bool
	// StallRepair is how long the jobs stream may stay without a leader,
	// with every node connected, before the brokers replace it (0:
	// DefaultStallRepair; negative: never, the start fails with the
	// repair to make by hand). See stall.go.
	StallRepair time.Duration
	// ClientOptions are added to the broker's own in-process connections, e.g.
	// the credentials it needs under a --nats-config authorization.
	ClientOptions []nats.Option
	// Metrics, when set, receives the state service's job metrics and the queue
	// depth gauge.
	Metrics *metrics.Metrics
	// Tracing receives the state service's spans (job events applied,
	// memory writes); nil: none.
	Tracing trace.TracerProvider
}

// Broker is a running NATS server with the mcpexec streams and state service.
type Broker struct {
	cfg   Config
	ns    *server.Server
	nc    *nats.Conn
	store *boltstore.Store
	svc   *state.Service
	// barrier makes what JetStream acknowledged durable: a Syncer of the
	// store with barriers (Barriers), else durable.None. barriers serves it
	// to the fleet's writers.
	barrier  durable.Barrier
	barriers *durable.Server

	repaired bool // this start has replaced a stalled jobs stream once

	once sync.Once
}

// Start starts the server, creates the streams and starts the state service.
func Start(ctx context.Context, cfg Config) (*Broker, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir %s: %w", cfg.DataDir, err)
	}
	opts, err := serverOptions(cfg)
	if err != nil {
		return nil, err
	}
	// The disk is looked at once: the restart below and every reload keep
	// the limit chosen here.
	store, free, short := storeLimit(opts.StoreDir, cfg.Queue.StoreBound())
	keepStoreLimit(opts, store)
	if err := checkExposure(cfg, opts); err != nil {
		return nil, err
	}
	if short {
		cfg.Logger.Warn("the data directory's disk has less free space than the streams are bounded to: the broker runs, and writes fail once the disk is full",
			"data_dir", cfg.DataDir, "free_mib", free>>20, "bounds_mib", cfg.Queue.StoreBound()>>20,
			"fix", "free disk space, or put the data directory (--data) on a larger disk")
	}
	if !cfg.Sync.Always() {
		cfg.Logger.Warn("JetStream acknowledges writes before they reach the disk: a power cut loses up to the sync interval of acknowledged jobs and memory writes",
			"sync", cfg.Sync.String(), "fix", "run with --sync always (the default)")
	}
	removed, err := pruneAside(opts.StoreDir, time.Now())
	for _, dir := range removed {
		cfg.Logger.Info("removed a copy of a replaced jobs stream kept over a week", "aside", dir)
	}
	if err != nil {
		cfg.Logger.Warn("remove old copies of replaced jobs streams", "dir", opts.StoreDir, "err", err)
	}
	b, err := start(ctx, cfg, opts, false)
	var stall *stallRepair
	if !errors.As(err, &stall) {
		return b, err
	}
	// Every node found the jobs stream stalled: replace this node's copy
	// and start again; the stream comes back empty, and the jobs it held
	// are queued again from their submissions.
	aside, err := setAside(opts.StoreDir, stall.files)
	if err != nil {
		return nil, fmt.Errorf("replace the stalled stream %s: %w", stall.stream, err)
	}
	cfg.Logger.Error("the jobs stream had no leader on any node although every node was up: this node's copy is set aside and the cluster creates it again; the jobs it held are queued again",
		"stream", stall.stream, "stalled_for", stall.after.Round(time.Second), "aside", aside,
		"why", "after a power cut of every node, each replica of a work-queue stream can find itself behind the stream's last snapshot (docs/design.md, \"A stream no replica will lead\")")
	if opts, err = serverOptions(cfg); err != nil {
		return nil, err
	}
	keepStoreLimit(opts, store)
	if b, err = start(ctx, cfg, opts, true); err != nil {
		return nil, err
	}
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	defer ccancel()
	if err := b.resetStaleConsumers(cctx); err != nil {
		cfg.Logger.Error("reset the consumers of the replaced jobs stream: workers may not get its jobs; delete and create them again (nats consumer rm/add)",
			"stream", stall.stream, "err", err)
	}
	if b.svc == nil {
		cfg.Logger.Warn("this node runs no state replica: the jobs the replaced stream held are requeued by the nodes that run one")
		return b, nil
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	n, err := b.svc.RequeueQueued(rctx)
	if err != nil {
		cfg.Logger.Error("requeue the jobs of the replaced stream", "requeued", n, "err", err)
	} else {
		cfg.Logger.Info("requeued the jobs of the replaced stream", "requeued", n)
	}
	return b, nil
}

// start starts the NATS server of opts and the broker around it. repaired
// says whether this node has replaced a stalled stream in this start: a
// second stall is then an error to the operator.
func start(ctx context.Context, cfg Config, opts *server.Options, repaired bool) (*Broker, error) {
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("configure NATS server: %w", err)
	}
	ns.SetLoggerV2(natsLog{cfg.Logger}, false, false, false)
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("NATS server did not start listening on %s within 10s (port in use?)", cfg.Listen)
	}
	b := &Broker{cfg: cfg, ns: ns, repaired: repaired, barrier: durable.None}
	if Barriers(cfg, opts) {
		b.barrier = durable.NewSyncer(ns.JetStreamConfig().StoreDir)
	}
	if err := b.init(ctx); err != nil {
		_ = b.Close() // Close always returns nil
		return nil, err
	}
	return b, nil
}

// serverOptions are the nats-server options cfg describes.
func serverOptions(cfg Config) (*server.Options, error) {
	opts := &server.Options{
		ServerName:             "mcpexec",
		JetStream:              true,
		StoreDir:               filepath.Join(cfg.DataDir, "jetstream"),
		MaxPayload:             MaxPayload,
		NoSigs:                 true,
		DisableJetStreamBanner: true,
	}
	if cfg.Listen == "" {
		opts.DontListen = true
	} else {
		host, portStr, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("listen address %q: %w (want HOST:PORT)", cfg.Listen, err)
		}
		port, err := strconv.Atoi(portStr)
		if err != nil {
			return nil, fmt.Errorf("listen port %q: %w", portStr, err)
		}
		opts.Host, opts.Port = host, port
	}
	opts, err := fleetOptions(opts, cfg)
	if err != nil {
		return nil, err
	}
	cfg.Sync.apply(opts, Barriers(cfg, opts))
	return opts, nil
}

// Reload re-reads the NATS configuration file (--nats-config) and applies it
// to the running server: identities `broker auth add` minted are accepted and
// those `broker auth remove` revoked are refused (their connections closed),
// without a restart.
func (b *Broker) Reload() error {
	opts, err := serverOptions(b.cfg)
	if err != nil {
		return err
	}
	if b.cfg.Listen != "" {
		// A port of 0 or -1 was chosen at start: keep the one in use.
		if a, ok := b.ns.Addr().(*net.TCPAddr); ok {
			opts.Port = a.Port
		}
	}
	if b.cfg.Cluster.Enabled() {
		if a := b.ns.ClusterAddr(); a != nil {
			opts.Cluster.Port = a.Port
		}
	}
	if js := b.ns.JetStreamConfig(); js != nil {
		keepStoreLimit(opts, js.MaxStore) // nats-server reloads none lower
	}
	if err := b.ns.ReloadOptions(opts); err != nil {
		return fmt.Errorf("reload the NATS configuration: %w", err)
	}
	return nil
}

func (b *Broker) init(ctx context.Context) error {
	nc, err := nats.Connect("", b.clientOptions("mcpexec-broker")...)
	if err != nil {
		return fmt.Errorf("connect to embedded server: %w", err)
	}
	b.nc = nc
	// Before any write of the broker's own: every broker answers barriers
	// (at once where JetStream syncs each write), so that a writer that
	// cannot tell the brokers' mode may always ask.
	if b.barriers, err = durable.Serve(nc, b.cfg.Queue.Subjects.SyncBarrier(), b.barrier); err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if err := b.setupStreams(ctx, js); err != nil {
		return err
	}
	// One whole pass: the streams and buckets made or changed just now are
	// durable before any writer's barrier (which syncs its own stream's
	// messages only), and so is what clients wrote to streams recovered
	// from disk before the subscription above.
	if err := b.barrier.Sync(ctx); err != nil {
		return err
	}
	b.cfg.Metrics.Gauge("mcpexec_queue_depth", "Jobs waiting in the jobs stream.", func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, b.cfg.Queue.Subjects.JobsStream())
		if err != nil {
			return -1
		}
		return float64(st.CachedInfo().State.Msgs)
	})
	if b.cfg.NoState {
		return nil
	}
	path := filepath.Join(b.cfg.DataDir, "state.db")
	if b.cfg.RebuildState {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rebuild state: remove %s: %w", path, err)
		}
		b.cfg.Logger.Info("rebuilding the state replica from the streams", "file", path)
	}
	b.store, err = boltstore.Open(path)
	if err != nil && !errors.Is(err, boltstore.ErrLocked) {
		// A lost or damaged file: keep it aside and rebuild from the streams
		// (every record and memory key is in them).
		aside := fmt.Sprintf("%s.damaged-%d", path, time.Now().Unix())
		if rerr := os.Rename(path, aside); rerr != nil {
			return fmt.Errorf("%w (and moving it aside failed: %w)", err, rerr)
		}
		b.cfg.Logger.Error("state file unusable: moved aside, rebuilding from the streams", "file", path, "aside", aside, "err", err)
		b.store, err = boltstore.Open(path)
	}
	if err != nil {
		return err
	}
	return b.startState(ctx)
}

// ClientURL is the URL NATS clients connect to ("" without a listener).
func (b *Broker) ClientURL() string {
	if b.cfg.Listen == "" {
		return ""
	}
	return b.ns.ClientURL()
}

// Connect opens a new in-process client connection to the broker.
func (b *Broker) Connect(name string) (*nats.Conn, error) {
	return nats.Connect("", b.clientOptions(name)...)
}

// Sync is the broker's sync policy.
func (b *Broker) Sync() SyncPolicy { return b.cfg.Sync }

// GroupSync reports whether the broker keeps sync always with group sync
// barriers (one node): JetStream acknowledges at once, and the fleet's
// writers wait for a barrier before they report success.
func (b *Broker) GroupSync() bool { return b.barrier != durable.None }

// Barrier is what makes the broker's acknowledged writes durable: a group
// sync of its store where it keeps sync always with barriers, else a no-op.
func (b *Broker) Barrier() durable.Barrier { return b.barrier }

// Server returns the embedded NATS server.
func (b *Broker) Server() *server.Server { return b.ns }

// Store returns the state store.
func (b *Broker) Store() *boltstore.Store { return b.store }

// Close stops the state service and the server. It is idempotent.
func (b *Broker) Close() error {
	b.once.Do(func() {
		if b.svc != nil {
			b.svc.Stop()
		}
		if b.barriers != nil {
			b.barriers.Stop()
		}
		if b.nc != nil {
			_ = b.nc.Drain() // fails only on a closed connection; Close below ends it either way
			b.nc.Close()
		}
		if b.store != nil {
			if err := b.store.Close(); err != nil {
				b.cfg.Logger.Warn("close the state store", "err", err)
			}
		}
		b.ns.Shutdown()
		b.ns.WaitForShutdown()
	})
	return nil
}

// checkExposure refuses a listener beyond loopback (clients or cluster
// routes) that anyone reaching it could use: a client listener without a
// configuration, a user or TLS; a route listener whose routes, in opts, the
// server options to start with, neither authenticate nor verify a certificate
// (a stranger's nats-server joining as a route reads every message).
func checkExposure(cfg Config, opts *server.Options) error {
	sec := cfg.Security
	if cfg.Listen != "" && !cli.IsLoopback(cfg.Listen) && sec.ConfigFile == "" && sec.User == "" && sec.TLSCert == "" {
		return fmt.Errorf("--listen %s listens beyond loopback without authentication: anyone reaching it could read every tenant's memory and run jobs. "+
			"Run `broker auth init DIR` and add --nats-config DIR/nats.conf (workers and front-ends then use --nats-nkey DIR/worker.nk and DIR/frontend.nk), "+
			"or set --auth-user/--auth-password, or --tls-cert/--tls-key/--tls-ca; or listen on 127.0.0.1", cfg.Listen)
	}
	flag, addr := "--cluster-listen", cfg.Cluster.Listen
	if !cfg.Cluster.Enabled() {
		if opts.Cluster.Port == 0 {
			return nil
		}
		// A cluster block of --nats-config.
		flag, addr = "the cluster listener of --nats-config", net.JoinHostPort(opts.Cluster.Host, strconv.Itoa(opts.Cluster.Port))
	}
	if cli.IsLoopback(addr) || routesSecured(opts) {
		return nil
	}
	fix := "Run `broker auth init DIR` and pass --nats-config DIR/nats.conf on every node, with the same DIR (nats.conf, broker.nk, " + natsauth.RouteSecretName + ") copied to each"
	if sec.ConfigFile != "" {
		f := natsauth.RouteSecretFile(sec.ConfigFile)
		fix = fmt.Sprintf("%s is missing: copy it from the other nodes' config directory, or re-run `broker auth init --force %s` (this replaces every credential) and copy the directory to every node",
			f, filepath.Dir(sec.ConfigFile))
	}
	return fmt.Errorf("%s %s accepts routes beyond loopback that are not authenticated: any nats-server reaching it could join the cluster and read every message. "+
		"%s; or set --auth-user/--auth-password, or --tls-cert/--tls-key/--tls-ca (routes must present a certificate the CA signed); or listen on 127.0.0.1", flag, addr, fix)
}
