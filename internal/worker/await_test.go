package worker_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/state/boltstore"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// jetStreamServer starts a plain nats-server with JetStream and none of
// mcpexec's streams: what a worker finds while the broker is still creating
// them. opts, when set, adds to its options.
func jetStreamServer(t *testing.T, opts func(*server.Options)) *server.Server {
	t.Helper()
	o := &server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true, JetStream: true, StoreDir: t.TempDir()}
	if opts != nil {
		opts(o)
	}
	ns, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	return ns
}

func connectTo(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestWorkerWaitsForTheBroker starts a worker against a NATS server whose
// JetStream has none of mcpexec's streams and buckets yet: Start does not
// fail but waits, saying what it waits for; once they are created (as the
// broker does at start) the worker comes up and runs a job.
func TestWorkerWaitsForTheBroker(t *testing.T) {
	t.Parallel()
	ns := jetStreamServer(t, nil)
	q := queue.DefaultConfig()
	var logs testenv.Buffer
	cfg := testutil.QuickWorker("early", q)
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	w, err := worker.New(connectTo(t, ns.ClientURL(), nats.Name("early worker")), testutil.NewFakeRuntime(4), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	started := make(chan error, 1)
	go func() { started <- w.Start(ctx) }()
	// It says, more than once, that it waits and for what.
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(logs.String(), "waiting for the broker") < 2 {
		select {
		case err := <-started:
			t.Fatalf("Start returned before the streams existed: %v\n%s", err, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker did not say it waits within 10 s:\n%s", logs.String())
		}
	}
	if !strings.Contains(logs.String(), "the jobs stream "+q.Subjects.JobsStream()+" is not there yet") || strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Fatalf("the waits do not name the jobs stream, or are logged as errors:\n%s", logs.String())
	}
	t.Logf("while the streams are missing:\n%s", logs.String())
	// The broker creates the streams and buckets.
	admin := connectTo(t, ns.ClientURL(), nats.Name("broker setup"))
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := queue.Setup(ctx, js, q); err != nil {
		t.Fatal(err)
	}
	// ...and starts its state service, which a worker asks about each job.
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() }) // after the service stops
	svc, err := state.NewService(admin, store, q.Subjects, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("Start once the streams exist: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker did not start within 30 s of the streams' creation:\n%s", logs.String())
	}
	t.Cleanup(w.Stop)
	if !strings.Contains(logs.String(), "the broker is ready") || !strings.Contains(logs.String(), "worker started") {
		t.Fatalf("the start after the wait is not logged:\n%s", logs.String())
	}
	// It runs a job.
	client, err := queue.NewClient(admin, q.Subjects)
	if err != nil {
		t.Fatal(err)
	}
	job := &jobs.Job{ID: "after-the-wait", Code: "ran"}
	if err := job.Normalize(jobs.DefaultLimits(), time.Now()); err != nil {
		t.Fatal(err)
	}
	events, stop, err := client.WatchEvents(job.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for _, err := range client.SubmitMany(ctx, []*jobs.Job{job}) {
		if err != nil {
			t.Fatalf("submit: %v", err)
		}
	}
	for {
		select {
		case ev := <-events:
			if ev.Kind != jobs.EventFinished {
				continue
			}
			if ev.Worker != "early" || ev.Result == nil || ev.Result.Status != jobs.StatusSuccess || ev.Result.Stdout != "ran" {
				t.Fatalf("finished event %+v result %+v", ev, ev.Result)
			}
			return
		case <-time.After(30 * time.Second):
			t.Fatalf("the job did not finish within 30 s:\n%s", logs.String())
		}
	}
}

// TestWorkerStartRefusedFailsAtOnce: a worker whose NATS user may not create
// its consumers does not wait for a broker that will never let it: Start
// fails after one attempt, naming the permissions violation.
func TestWorkerStartRefusedFailsAtOnce(t *testing.T) {
	t.Parallel()
	ns := jetStreamServer(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "admin", Password: "a"},
			{Username: "worker", Password: "w", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.CONSUMER.>"}},
			}},
		}
	})
	q := queue.DefaultConfig()
	js, err := jetstream.New(connectTo(t, ns.ClientURL(), nats.UserInfo("admin", "a")))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := queue.Setup(ctx, js, q); err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	cfg := testutil.QuickWorker("refused", q)
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	nc := connectTo(t, ns.ClientURL(), nats.UserInfo("worker", "w"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	w, err := worker.New(nc, testutil.NewFakeRuntime(1), cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = w.Start(ctx)
	if err == nil {
		w.Stop()
		t.Fatal("a worker that may not create its consumers started")
	}
	if !strings.Contains(err.Error(), "ermissions violation") || !strings.Contains(err.Error(), "credentials") {
		t.Fatalf("the error does not say the broker refused: %v", err)
	}
	if n := strings.Count(logs.String(), "waiting for the broker"); n > 0 || time.Since(start) > 20*time.Second {
		t.Fatalf("a refusal was waited for (%d waits, %s):\n%s", n, time.Since(start), logs.String())
	}
	t.Logf("refused after %s: %v", time.Since(start).Round(time.Millisecond), err)
}
