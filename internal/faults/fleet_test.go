package faults_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/faults/lazyfs"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman/podmantest"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// The tenant whose jobs the suite submits.
const (
	token = "tok-faults"
	ns    = "faults"
)

// logEnv makes the fleet's processes log to stderr (with -v): everything
// with 1, warnings and errors only with warn (what a broker says of a
// stall and its repair, without the debug logs that slow the fleet enough
// to change which faults do what).
const logEnv = "MCPEXEC_FAULTS_LOG"

func logging() bool { return os.Getenv(logEnv) == "1" && testing.Verbose() }

// logger is the fleet's processes' logger: silent unless logging, so that
// `make faults` (-v) prints the schedule and the results table.
func logger(t *testing.T) *slog.Logger {
	switch {
	case logging():
		return testutil.Logger(t)
	case os.Getenv(logEnv) == "warn" && testing.Verbose():
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.DiscardHandler)
}

// fleet is three brokers, each with its JetStream files on a lazy file
// system and a proxy in front of its route and client listeners, and the
// workers (process runtime) and front-ends (jobs API over HTTP) using them.
type fleet struct {
	t     *testing.T
	q     queue.Config
	opts  fleetOptions
	nodes []*node

	mu      sync.Mutex // guards the fields below
	workers []*member
	fes     []*member
	urls    []string // jobs API base URL of each running front-end
	serial  int      // names the next worker or front-end
	// podmanStarted: the worker on Podman (opts.podman) is started, under
	// the name podmanWorker.
	podmanStarted bool
	podmanWorker  string
	// replaced are the copies of a stalled jobs stream the brokers set
	// aside, logged once each.
	replaced map[string]bool
}

// node is one broker and what it runs on.
type node struct {
	i       int
	cfg     broker.Config
	backing string // the "disk" of its JetStream files
	route   *proxy // in front of its route listener: partitions, pauses
	client  *proxy // in front of its client listener: pauses

	mu sync.Mutex // guards the fields below
	fs *lazyfs.FS // mounted at cfg.DataDir/jetstream
	b  *broker.Broker
}

// member is a running worker or front-end, to kill.
type member struct {
	name string
	nc   *nats.Conn
	stop func()
	url  string // a front-end's jobs API
}

// fleetOptions configure a fleet.
type fleetOptions struct {
	sync broker.SyncPolicy
	// podman runs the fleet's first worker on Podman (the others, and the
	// workers started again after a fault, on the process runtime).
	podman bool
	// single makes the fleet one broker, no cluster, streams of one
	// replica: the embedded default's shape.
	single bool
}

func startFleet(t *testing.T, o fleetOptions) *fleet {
	t.Helper()
	if err := lazyfs.Available(); err != nil {
		t.Skipf("no power-loss harness: %v", err)
	}
	q := queue.DefaultConfig()
	// Redelivery after 10 s without a heartbeat, as in production: a worker
	// that lost its node for a moment keeps its job.
	q.AckWait, q.BackOff, q.MaxDeliver, q.Replicas = 10*time.Second, nil, 5, 3
	count := 3
	if o.single {
		count, q.Replicas = 1, 1
	}
	f := &fleet{t: t, q: q, opts: o}
	ports := testutil.FreePorts(t, 2*count)
	var routes []string
	for i := range count {
		n := &node{i: i, route: newProxy(t, true), client: newProxy(t, false)}
		routes = append(routes, "nats-route://"+n.route.addr())
		f.nodes = append(f.nodes, n)
	}
	for i, n := range f.nodes {
		dir := t.TempDir()
		n.backing = t.TempDir()
		n.cfg = broker.Config{
			DataDir:    dir,
			Listen:     fmt.Sprintf("127.0.0.1:%d", ports[2*i]),
			Queue:      q,
			Logger:     logger(t).With("node", i),
			ServerName: fmt.Sprintf("node%d", i),
			Sync:       o.sync,
			Cluster: broker.ClusterConfig{
				Name: "mcpexec-faults", Listen: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1]),
				Advertise: n.route.addr(), Routes: routes,
			},
		}
		if o.single {
			n.cfg.Cluster = broker.ClusterConfig{}
		}
		n.route.setTarget(n.cfg.Cluster.Listen)
		n.client.setTarget(n.cfg.Listen)
		if err := os.Mkdir(filepath.Join(dir, "jetstream"), 0o700); err != nil {
			t.Fatal(err)
		}
		n.mount(t)
		t.Cleanup(func() { n.down(stop) })
	}
	all := make([]int, count)
	for i := range all {
		all[i] = i
	}
	f.startAll(t, all...)
	return f
}

// mount mounts the node's lazy file system.
func (n *node) mount(t *testing.T) {
	t.Helper()
	fs, err := lazyfs.Mount(filepath.Join(n.cfg.DataDir, "jetstream"), n.backing)
	if err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.fs = fs
	n.mu.Unlock()
}

// How a node goes down.
type downMode int

const (
	cutPower downMode = iota // unsynced writes dropped, file system unmounted
	kill                     // kill -9: file system frozen while the server stops, then kept
	stop                     // the end of the test: like kill, then unmounted
	clean                    // a clean stop: the server writes what it writes at shutdown
)

// down stops the node's broker as mode says; it returns how many unsynced
// writes a power cut dropped.
func (n *node) down(mode downMode) (dropped int) {
	n.mu.Lock()
	b, fs := n.b, n.fs
	n.b = nil
	n.mu.Unlock()
	if fs == nil {
		return 0
	}
	if mode == cutPower {
		if logging() {
			fmt.Fprintf(os.Stderr, "node %d: power cut drops unsynced writes of %v\n", n.i, fs.UnsyncedFiles())
		}
		dropped = fs.Cut()
	} else if mode != clean {
		fs.Freeze()
	}
	if b != nil {
		_ = b.Close() // a failing file system: its errors are the point
	}
	switch mode {
	case kill:
		fs.Thaw()
		return 0
	case clean:
		return 0
	}
	if err := fs.Unmount(); err != nil {
		panic(err) // the next mount would fail: nothing left to test
	}
	n.mu.Lock()
	n.fs = nil
	n.mu.Unlock()
	return dropped
}

func (n *node) broker() *broker.Broker {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.b
}

// startAll starts the given nodes at once (a cluster needs a quorum to
// create its streams) and fails the test unless they all start within two
// minutes. After a power cut of all three nodes a restart usually takes
// 12-18 s here. After a history of faults the jobs stream can come back
// with no replica that will lead it (docs/design.md, "A stream no replica
// will lead"): the brokers then replace it after their default stall repair
// delay (20 s) and queue its jobs again, which the checker's count of lost
// jobs covers.
func (f *fleet) startAll(t *testing.T, idx ...int) {
	t.Helper()
	start := time.Now()
	if err := f.tryStart(2*time.Minute, idx...); err != nil {
		t.Fatalf("the fleet did not come back after %s: %v", time.Since(start).Round(time.Second), err)
	}
	if d := time.Since(start); d > time.Minute {
		t.Logf("nodes %v took %s to start", idx, d.Round(time.Second))
	}
	for _, i := range idx {
		aside, _ := filepath.Glob(filepath.Join(f.nodes[i].cfg.DataDir, "jetstream", "stalled-*"))
		f.mu.Lock()
		for _, a := range aside {
			if !f.replaced[a] {
				if f.replaced == nil {
					f.replaced = map[string]bool{}
				}
				f.replaced[a] = true
				t.Logf("node %d replaced its copy of the stalled jobs stream (set aside in %s); start took %s", i, filepath.Base(a), time.Since(start).Round(time.Second))
			}
		}
		f.mu.Unlock()
	}
}

func (f *fleet) tryStart(limit time.Duration, idx ...int) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	errs := make([]error, len(idx))
	var wg sync.WaitGroup
	for k, i := range idx {
		n := f.nodes[i]
		n.mu.Lock()
		needMount := n.fs == nil
		n.mu.Unlock()
		if needMount {
			n.mount(f.t)
		}
		wg.Go(func() {
			b, err := broker.Start(ctx, n.cfg)
			if err != nil {
				errs[k] = fmt.Errorf("start node %d: %w", i, err)
				return
			}
			n.mu.Lock()
			n.b = b
			n.mu.Unlock()
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// clientURL is the fleet's NATS URL, through the client proxies.
func (f *fleet) clientURL() string {
	var urls []string
	for _, n := range f.nodes {
		urls = append(urls, "nats://"+n.client.addr())
	}
	return strings.Join(urls, ",")
}

// connect connects as a fleet process does, through the proxies only, and
// notices a silent node in seconds.
func (f *fleet) connect(t *testing.T, name string, first int) *nats.Conn {
	t.Helper()
	urls := strings.Split(f.clientURL(), ",")
	first %= len(urls)
	urls = append(urls[first:], urls[:first]...)
	nc, err := nats.Connect(strings.Join(urls, ","), nats.Name(name), nats.DontRandomize(), nats.IgnoreDiscoveredServers(),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.ReconnectJitter(50*time.Millisecond, 50*time.Millisecond),
		nats.PingInterval(time.Second), nats.MaxPingsOutstanding(3))
	if err != nil {
		t.Fatalf("connect %s: %v", name, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// addWorker starts a worker on the process runtime (real Python runners).
func (f *fleet) addWorker(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	f.serial++
	name := fmt.Sprint("w", f.serial)
	onPodman := f.opts.podman && !f.podmanStarted
	f.podmanStarted = f.podmanStarted || onPodman
	if onPodman {
		f.podmanWorker = name
	}
	f.mu.Unlock()
	nc := f.connect(t, name, f.serial%3)
	cfg := worker.DefaultConfig(name)
	cfg.Queue, cfg.Grace, cfg.FetchWait, cfg.RetryDelay = f.q, 200*time.Millisecond, 500*time.Millisecond, 100*time.Millisecond
	cfg.Logger = logger(t)
	var rt sandbox.Runtime
	if onPodman {
		rt = podmantest.New(t, podman.Config{Config: containerpool.Config{Pool: 2}})
	} else {
		rt = testutil.ProcessRuntime(t)
	}
	w := testutil.WorkerOn(t, nc, rt, cfg)
	f.mu.Lock()
	f.workers = append(f.workers, &member{name: name, nc: nc, stop: w.Stop})
	f.mu.Unlock()
}

// addFrontend starts a front-end serving the jobs API over HTTP.
func (f *fleet) addFrontend(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	f.serial++
	name := fmt.Sprint("fe", f.serial)
	f.mu.Unlock()
	nc := f.connect(t, name, f.serial%3)
	fe := testutil.FrontendOnWith(t, nc, frontend.Config{ID: name, Logger: logger(t)})
	api := jobsapi.New(jobsapi.Config{Backend: fe, Namespace: httpauth.Namespace})
	hs := httptest.NewServer(mcpserver.Handler(mcpserver.New(fe, mcpserver.Options{}),
		mcpserver.HTTPOptions{API: api, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{token: ns}})}))
	t.Cleanup(hs.Close)
	m := &member{name: name, nc: nc, url: hs.URL, stop: func() {
		hs.CloseClientConnections()
		hs.Close()
		fe.Stop()
	}}
	f.mu.Lock()
	f.fes = append(f.fes, m)
	f.urls = append(f.urls, hs.URL)
	f.mu.Unlock()
}

// killWorker kills the oldest worker: its connection drops without a word.
func (f *fleet) killWorker() string {
	f.mu.Lock()
	m := f.workers[0]
	f.workers = f.workers[1:]
	f.mu.Unlock()
	m.nc.Close()
	m.stop()
	return m.name
}

// killFrontend kills the oldest front-end: its HTTP clients see their
// connections drop.
func (f *fleet) killFrontend() string {
	f.mu.Lock()
	m := f.fes[0]
	f.fes = f.fes[1:]
	f.urls = slices.DeleteFunc(f.urls, func(u string) bool { return u == m.url })
	f.mu.Unlock()
	m.nc.Close()
	m.stop()
	return m.name
}

// apiURLs are the jobs API URLs of the running front-ends.
func (f *fleet) apiURLs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.urls)
}

// leader is the index of the node leading stream, or -1.
func (f *fleet) leader(stream string) int {
	for _, n := range f.nodes {
		b := n.broker()
		if b == nil {
			continue
		}
		nc, err := b.Connect("faults-admin")
		if err != nil {
			continue
		}
		name, err := streamLeader(nc, stream)
		nc.Close()
		if err != nil {
			continue
		}
		for _, m := range f.nodes {
			if m.cfg.ServerName == name {
				return m.i
			}
		}
	}
	return -1
}

func streamLeader(nc *nats.Conn, stream string) (string, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return testutil.StreamLeader(ctx, js, stream)
}

// down takes node i down as mode says. Its network is cut first, so the
// server, which stops in-process and not at once, answers nobody once its
// file system fails: a killed or powered-off process says nothing more.
func (f *fleet) down(i int, mode downMode) int {
	f.isolate(i, true)
	f.nodes[i].client.partition(func(string) bool { return true })
	return f.nodes[i].down(mode)
}

// up starts the given nodes again, and lets them talk.
func (f *fleet) up(t *testing.T, idx ...int) {
	t.Helper()
	f.isolate(0, false)
	for _, i := range idx {
		f.nodes[i].client.partition(nil)
	}
	f.startAll(t, idx...)
}

// isolate cuts node i's routes to and from the other nodes; !on heals
// every node's routes.
func (f *fleet) isolate(i int, on bool) {
	if !on {
		for _, n := range f.nodes {
			n.route.partition(nil)
		}
		return
	}
	var id string
	if b := f.nodes[i].broker(); b != nil {
		id = b.Server().ID()
	}
	f.nodes[i].route.partition(func(string) bool { return true })
	for _, n := range f.nodes {
		if n.i != i {
			n.route.partition(func(dialer string) bool { return dialer == id })
		}
	}
}

// pause holds all of node i's traffic, routes and clients, as a stopped
// process's would be (its timers run on: an in-process server cannot be
// stopped).
func (f *fleet) pause(i int, on bool) {
	n := f.nodes[i]
	n.route.hold(on)
	n.client.hold(on)
	if on {
		// The node's own outgoing routes go through the others' proxies.
		id := ""
		if b := n.broker(); b != nil {
			id = b.Server().ID()
		}
		for _, m := range f.nodes {
			if m.i != i {
				m.route.holdFrom(id, true)
			}
		}
		return
	}
	for _, m := range f.nodes {
		m.route.holdFrom("", false)
	}
}

// sameReplicas waits until every running node's state replica holds the
// same contents, byte for byte, and reports the difference if they do not.
func (f *fleet) sameReplicas(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		var first map[string][]byte
		var err error
		for _, n := range f.nodes {
			b := n.broker()
			if b == nil {
				continue
			}
			c, cerr := b.Store().Contents()
			if cerr != nil {
				err = cerr
				break
			}
			if first == nil {
				first = c
				continue
			}
			if !maps.EqualFunc(first, c, bytes.Equal) {
				diff := testutil.DiffKeys(c, first)
				err = fmt.Errorf("node %d's replica differs from node 0's on %d keys: %.10q", n.i, len(diff), diff)
				break
			}
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// diagnose logs what each running node's JetStream holds of the jobs
// stream and its consumers: where a lost job went.
func (f *fleet) diagnose(t *testing.T, lost []string) {
	t.Helper()
	for _, id := range lost {
		sid := jobs.ScopedID(ns, id)
		for _, n := range f.nodes {
			if b := n.broker(); b != nil {
				recs, err := b.Store().Jobs([]string{sid})
				for _, r := range recs {
					t.Logf("node %d's replica: job %s %s attempt %d worker %q", n.i, id, r.Status, r.Attempt, r.Worker)
				}
				if err != nil || len(recs) == 0 {
					t.Logf("node %d's replica: job %s: %d records, %v", n.i, id, len(recs), err)
				}
			}
		}
		if b := f.nodes[0].broker(); b != nil {
			nc, err := b.Connect("faults-diagnose")
			if err != nil {
				continue
			}
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c, err := js.OrderedConsumer(ctx, f.q.Subjects.EventsStream(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{f.q.Subjects.JobEvents(sid)}})
			if err == nil {
				for {
					m, err := c.Next(jetstream.FetchMaxWait(time.Second))
					if err != nil {
						break
					}
					md, _ := m.Metadata()
					t.Logf("event of %s: %s seq %d at %s: %.300s", id, m.Subject(), md.Sequence.Stream, md.Timestamp.Format(time.RFC3339Nano), m.Data())
				}
			}
			cancel()
			nc.Close()
		}
	}
	for _, n := range f.nodes {
		b := n.broker()
		if b == nil {
			continue
		}
		nc, err := b.Connect("faults-diagnose")
		if err != nil {
			continue
		}
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for _, name := range []string{f.q.Subjects.JobsStream(), f.q.Subjects.EventsStream()} {
			s, err := js.Stream(ctx, name)
			if err != nil {
				t.Logf("node %d: stream %s: %v", n.i, name, err)
				continue
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Logf("node %d: stream %s: %v", n.i, name, err)
				continue
			}
			t.Logf("node %d: stream %s: %+v cluster %+v", n.i, name, info.State, info.Cluster)
			for c := range s.ListConsumers(ctx).Info() {
				t.Logf("node %d:   consumer %s: delivered %+v ack floor %+v pending %d ack pending %d redelivered %d waiting %d cluster %+v",
					n.i, c.Name, c.Delivered, c.AckFloor, c.NumPending, c.NumAckPending, c.NumRedelivered, c.NumWaiting, c.Cluster)
			}
		}
		cancel()
		nc.Close()
		break
	}
}

// mostConsumers is the index of the node leading the most consumers (of
// every stream), or -1.
func (f *fleet) mostConsumers() int {
	for _, n := range f.nodes {
		if b := n.broker(); b != nil {
			if count, err := consumerLeaders(b); err == nil {
				best := 0
				for _, m := range f.nodes {
					if count[m.cfg.ServerName] > count[f.nodes[best].cfg.ServerName] {
						best = m.i
					}
				}
				return best
			}
		}
	}
	return -1
}

// consumerLeaders counts the consumers each server leads, asking b.
func consumerLeaders(b *broker.Broker) (map[string]int, error) {
	nc, err := b.Connect("faults-admin")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	count := map[string]int{}
	for name := range js.StreamNames(ctx).Name() {
		s, err := js.Stream(ctx, name)
		if err != nil {
			continue
		}
		for ci := range s.ListConsumers(ctx).Info() {
			if ci.Cluster != nil && ci.Cluster.Leader != "" {
				count[ci.Cluster.Leader]++
			}
		}
	}
	return count, nil
}
