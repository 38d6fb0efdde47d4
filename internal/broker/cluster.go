package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/natsauth"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
)

// ClusterConfig makes the broker one node of a NATS cluster. NATS replicates
// the streams between the nodes; mcpexec writes no replication of its own.
type ClusterConfig struct {
	Name   string   // cluster name, the same on every node; "" means no cluster
	Listen string   // host:port of this node's route listener
	Routes []string // nats-route://host:port of the other nodes (this node's own is ignored)
	// Advertise is the host:port the other nodes reach this one at when it is
	// not Listen (a proxy or NAT between them); "" means Listen.
	Advertise string
}

// Enabled reports whether the node is part of a cluster.
func (c ClusterConfig) Enabled() bool { return c.Name != "" }

// Validate reports the first missing or malformed field, naming its flag.
func (c ClusterConfig) Validate() error {
	if !c.Enabled() {
		if c.Listen != "" || len(c.Routes) > 0 {
			return errors.New("--cluster-listen and --routes need --cluster-name (the same on every node)")
		}
		return nil
	}
	if c.Listen == "" {
		return errors.New("--cluster-name needs --cluster-listen HOST:PORT, where the other nodes reach this one")
	}
	if _, _, err := splitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--cluster-listen %q: %w", c.Listen, err)
	}
	for _, r := range c.Routes {
		u, err := url.Parse(r)
		if err != nil || u.Host == "" || (u.Scheme != "nats-route" && u.Scheme != "nats") {
			return fmt.Errorf("--routes: %q is not a route URL: want nats-route://HOST:PORT", r)
		}
	}
	return nil
}

// Size is the number of nodes the configuration describes: this node and each
// distinct route that is not this node's own listen address.
func (c ClusterConfig) Size() int {
	if !c.Enabled() {
		return 1
	}
	seen := map[string]bool{normalHostPort(c.Listen): true}
	if c.Advertise != "" {
		seen[normalHostPort(c.Advertise)] = true
	}
	n := 1
	for _, r := range c.Routes {
		u, err := url.Parse(r)
		if err != nil {
			continue
		}
		if hp := normalHostPort(u.Host); !seen[hp] {
			seen[hp] = true
			n++
		}
	}
	return n
}

// DefaultReplicas is the stream replica count for the configured cluster: 3
// when it has 3 or more nodes (DESIGN §1), else one replica per node.
func (c ClusterConfig) DefaultReplicas() int { return min(c.Size(), 3) }

// Security holds the server side of NATS authentication and TLS.
type Security struct {
	// ConfigFile is a nats-server configuration file (authorization, accounts,
	// NKey users, TLS, ...) applied first; the settings below and the broker's
	// own (listen address, JetStream store, cluster) override it. A
	// route.secret beside it (`broker auth init`) authenticates the routes.
	ConfigFile string
	User       string // single user with every permission (with Password)
	Password   string
	TLSCert    string // server certificate: clients must use TLS
	TLSKey     string
	TLSCA      string // when set, clients (and routes) must present a certificate it signed
}

// routesSecured reports whether opts let only known servers in as routes: they
// authenticate with a user and password, or present a certificate the route
// TLS verifies.
func routesSecured(opts *server.Options) bool {
	c := opts.Cluster
	return c.Username != "" || opts.CustomRouterAuthentication != nil ||
		(c.TLSConfig != nil && c.TLSConfig.ClientAuth == tls.RequireAndVerifyClientCert)
}

// Validate reports the first inconsistent setting, naming its flag.
func (s Security) Validate() error {
	switch {
	case (s.User == "") != (s.Password == ""):
		return errors.New("--auth-user and --auth-password go together: give both or neither")
	case (s.TLSCert == "") != (s.TLSKey == ""):
		return errors.New("--tls-cert and --tls-key go together: give both or neither")
	case s.TLSCA != "" && s.TLSCert == "":
		return errors.New("--tls-ca needs --tls-cert and --tls-key (the server must speak TLS to verify clients)")
	}
	for _, f := range []struct{ flag, path string }{
		{"--nats-config", s.ConfigFile}, {"--tls-cert", s.TLSCert}, {"--tls-key", s.TLSKey}, {"--tls-ca", s.TLSCA},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return fmt.Errorf("%s %s: %w", f.flag, f.path, err)
		}
	}
	return nil
}

// fleetOptions applies cfg's security and cluster settings to base, the
// broker's own server options, and returns the options to start with.
func fleetOptions(base *server.Options, cfg Config) (*server.Options, error) {
	if err := cfg.Security.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.Cluster.Validate(); err != nil {
		return nil, err
	}
	opts := base
	sec := cfg.Security
	if sec.ConfigFile != "" {
		fo, err := server.ProcessConfigFile(sec.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("nats config %s: %w", sec.ConfigFile, err)
		}
		fo.ServerName = base.ServerName
		fo.JetStream, fo.StoreDir = base.JetStream, base.StoreDir
		fo.MaxPayload, fo.NoSigs, fo.DisableJetStreamBanner = base.MaxPayload, base.NoSigs, base.DisableJetStreamBanner
		fo.Host, fo.Port, fo.DontListen = base.Host, base.Port, base.DontListen
		opts = fo
	}
	if sec.User != "" {
		opts.Username, opts.Password = sec.User, sec.Password
	}
	var tlsCfg *server.TLSConfigOpts
	if sec.TLSCert != "" {
		tlsCfg = &server.TLSConfigOpts{CertFile: sec.TLSCert, KeyFile: sec.TLSKey, CaFile: sec.TLSCA, Verify: sec.TLSCA != "", Timeout: 2}
		tc, err := server.GenTLSConfig(tlsCfg)
		if err != nil {
			return nil, fmt.Errorf("TLS from --tls-cert %s, --tls-key %s: %w", sec.TLSCert, sec.TLSKey, err)
		}
		opts.TLSConfig, opts.TLS, opts.TLSVerify, opts.TLSTimeout = tc, true, tlsCfg.Verify, tlsCfg.Timeout
		opts.TLSCert, opts.TLSKey, opts.TLSCaCert = sec.TLSCert, sec.TLSKey, sec.TLSCA
	}
	if cfg.ServerName != "" {
		opts.ServerName = cfg.ServerName
	}
	c := cfg.Cluster
	if !c.Enabled() {
		return opts, nil
	}
	host, port, err := splitHostPort(c.Listen)
	if err != nil {
		return nil, fmt.Errorf("--cluster-listen %q: %w", c.Listen, err)
	}
	opts.Cluster.Name, opts.Cluster.Host, opts.Cluster.Port = c.Name, host, port
	opts.Cluster.Advertise = c.Advertise
	if cfg.ServerName == "" {
		// JetStream clustering needs a distinct name per node, also when the
		// nodes share a host.
		h, _ := os.Hostname()
		opts.ServerName = fmt.Sprintf("%s-%d", h, port)
	}
	// Routes authenticate, so no stranger's server joins as a route and reads
	// every message: with the --auth-user credentials, else with a cluster
	// authorization of --nats-config, else with the route secret `broker auth
	// init` wrote beside it (its authorization block is for clients only).
	switch {
	case sec.User != "":
		opts.Cluster.Username, opts.Cluster.Password = sec.User, sec.Password
	case opts.Cluster.Username != "":
	case sec.ConfigFile != "":
		secret, ok, err := natsauth.RouteSecret(sec.ConfigFile)
		if err != nil {
			return nil, err
		}
		if ok {
			opts.Cluster.Username, opts.Cluster.Password = natsauth.RouteUser, secret
		}
	}
	if tlsCfg != nil {
		rt := *tlsCfg
		tc, err := server.GenTLSConfig(&rt)
		if err != nil {
			return nil, fmt.Errorf("route TLS: %w", err)
		}
		// A node is both client and server of its routes: it verifies its peers
		// with the same CA it requires of them (as nats-server's own config does).
		tc.RootCAs = tc.ClientCAs
		opts.Cluster.TLSConfig, opts.Cluster.TLSTimeout = tc, rt.Timeout
	}
	opts.Routes = nil
	for _, r := range c.Routes {
		u, err := url.Parse(r)
		if err != nil {
			return nil, fmt.Errorf("--routes: %q: %w", r, err)
		}
		if normalHostPort(u.Host) == normalHostPort(c.Listen) {
			continue // this node
		}
		if opts.Cluster.Username != "" && u.User == nil {
			u.User = url.UserPassword(opts.Cluster.Username, opts.Cluster.Password)
		}
		opts.Routes = append(opts.Routes, u)
	}
	return opts, nil
}

// clientOptions are the options of the broker's own in-process connections: the
// configured ones, or the --auth-user credentials when none are configured.
func (b *Broker) clientOptions(name string) []nats.Option {
	opts := []nats.Option{nats.InProcessServer(b.ns), nats.Name(name), nats.MaxReconnects(-1)}
	if len(b.cfg.ClientOptions) == 0 && b.cfg.Security.User != "" {
		opts = append(opts, nats.UserInfo(b.cfg.Security.User, b.cfg.Security.Password))
	}
	return append(opts, b.cfg.ClientOptions...)
}

// stallWarnAfter is how long stream setup waits, with every node connected
// and a stream leaderless, before it warns that the stream may never get a
// leader (a restart after a power cut of every node takes 12-18 s).
const stallWarnAfter = 45 * time.Second

// clusterRetry is how often stream setup is retried while a cluster forms.
const clusterRetry = 250 * time.Millisecond

// setupStreams creates the streams, retrying while a cluster has no meta
// leader yet or too few nodes for the replicas (queue.Setup is idempotent, so
// every node may run it). It returns when the streams exist or ctx ends.
func (b *Broker) setupStreams(ctx context.Context, js jetstream.JetStream) error {
	w, err := b.watchStall()
	if err != nil {
		return err
	}
	defer w.stop()
	err = b.retryUntilReady(ctx, "create streams", func(ctx context.Context) error {
		err := queue.Setup(ctx, js, b.cfg.Queue)
		if err != nil {
			if rerr := w.check(); rerr != nil {
				return rerr
			}
		}
		return err
	})
	if err != nil {
		return err
	}
	return w.afterReady()
}

// startState starts the state service, retrying while the cluster settles (its
// durable consumer on the events stream needs the stream's leader).
func (b *Broker) startState(ctx context.Context) error {
	return b.retryUntilReady(ctx, "start state service", func(ctx context.Context) error {
		svc, err := state.NewService(b.nc, b.store, b.cfg.Queue.Subjects, b.cfg.Logger)
		if err != nil {
			return err
		}
		svc.Metrics, svc.Node, svc.Tracing = b.cfg.Metrics, b.ns.Name(), b.cfg.Tracing
		svc.Metadata = map[string]string{SyncMetadata: b.cfg.Sync.String()}
		if b.barrier != durable.None {
			svc.Metadata[durable.BarrierMetadata] = "true"
		}
		svc.Barrier = b.barrier
		svc.QueuedMaxAge = b.cfg.Queue.QueuedMaxAge
		svc.AuditRetention = b.cfg.Queue.AuditMaxAge
		svc.FilesBucket = queue.FilesBucketConfig(b.cfg.Queue)
		if err := svc.Start(ctx); err != nil {
			svc.Stop()
			return err
		}
		b.svc = svc
		return nil
	})
}

func (b *Broker) retryUntilReady(ctx context.Context, what string, op func(context.Context) error) error {
	if !b.cfg.Cluster.Enabled() {
		return op(ctx)
	}
	var lastLog time.Time
	start := time.Now()
	for attempt := 1; ; attempt++ {
		var err error
		if !b.ns.JetStreamIsCurrent() {
			// No meta leader yet: an API request would only time out.
			err = errors.New("the JetStream meta group has no leader yet")
		} else {
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = op(actx)
			cancel()
		}
		var stall *stallRepair
		if errors.As(err, &stall) {
			return err
		}
		if err == nil {
			if attempt > 1 {
				b.cfg.Logger.Info("cluster ready", "step", what, "attempts", attempt)
			}
			return nil
		}
		if ctx.Err() != nil {
			if stalled := b.stalledStreams(); len(stalled) > 0 {
				return stalledError(what, b.cfg.Cluster.Name, stalled, err)
			}
			return fmt.Errorf("%s: the cluster %q did not become ready (%w): start the other nodes (routes %v), or check that they reach each other", what, b.cfg.Cluster.Name, err, b.cfg.Cluster.Routes)
		}
		if time.Since(lastLog) > 5*time.Second {
			lastLog = time.Now()
			b.cfg.Logger.Info("waiting for the cluster", "step", what, "cluster", b.cfg.Cluster.Name,
				"routes", b.ns.NumRoutes(), "nodes_configured", b.cfg.Cluster.Size(), "replicas", b.cfg.Queue.Replicas, "err", err)
			if time.Since(start) > stallWarnAfter {
				b.warnStalled(what, time.Since(start), err)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(clusterRetry):
		}
	}
}

// StateService reports whether this node runs the state service.
func (b *Broker) StateService() bool { return b.svc != nil }

func splitHostPort(hp string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, fmt.Errorf("%w (want HOST:PORT)", err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return "", 0, fmt.Errorf("port %q is not a number", portStr)
	}
	return host, port, nil
}

// normalHostPort makes loopback and wildcard spellings of one address compare equal.
func normalHostPort(hp string) string {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return strings.ToLower(hp)
	}
	switch host {
	case "localhost", "127.0.0.1", "::1", "0.0.0.0", "::", "":
		host = "local"
	}
	return strings.ToLower(host) + ":" + port
}
