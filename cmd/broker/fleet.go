package main

import (
	"flag"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/cmd/internal/natsflags"
	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/natsauth"
)

// fleetFlags are the broker's cluster and security flags.
type fleetFlags struct {
	serverName    string
	clusterName   string
	clusterListen string
	routes        string
	replicas      int
	state         bool
	rebuild       bool
	sync          broker.SyncPolicy
	stallRepair   time.Duration
	sec           broker.Security
	client        *natsflags.Flags // the broker's own connections, under --nats-config
}

func registerFleetFlags(fs *flag.FlagSet) *fleetFlags {
	f := &fleetFlags{}
	fs.StringVar(&f.serverName, "server-name", "", "this node's name, distinct per cluster node (default: mcpexec, or HOST-CLUSTERPORT in a cluster)")
	fs.StringVar(&f.clusterName, "cluster-name", "", "join a NATS cluster of this name (the same on every node)")
	fs.StringVar(&f.clusterListen, "cluster-listen", "", "cluster: HOST:PORT the other nodes' routes connect to")
	fs.StringVar(&f.routes, "routes", "", "cluster: comma-separated nats-route://HOST:PORT of the nodes (this node's own may be listed)")
	fs.IntVar(&f.replicas, "replicas", 0, "stream replicas (0: 3 in a cluster of 3 or more nodes, else one per node)")
	fs.BoolVar(&f.state, "state", true, "run a state replica on this node (every node of a cluster runs one by default)")
	fs.BoolVar(&f.rebuild, "rebuild-state", false, "delete this node's state file at start and rebuild it from the streams")
	fs.Var(&f.sync, "sync", broker.SyncUsage)
	fs.DurationVar(&f.stallRepair, "stall-repair", broker.DefaultStallRepair, "cluster: replace the jobs stream, and queue its jobs again, once every replica has found it without a leader for this long with every node up (-1: never, say how to repair it by hand)")
	fs.StringVar(&f.sec.ConfigFile, "nats-config", "", "nats-server configuration file for authorization/accounts (flags override it)")
	fs.StringVar(&f.sec.User, "auth-user", "", "require this NATS user on clients and routes (with --auth-password)")
	fs.StringVar(&f.sec.Password, "auth-password", "", "password of --auth-user (prefer MCPEXEC_AUTH_PASSWORD)")
	fs.StringVar(&f.sec.TLSCert, "tls-cert", "", "server certificate file: clients and routes must use TLS")
	fs.StringVar(&f.sec.TLSKey, "tls-key", "", "key file of --tls-cert")
	fs.StringVar(&f.sec.TLSCA, "tls-ca", "", "CA file: clients and routes must present a certificate it signed")
	f.client = natsflags.Register(fs)
	return f
}

// apply validates the flags and sets them on cfg.
func (f *fleetFlags) apply(cfg *broker.Config, log *slog.Logger) error {
	cfg.ServerName = f.serverName
	cfg.Cluster = broker.ClusterConfig{Name: f.clusterName, Listen: f.clusterListen}
	for _, r := range strings.Split(f.routes, ",") {
		if r = strings.TrimSpace(r); r != "" {
			cfg.Cluster.Routes = append(cfg.Cluster.Routes, r)
		}
	}
	if err := cfg.Cluster.Validate(); err != nil {
		return cli.Usagef("%v", err)
	}
	if err := f.sec.Validate(); err != nil {
		return cli.Usagef("%v", err)
	}
	switch {
	case f.replicas < 0 || f.replicas > 5:
		return cli.Usagef("--replicas must be 0 (automatic) or 1..5, got %d", f.replicas)
	case f.replicas > cfg.Cluster.Size():
		return cli.Usagef("--replicas %d is more than the %d node(s) --routes describes: list every node in --routes", f.replicas, cfg.Cluster.Size())
	case f.replicas == 0:
		cfg.Queue.Replicas = cfg.Cluster.DefaultReplicas()
	default:
		cfg.Queue.Replicas = f.replicas
	}
	cfg.Security, cfg.NoState, cfg.RebuildState, cfg.Sync = f.sec, !f.state, f.rebuild, f.sync
	switch {
	case f.stallRepair < 0:
		cfg.StallRepair = -1
	case f.stallRepair < 10*time.Second:
		return cli.Usagef("--stall-repair must be -1 (never) or at least 10s, got %s: a shorter wait could replace a stream that is only electing a leader", f.stallRepair)
	default:
		cfg.StallRepair = f.stallRepair
	}
	if f.client.Secured() {
		opts, err := f.client.Auth()
		if err != nil {
			return err
		}
		cfg.ClientOptions = opts
	} else if seed, ok := natsauth.BrokerSeed(f.sec.ConfigFile); f.sec.ConfigFile != "" && ok {
		// The configuration `broker auth init` wrote: connect as its broker.
		o, err := nats.NkeyOptionFromSeed(seed)
		if err != nil {
			return cli.Usagef("%s: %v", seed, err)
		}
		cfg.ClientOptions = []nats.Option{o}
	} else if f.sec.ConfigFile != "" && f.sec.User == "" {
		log.Warn("--nats-config is set without --nats-user, --nats-nkey or --nats-creds: the broker's own connection is unauthenticated, which works only when the config allows it")
	}
	return nil
}
