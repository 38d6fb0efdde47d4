package testutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// Cluster is an in-process NATS cluster of brokers on loopback, started with
// the same flags: every node runs a state replica.
type Cluster struct {
	Nodes []*broker.Broker
	URLs  []string // client URL of each node

	cfgs []broker.Config // each node's configuration, to restart it

	mu     sync.Mutex // guards closed
	closed []bool
}

// StartCluster starts n brokers clustered on random loopback ports, with
// streams of qcfg.Replicas replicas (3 when zero and n ≥ 3), and waits until the
// streams exist. Each node has its own data dir and server name; each mutate
// function may change node i's configuration before it starts.
func StartCluster(t testing.TB, n int, qcfg queue.Config, mutate ...func(i int, cfg *broker.Config)) *Cluster {
	t.Helper()
	if qcfg.Replicas <= 1 {
		qcfg.Replicas = min(n, 3)
	}
	all := FreePorts(t, 2*n)
	ports, clientPorts := all[:n], all[n:]
	routes := make([]string, n)
	for i, p := range ports {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", p)
	}
	c := &Cluster{Nodes: make([]*broker.Broker, n), URLs: make([]string, n), closed: make([]bool, n), cfgs: make([]broker.Config, n)}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := broker.Config{
				DataDir:    t.TempDir(),
				Listen:     fmt.Sprintf("127.0.0.1:%d", clientPorts[i]),
				Queue:      qcfg,
				Logger:     Logger(t).With("node", i),
				ServerName: fmt.Sprintf("node%d", i),
				Cluster:    broker.ClusterConfig{Name: "mcpexec-test", Listen: fmt.Sprintf("127.0.0.1:%d", ports[i]), Routes: routes},
			}
			for _, m := range mutate {
				m(i, &cfg)
			}
			c.cfgs[i] = cfg
			c.Nodes[i], errs[i] = broker.Start(ctx, cfg)
		}()
	}
	wg.Wait()
	for i := range n {
		if c.Nodes[i] != nil {
			t.Cleanup(func() { c.Kill(i) })
			c.URLs[i] = c.Nodes[i].ClientURL()
		}
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start cluster node %d: %v", i, err)
		}
	}
	return c
}

// URL is the comma-separated client URL of every node, as a fleet process is
// configured.
func (c *Cluster) URL() string { return strings.Join(c.URLs, ",") }

// State is a node whose state replica tests read (node 0; every node has one).
func (c *Cluster) State() *broker.Broker { return c.Nodes[0] }

// Kill stops node i (its clients see their connection drop). Idempotent.
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	if c.closed[i] {
		c.mu.Unlock()
		return
	}
	c.closed[i] = true
	b := c.Nodes[i]
	c.mu.Unlock()
	_ = b.Close() // a killed node: its errors do not matter
}

// Restart starts killed node i again, on its data dir, ports and name; mutate
// may change its configuration first (e.g. RebuildState).
func (c *Cluster) Restart(t testing.TB, i int, mutate ...func(cfg *broker.Config)) {
	t.Helper()
	c.mu.Lock()
	if !c.closed[i] {
		c.mu.Unlock()
		t.Fatalf("restart node %d: it is running", i)
	}
	c.mu.Unlock()
	cfg := c.cfgs[i]
	for _, m := range mutate {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b, err := broker.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("restart node %d: %v", i, err)
	}
	c.mu.Lock()
	c.Nodes[i], c.closed[i] = b, false
	c.mu.Unlock()
}

// RestartAll starts every node again at once, as after a power cut of all
// of them (a node alone cannot start: it waits for a quorum), within wait;
// mutate may change each node's configuration first. It returns each node's
// start error; nodes that started are stopped when the test ends.
func (c *Cluster) RestartAll(t testing.TB, wait time.Duration, mutate ...func(i int, cfg *broker.Config)) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i := range c.Nodes {
		c.mu.Lock()
		closed := c.closed[i]
		c.mu.Unlock()
		if !closed {
			t.Fatalf("restart node %d: it is running", i)
		}
		cfg := c.cfgs[i]
		for _, m := range mutate {
			m(i, &cfg)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := broker.Start(ctx, cfg)
			if errs[i] = err; err != nil {
				return
			}
			c.mu.Lock()
			c.Nodes[i], c.closed[i] = b, false
			c.mu.Unlock()
		}()
	}
	wg.Wait()
	return errs
}

// Index returns the index of the node whose server name is name, or -1.
func (c *Cluster) Index(name string) int {
	for i, b := range c.Nodes {
		if b.Server().Name() == name {
			return i
		}
	}
	return -1
}

// ConnectAll opens a client connection that knows every node's URL and
// reconnects quickly, as a worker or front-end of a fleet is configured.
func (c *Cluster) ConnectAll(t testing.TB, name string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(c.URL(), nats.Name(name), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.ReconnectJitter(50*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect %s to %s: %v", name, c.URL(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// WorkerOn starts a worker on rt over the connection nc.
func WorkerOn(t testing.TB, nc *nats.Conn, rt sandbox.Runtime, cfg worker.Config) *worker.Worker {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = Logger(t)
	}
	w, err := worker.New(nc, rt, cfg)
	return started(t, "worker", w, err)
}

// FrontendOn starts a front-end with id over the connection nc.
func FrontendOn(t testing.TB, nc *nats.Conn, id string) *frontend.Frontend {
	t.Helper()
	return FrontendOnWith(t, nc, frontend.Config{ID: id})
}

// FrontendOnWith starts a front-end configured by cfg over nc (Limits and
// Logger default like FrontendWith's).
func FrontendOnWith(t testing.TB, nc *nats.Conn, cfg frontend.Config) *frontend.Frontend {
	t.Helper()
	if cfg.Limits == (jobs.Limits{}) {
		cfg.Limits = jobs.DefaultLimits()
	}
	if cfg.Logger == nil {
		cfg.Logger = Logger(t)
	}
	fe, err := frontend.New(nc, cfg)
	return started(t, "frontend", fe, err)
}

// started starts s, which New returned with err, and stops it when the test ends.
func started[S interface {
	Start(context.Context) error
	Stop()
}](t testing.TB, what string, s S, err error) S {
	t.Helper()
	if err != nil {
		t.Fatalf("new %s: %v", what, err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatalf("start %s: %v", what, err)
	}
	t.Cleanup(s.Stop)
	return s
}

// DataDir is node i's data directory (its JetStream store and state file).
func (c *Cluster) DataDir(i int) string { return c.cfgs[i].DataDir }

// AnnouncePool answers worker status requests on nc as an idle worker of
// pool that takes no job, until the test ends: front-ends then accept jobs
// for the pool, which stay queued (until a real worker of the pool starts).
func AnnouncePool(t testing.TB, nc *nats.Conn, pool string) {
	t.Helper()
	sub, err := nc.Subscribe(jobs.Subjects{}.WorkerStatus(), func(m *nats.Msg) {
		data, _ := json.Marshal(jobs.WorkerStatus{ID: "announced-" + pool, Pool: pool, Healthy: true, Since: time.Now().UTC(), At: time.Now().UTC()})
		_ = m.Respond(data) // an asker that went away wants no answer
	})
	if err != nil {
		t.Fatalf("announce pool %s: %v", pool, err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("announce pool %s: %v", pool, err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() }) // the connection may be closed first
}

// StreamLeader returns the server name leading stream, or an error when it
// has none now.
func StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (string, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return "", err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return "", err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", errors.New("no leader")
	}
	return info.Cluster.Leader, nil
}
