package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/mcpexec/mcpexec/internal/durable"
)

// jetStreamServer starts an in-process nats-server with JetStream under
// sync always, and returns a connection to it.
func jetStreamServer(t testing.TB) *nats.Conn {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		SyncAlways: true, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func groupCommitOn(t testing.TB, atomic bool) (*groupCommit, jetstream.Stream) {
	t.Helper()
	nc := jetStreamServer(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.>"},
		Storage: jetstream.FileStorage, Duplicates: time.Minute, AllowAtomicPublish: atomic, AllowDirect: true})
	if err != nil {
		t.Fatal(err)
	}
	return &groupCommit{nc: nc, js: js}, s
}

func pending(ids ...string) []*pendingPub {
	var b []*pendingPub
	for _, id := range ids {
		m := nats.NewMsg("ev." + id)
		m.Data = []byte(id)
		m.Header.Set(jetstream.MsgIDHeader, id)
		b = append(b, &pendingPub{msg: m, done: make(chan pubResult, 1)})
	}
	return b
}

// stored returns the stream's messages by sequence: data, and whether each
// came in an atomic batch.
func stored(t *testing.T, s jetstream.Stream) map[uint64]string {
	t.Helper()
	ctx := context.Background()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]string{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		batched := ""
		if m.Header.Get(batchIDHeader) != "" {
			batched = "+batch"
		}
		out[seq] = string(m.Data) + batched
	}
	return out
}

func TestGroupCommitStoresABatchAtomically(t *testing.T) {
	t.Parallel()
	g, s := groupCommitOn(t, true)
	res := g.publishBatch(context.Background(), pending("a", "b", "c"), false)
	for i, r := range res {
		if r.err != nil || r.seq != uint64(i+1) {
			t.Fatalf("event %d: %+v, want sequence %d", i, r, i+1)
		}
	}
	want := map[uint64]string{1: "a+batch", 2: "b+batch", 3: "c+batch"}
	if got := stored(t, s); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
}

// publishDuplicate publishes a alone, then b, a and c as one batch, and
// checks that each is answered without error with its own sequence: 2, then
// 1 (the first a's), then 3.
func publishDuplicate(t *testing.T, g *groupCommit) []pubResult {
	t.Helper()
	if r := g.publishBatch(context.Background(), pending("a"), false); r[0].err != nil {
		t.Fatal(r[0].err)
	}
	res := g.publishBatch(context.Background(), pending("b", "a", "c"), false)
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("event %d: %v", i, r.err)
		}
	}
	if res[0].seq != 2 || res[1].seq != 1 || res[2].seq != 3 {
		t.Fatalf("sequences %+v, want 2, 1 (the first a), 3", res)
	}
	return res
}

// A batch smaller than minAtomic goes all at once, each event on its own:
// each is answered with its own sequence, and a duplicate is a duplicate.
func TestGroupCommitSmallBatchGoesAtOnce(t *testing.T) {
	t.Parallel()
	g, s := groupCommitOn(t, true)
	g.minAtomic = 4
	if res := publishDuplicate(t, g); !res[1].dup {
		t.Fatalf("a published again: %+v, want a duplicate", res[1])
	}
	if r := g.publishBatch(context.Background(), pending("d", "e", "f", "g"), false); r[3].err != nil || r[3].seq != 7 {
		t.Fatalf("a batch of minAtomic: %+v", r)
	}
	want := map[uint64]string{1: "a", 2: "b", 3: "c", 4: "d+batch", 5: "e+batch", 6: "f+batch", 7: "g+batch"}
	if got := stored(t, s); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
}

// BenchmarkGroupCommit: callers publishing events back to back through one
// group commit on one broker under sync always, their batches atomic from
// 2 messages (every batch) or from groupMinAtomic. Few callers make small
// batches, which an atomic batch makes slower on one broker.
func BenchmarkGroupCommit(b *testing.B) {
	for _, callers := range []int{2, 4, 8, 64} {
		for _, minAtomic := range []int{2, groupMinAtomic} {
			b.Run(fmt.Sprintf("callers=%d/min_atomic=%d", callers, minAtomic), func(b *testing.B) {
				g, _ := groupCommitOn(b, true)
				g.minAtomic = minAtomic
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				for range callers {
					wg.Go(func() {
						for {
							i := next.Add(1)
							if i > int64(b.N) {
								return
							}
							m := nats.NewMsg(fmt.Sprintf("ev.%d", i))
							m.Data = []byte(`{"kind":"started"}`)
							if _, err := g.publish(context.Background(), m); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
			})
		}
	}
}

// A duplicate refuses a whole atomic batch: each event is then published
// alone, and the duplicate is a duplicate only.
func TestGroupCommitDuplicateFallsBack(t *testing.T) {
	t.Parallel()
	g, s := groupCommitOn(t, true)
	publishDuplicate(t, g)
	want := map[uint64]string{1: "a", 2: "b", 3: "c"}
	if got := stored(t, s); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
}

// A stream that refuses atomic batches gets the events one by one, and the
// group commit stops trying.
func TestGroupCommitWithoutAtomicPublish(t *testing.T) {
	t.Parallel()
	g, s := groupCommitOn(t, false)
	for i, r := range g.publishBatch(context.Background(), pending("a", "b"), false) {
		if r.err != nil || r.seq != uint64(i+1) {
			t.Fatalf("event %d: %+v", i, r)
		}
	}
	if !g.disabled {
		t.Fatal("the group commit did not notice that the stream refuses atomic batches")
	}
	want := map[uint64]string{1: "a", 2: "b"}
	if got := stored(t, s); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
}

// Many callers at once: each is answered with its own event's sequence,
// every event is stored once, and the lead passes on (no caller is left
// waiting).
func TestGroupCommitConcurrentCallers(t *testing.T) {
	t.Parallel()
	g, s := groupCommitOn(t, true)
	const n = 300
	seqs := make([]uint64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			m := pending(fmt.Sprintf("e%03d", i))[0].msg
			seq, err := g.publish(context.Background(), m)
			if err != nil {
				t.Errorf("event %d: %v", i, err)
			}
			seqs[i] = seq
		})
	}
	wg.Wait()
	got := stored(t, s)
	if len(got) != n {
		t.Fatalf("%d events stored, want %d", len(got), n)
	}
	at := map[string]uint64{}
	for seq, d := range got {
		at[d[:4]] = seq
	}
	for i, seq := range seqs {
		own := at[fmt.Sprintf("e%03d", i)]
		if own == 0 || seq != own {
			t.Fatalf("event %d answered with sequence %d, stored at %d", i, seq, own)
		}
	}
	if g.leading || len(g.pending) > 0 {
		t.Fatalf("after the last caller: leading %v, %d pending", g.leading, len(g.pending))
	}
}

func TestBatchLen(t *testing.T) {
	t.Parallel()
	msgs := func(sizes ...int) []*nats.Msg {
		var ms []*nats.Msg
		for _, n := range sizes {
			ms = append(ms, &nats.Msg{Data: make([]byte, n)})
		}
		return ms
	}
	many := make([]int, groupMaxMsgs+5)
	for _, tc := range []struct {
		name  string
		sizes []int
		want  int
	}{
		{"one", []int{10}, 1},
		{"all small ones", []int{10, 20, 30}, 3},
		{"at most groupMaxMsgs", many, groupMaxMsgs},
		{"a large one first goes alone", []int{groupMaxMsgBytes + 1, 10}, 1},
		{"a large one later ends the batch", []int{10, 10, groupMaxMsgBytes + 1}, 2},
		{"at most groupMaxBytes", []int{groupMaxMsgBytes, groupMaxMsgBytes, groupMaxBytes - 2*groupMaxMsgBytes + 1}, 2},
	} {
		if got := batchLen(msgs(tc.sizes...), func(m *nats.Msg) *nats.Msg { return m }); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestGroupCommitFollowsTheSyncPolicy: while the brokers' state service
// says they sync on an interval, each write goes at once (no atomic batch)
// and no barrier is asked for; while it says they sync always, writes go in
// batches, no barrier; while it says they keep sync always with barriers,
// each write goes at once and the writers wait for a barrier; while nothing
// answers, writes go in batches and ask for a barrier. The mode is read
// again at each use here (Every).
func TestGroupCommitFollowsTheSyncPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, s := groupCommitOn(t, true)
	g.fleet = durable.NewFleet(g.nc, "test-state", "test.sync")
	g.fleet.Every = time.Nanosecond
	var barriers atomic.Int64
	srv, err := durable.Serve(g.nc, "test.sync", barrierFunc(func(context.Context) error { barriers.Add(1); return nil }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	var svc micro.Service
	setPolicy := func(md map[string]string) {
		t.Helper()
		if svc != nil {
			if err := svc.Stop(); err != nil {
				t.Fatal(err)
			}
		}
		var err error
		svc, err = micro.AddService(g.nc, micro.Config{Name: "test-state", Version: "1.0.0", Metadata: md})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if svc != nil {
			_ = svc.Stop() // the test is over with it
		}
	})
	publish := func(wantBarriers int64, ids ...string) {
		t.Helper()
		before := barriers.Load()
		var msgs []*nats.Msg
		for _, p := range pending(ids...) {
			msgs = append(msgs, p.msg)
		}
		for i, r := range g.publishAll(ctx, msgs) {
			if r.err != nil {
				t.Fatalf("%s: %v", ids[i], r.err)
			}
		}
		if got := barriers.Load() - before; got != wantBarriers {
			t.Fatalf("%v: %d barriers, want %d", ids, got, wantBarriers)
		}
	}
	publish(1, "a", "b") // no state service answers
	setPolicy(map[string]string{SyncMetadata: "interval:2m0s"})
	publish(0, "c", "d")
	if seq, err := g.publish(ctx, pending("e")[0].msg); err != nil || seq != 5 {
		t.Fatalf("e: %d %v", seq, err)
	}
	setPolicy(map[string]string{SyncMetadata: "always"})
	publish(0, "f", "g")
	setPolicy(map[string]string{SyncMetadata: "always", durable.BarrierMetadata: "true"})
	publish(1, "h", "i")
	before := barriers.Load()
	if seq, err := g.publish(ctx, pending("j")[0].msg); err != nil || seq != 10 || barriers.Load() != before+1 {
		t.Fatalf("j: %d %v after %d barriers", seq, err, barriers.Load()-before)
	}
	want := map[uint64]string{1: "a+batch", 2: "b+batch", 3: "c", 4: "d", 5: "e", 6: "f+batch", 7: "g+batch", 8: "h", 9: "i", 10: "j"}
	if got := stored(t, s); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stored %v, want %v", got, want)
	}

	// A barrier that fails fails each write it was to make durable.
	srv.Stop()
	res := g.publishAll(ctx, []*nats.Msg{pending("k")[0].msg})
	if len(res) != 1 || res[0].err == nil || !errors.Is(res[0].err, nats.ErrNoResponders) {
		t.Fatalf("k without a barrier: %+v, want the barrier's error", res)
	}
	// So does a lone write's, the path every write of one broker with
	// barriers takes: its failure was lost there, and a worker told its
	// job's outcome was durable acknowledged the job, when a power cut
	// then lost the outcome.
	if seq, err := g.publish(ctx, pending("l")[0].msg); err == nil || !errors.Is(err, nats.ErrNoResponders) || !Transient(err) {
		t.Fatalf("l without a barrier: %d %v, want the barrier's error", seq, err)
	}
}

type barrierFunc func(context.Context) error

func (f barrierFunc) Sync(ctx context.Context) error { return f(ctx) }

// TestNotDurableIsTransient: a write JetStream stored but no barrier has
// synced yet is retried (under its id, so stored once), whatever the
// barrier's failure said: a pass cut short, a broker gone, its text.
func TestNotDurableIsTransient(t *testing.T) {
	t.Parallel()
	nc := jetStreamServer(t)
	srv, err := durable.Serve(nc, "test.sync", barrierFunc(func(context.Context) error {
		return errors.New("fsync 1.blk: input/output error")
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	err = durable.NewClient(nc, "test.sync").Sync(context.Background())
	if err == nil || !Transient(err) || !Transient(fmt.Errorf("stored, but not yet synced: %w", err)) {
		t.Fatalf("a failed barrier: %v, transient %v", err, Transient(err))
	}
}
