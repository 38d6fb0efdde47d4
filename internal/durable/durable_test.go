package durable_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/goleak"

	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/faults/lazyfs"
	"github.com/mcpexec/mcpexec/internal/testutil/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSyncerMakesWritesDurable writes files on a file system that drops
// unsynced writes when the power is cut (lazyfs) and syncs none of them
// itself: what was written before a Sync survives the cut, in files old and
// new, in new directories; what was written after it is gone.
func TestSyncerMakesWritesDurable(t *testing.T) {
	dir, backing, fsys := mountLazy(t)
	mounted := true
	defer func() {
		if mounted {
			_ = fsys.Unmount()
		}
	}()
	s := durable.NewSyncer(dir)
	old := filepath.Join(dir, "old.blk")
	appendTo(t, old, "a")
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A second round: the old file grows, a new file in a new directory.
	appendTo(t, old, "b")
	if err := os.MkdirAll(filepath.Join(dir, "streams", "EVENTS"), 0o700); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(dir, "streams", "EVENTS", "1.blk")
	appendTo(t, fresh, "c")
	if fsys.Unsynced() == 0 {
		t.Fatal("the harness holds no unsynced write: the test proves nothing")
	}
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := fsys.Unsynced(); n != 0 {
		t.Fatalf("%d writes unsynced after Sync: %v", n, fsys.UnsyncedFiles())
	}
	// A file replaced by a rename (as nats-server writes its index and
	// state files): same size, likely the same time stamp, a new inode.
	index := filepath.Join(dir, "index.db")
	appendTo(t, index, "1234")
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	appendTo(t, index+".tmp", "5678")
	if err := os.Rename(index+".tmp", index); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := fsys.Unsynced(); n != 0 {
		t.Fatalf("%d writes unsynced after a file was replaced and synced: %v", n, fsys.UnsyncedFiles())
	}
	appendTo(t, old, "d") // after the last Sync: lost in the cut
	if dropped := fsys.Cut(); dropped == 0 {
		t.Fatal("the cut dropped nothing")
	}
	if err := fsys.Unmount(); err != nil {
		t.Fatal(err)
	}
	mounted = false
	for path, want := range map[string]string{"old.blk": "ab", "streams/EVENTS/1.blk": "c", "index.db": "5678"} {
		got, err := os.ReadFile(filepath.Join(backing, path))
		if err != nil || string(got) != want {
			t.Errorf("%s after the cut: %q %v, want %q", path, got, err, want)
		}
	}
}

// TestFirstPassSyncsEverything: a Syncer's first pass syncs what it finds
// however old its time stamp (a store written before the broker started,
// or with its clock behind).
func TestFirstPassSyncsEverything(t *testing.T) {
	dir, _, fsys := mountLazy(t)
	defer func() { _ = fsys.Unmount() }()
	old := filepath.Join(dir, "streams", "EVENTS", "msgs", "1.blk")
	if err := os.MkdirAll(filepath.Dir(old), 0o700); err != nil {
		t.Fatal(err)
	}
	appendTo(t, old, "a")
	long := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, p := range []string{old, filepath.Dir(old)} {
		if err := os.Chtimes(p, long, long); err != nil {
			t.Fatal(err)
		}
	}
	if fsys.Unsynced() == 0 {
		t.Fatal("the harness holds no unsynced write: the test proves nothing")
	}
	if err := durable.NewSyncer(dir).Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := fsys.Unsynced(); n != 0 {
		t.Fatalf("%d writes unsynced after the first pass: %v", n, fsys.UnsyncedFiles())
	}
}

// mountLazy mounts a lazy file system (lazyfs) at a temporary directory
// over another, skipping the test where FUSE is not available; the caller
// unmounts it.
func mountLazy(t *testing.T) (dir, backing string, fsys *lazyfs.FS) {
	t.Helper()
	if err := lazyfs.Available(); err != nil {
		t.Skipf("no power-loss harness: %v", err)
	}
	dir, backing = t.TempDir(), t.TempDir()
	fsys, err := lazyfs.Mount(dir, backing)
	if err != nil {
		t.Fatal(err)
	}
	return dir, backing, fsys
}

func appendTo(t *testing.T, path, data string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentCallersShareAPass: 64 callers of a Syncer-like remote
// barrier share a few passes, and every caller returns only after a pass
// that began after its call.
func TestConcurrentCallersShareAPass(t *testing.T) {
	nc := natstest.Conn(t)
	var passes atomic.Int64
	var mu sync.Mutex
	var starts []time.Time
	b := barrierFunc(func(ctx context.Context) error {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		passes.Add(1)
		time.Sleep(5 * time.Millisecond)
		return nil
	})
	srv, err := durable.Serve(nc, "sync.test", b)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	c := durable.NewClient(nc, "sync.test")
	const callers = 64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			called := time.Now()
			if err := c.Sync(context.Background()); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, s := range starts {
				if s.After(called) {
					return
				}
			}
			t.Errorf("a caller at %s returned with no pass begun after it (passes began %v)", called.Format(time.StampMicro), starts)
		})
	}
	wg.Wait()
	if n := passes.Load(); n == 0 || n > callers/4 {
		t.Errorf("%d callers made %d passes: want them shared", callers, n)
	}
}

// TestBarrierErrors: a pass's error reaches the caller with its text, and a
// barrier nobody serves is an error that says so.
func TestBarrierErrors(t *testing.T) {
	nc := natstest.Conn(t)
	srv, err := durable.Serve(nc, "sync.test", barrierFunc(func(context.Context) error {
		return errors.New("fsync 1.blk: input/output error")
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	err = durable.NewClient(nc, "sync.test").Sync(context.Background())
	if err == nil || !strings.Contains(err.Error(), "fsync 1.blk: input/output error") {
		t.Errorf("a failed pass: %v", err)
	}
	err = durable.NewClient(nc, "sync.nobody").Sync(context.Background())
	if !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("nobody serving: %v", err)
	}
	// A caller whose context ends returns at once with its error.
	slow, err := durable.Serve(nc, "sync.slow", barrierFunc(func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := durable.NewClient(nc, "sync.slow").Sync(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a caller whose context ended: %v", err)
	}
}

type barrierFunc func(context.Context) error

func (f barrierFunc) Sync(ctx context.Context) error { return f(ctx) }

// TestFleetAsksWhereNeeded: a Fleet asks for a barrier only where the
// brokers' state service says they keep sync always with barriers, or says
// nothing; where it says nothing and nobody serves barriers (a bare
// nats-server), there is nothing to ask, and where it says barriers and
// nobody serves them, that is an error.
func TestFleetAsksWhereNeeded(t *testing.T) {
	nc := natstest.Conn(t)
	f := durable.NewFleet(nc, "test-state", "sync.test")
	f.Every = time.Nanosecond
	if err := f.Sync(context.Background()); err != nil {
		t.Fatalf("nothing said, nobody serving: %v", err)
	}
	var asked atomic.Int64
	srv, err := durable.Serve(nc, "sync.test", barrierFunc(func(context.Context) error { asked.Add(1); return nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop() // stopping twice is fine
	for _, c := range []struct {
		md   map[string]string
		mode durable.Mode
		asks bool
	}{
		{nil, durable.ModeUnknown, true},
		{map[string]string{durable.SyncMetadata: "interval:2m0s"}, durable.ModeInterval, false},
		{map[string]string{durable.SyncMetadata: "always"}, durable.ModeAlways, false},
		{map[string]string{durable.SyncMetadata: "always", durable.BarrierMetadata: "true"}, durable.ModeBarrier, true},
	} {
		var svc micro.Service
		if c.md != nil {
			if svc, err = micro.AddService(nc, micro.Config{Name: "test-state", Version: "1.0.0", Metadata: c.md}); err != nil {
				t.Fatal(err)
			}
		}
		before := asked.Load()
		if m := f.Mode(context.Background()); m != c.mode {
			t.Errorf("%v: mode %d, want %d", c.md, m, c.mode)
		}
		if err := f.Sync(context.Background()); err != nil {
			t.Errorf("%v: %v", c.md, err)
		}
		if got := asked.Load() > before; got != c.asks {
			t.Errorf("%v: asked %v, want %v", c.md, got, c.asks)
		}
		if c.mode == durable.ModeBarrier {
			srv.Stop()
			if err := f.Sync(context.Background()); !errors.Is(err, nats.ErrNoResponders) {
				t.Errorf("barriers said, nobody serving: %v", err)
			}
		}
		if svc != nil {
			if err := svc.Stop(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// streamRecorder is a StreamBarrier that records what it was asked for.
type streamRecorder struct {
	mu    sync.Mutex
	asked []string // the streams of SyncStream, "" for Sync
	err   error
}

func (r *streamRecorder) Sync(context.Context) error { return r.record("") }

func (r *streamRecorder) SyncStream(_ context.Context, stream string) error { return r.record(stream) }

func (r *streamRecorder) record(stream string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, stream)
	return r.err
}

// TestFleetUsesTheLocalBarrier: a fleet whose brokers are in its process
// (UseLocal) makes its barriers with the local Barrier, a stream's with a
// pass over that stream, and asks nothing over NATS; a local pass that
// fails fails the write (ErrNotDurable); and where the mode needs no
// barrier, none is made.
func TestFleetUsesTheLocalBarrier(t *testing.T) {
	nc := natstest.Conn(t)
	f := durable.NewFleet(nc, "test-state", "sync.test")
	f.Every = time.Nanosecond
	var remote atomic.Int64
	srv, err := durable.Serve(nc, "sync.test", barrierFunc(func(context.Context) error { remote.Add(1); return nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	svc, err := micro.AddService(nc, micro.Config{Name: "test-state", Version: "1.0.0",
		Metadata: map[string]string{durable.SyncMetadata: "always", durable.BarrierMetadata: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	local := &streamRecorder{}
	f.UseLocal(local)
	ctx := context.Background()
	if err := f.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.Stream("EVENTS").Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(local.asked); got != "[ EVENTS]" || remote.Load() != 0 {
		t.Fatalf("local barrier asked %q, remote %d: want a whole pass, then EVENTS's, and no request", got, remote.Load())
	}
	local.err = errors.New("fsync 1.blk: input/output error")
	if err := f.Stream("EVENTS").Sync(ctx); !errors.Is(err, durable.ErrNotDurable) {
		t.Fatalf("a failed local pass: %v, want ErrNotDurable", err)
	}
	if err := svc.Stop(); err != nil {
		t.Fatal(err)
	}
	if svc, err = micro.AddService(nc, micro.Config{Name: "test-state", Version: "1.0.0",
		Metadata: map[string]string{durable.SyncMetadata: "interval:2m0s"}}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }() // the test is over with it
	if err := f.Sync(ctx); err != nil || len(local.asked) != 3 {
		t.Fatalf("under an interval: %v, the local barrier asked %q", err, local.asked)
	}
}

// TestRequestAbandonedWhenTheBrokerGoes: a barrier request in flight when
// the connection to its broker drops ends at once with ErrNotDurable,
// rather than after its ten-second bound: the answer will never come, and
// every writer of the client waits on that request.
func TestRequestAbandonedWhenTheBrokerGoes(t *testing.T) {
	ns := natstest.Server(t, false)
	brokerConn := natstest.Connect(t, ns)
	nc := natstest.Connect(t, ns, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	asked := make(chan struct{}, 1)
	srv, err := durable.Serve(brokerConn, "sync.test", barrierFunc(func(ctx context.Context) error {
		asked <- struct{}{}
		<-ctx.Done() // a pass that never ends: the node is losing its power
		return ctx.Err()
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	if err := brokerConn.Flush(); err != nil { // the server has the subscription
		t.Fatal(err)
	}
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- durable.NewClient(nc, "sync.test").Sync(context.Background()) }()
	select {
	case <-asked:
	case err := <-done:
		t.Fatalf("the barrier ended before it was served: %v", err)
	}
	ns.Shutdown()
	select {
	case err := <-done:
		if !errors.Is(err, durable.ErrNotDurable) {
			t.Fatalf("Sync after the broker went: %v, want ErrNotDurable", err)
		}
		t.Logf("the request ended %s after it was sent", time.Since(start).Round(time.Millisecond))
	case <-time.After(8 * time.Second):
		t.Fatal("the request waited for an answer from a broker that is gone")
	}
}

// TestStreamPassSyncsItsStreamOnly: a pass scoped to one stream syncs that
// stream's message files (every account's), and leaves another stream's
// unsynced writes to their own barriers; a name that is no stream of the
// store, or no name at all, gets a pass over the whole store.
func TestStreamPassSyncsItsStreamOnly(t *testing.T) {
	dir, _, fsys := mountLazy(t)
	defer func() { _ = fsys.Unmount() }()
	blk := func(stream string) string {
		d := filepath.Join(dir, "$G", "streams", stream, "msgs")
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(d, "1.blk")
	}
	events, jobs := blk("EVENTS"), blk("JOBS")
	s := durable.NewSyncer(dir)
	appendTo(t, events, "e")
	appendTo(t, jobs, "j")
	if err := s.SyncStream(context.Background(), "EVENTS"); err != nil {
		t.Fatal(err)
	}
	left := fsys.UnsyncedFiles()
	if len(left) != 1 || left["$G/streams/JOBS/msgs/1.blk"] == 0 {
		t.Fatalf("after a pass over EVENTS, unsynced: %v; want JOBS's block only", left)
	}
	for _, name := range []string{"NOSUCH", "../JOBS", ""} {
		appendTo(t, jobs, "j")
		if err := s.SyncStream(context.Background(), name); err != nil {
			t.Fatal(err)
		}
		if n := fsys.Unsynced(); n != 0 {
			t.Fatalf("a pass for %q left %v unsynced: want the whole store synced", name, fsys.UnsyncedFiles())
		}
	}
}
