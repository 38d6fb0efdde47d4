package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

func TestDedupeWithinAndBeyondWindow(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	q.DedupeWindow = 500 * time.Millisecond
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	rt := &testutil.FakeRuntime{}
	testutil.Worker(t, b, rt, testutil.QuickWorker("w1", q))

	first := testutil.Submit(t, fe, &jobs.Job{ID: "dup-1", Code: "print(1)"})[0]
	if first.Err != nil || first.Existing {
		t.Fatalf("first submission: %+v", first)
	}
	// Within the window, and twice in one batch.
	for _, s := range testutil.Submit(t, fe, &jobs.Job{ID: "dup-1", Code: "print(1)"}, &jobs.Job{ID: "dup-1", Code: "print(1)"}) {
		if s.Err != nil || !s.Existing || s.Record.Job.ID != "dup-1" {
			t.Fatalf("resubmission within the window: %+v", s)
		}
	}
	testutil.WaitRecord(t, b, "dup-1", jobs.StatusSuccess)
	time.Sleep(q.DedupeWindow + 200*time.Millisecond) // the behaviour under test is the window's end
	// Beyond the window: the state service still refuses a second record.
	s := testutil.Submit(t, fe, &jobs.Job{ID: "dup-1", Code: "print(1)"})[0]
	if s.Err != nil || !s.Existing || s.Record.Status != jobs.StatusSuccess {
		t.Fatalf("resubmission beyond the window: %+v", s)
	}
	// A different job under the same id is a conflict.
	if s := testutil.Submit(t, fe, &jobs.Job{ID: "dup-1", Code: "print(2)"})[0]; !errors.Is(s.Err, frontend.ErrIDTaken) || s.Record == nil {
		t.Fatalf("conflicting resubmission: %+v", s)
	}
	// Even straight at the queue (no state check), the events stream refuses
	// a second claim on the id.
	c, err := queue.NewClient(testutil.Connect(t, b, "direct"), jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	j := &jobs.Job{ID: "dup-1", Code: "print(1)"}
	_ = j.Normalize(jobs.DefaultLimits(), time.Now())
	j.ID = jobs.ScopedID("", j.ID)
	if err := c.Submit(context.Background(), j); !errors.Is(err, queue.ErrDuplicate) {
		t.Fatalf("direct resubmission: %v, want ErrDuplicate", err)
	}
	time.Sleep(300 * time.Millisecond) // a negative check: no second run within the time one would take
	if n := rt.Runs(); n != 1 {
		t.Fatalf("the job ran %d times, want 1", n)
	}
}

func TestCancelQueuedJobNeverRuns(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "cq-1", Code: "print(1)"})
	testutil.WaitRecord(t, b, "cq-1", jobs.StatusQueued)
	if err := fe.Cancel(context.Background(), "", "cq-1", "not needed"); err != nil {
		t.Fatal(err)
	}
	rec := testutil.WaitRecord(t, b, "cq-1", jobs.StatusCancelled)
	if rec.Result == nil || rec.Result.Error != "cancelled: not needed" {
		t.Fatalf("record %+v", rec.Result)
	}
	rt := &testutil.FakeRuntime{}
	testutil.Worker(t, b, rt, testutil.QuickWorker("w1", q))
	// A later job runs, so the worker has seen the cancelled one first.
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "cq-2", Code: "print(2)"})
	testutil.WaitRecord(t, b, "cq-2", jobs.StatusSuccess)
	if n := rt.Runs(); n != 1 {
		t.Fatalf("runtime ran %d jobs, want 1 (the cancelled one must not run)", n)
	}
	if rec, _ := b.Store().Job(jobs.ScopedID("", "cq-1")); rec.Status != jobs.StatusCancelled || rec.StartedAt != nil {
		t.Fatalf("cancelled job changed: %+v", rec)
	}
	waitQueueEmpty(t, b)
}

// TestFirstStartNeedsTheClaimLast attacks the first delivery's shortcut: a
// job message carries its claim's sequence, and its first delivery records
// the start without reading the history only while that claim is the job's
// last event. Here a start of attempt 1 (a lost worker's, on a copy of the
// message) is recorded before any worker takes the job: the shortcut is
// refused, nothing is stored, and the worker that then takes the job reads
// its history and, with max_attempts 1, records worker_lost without running it.
func TestFirstStartNeedsTheClaimLast(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := queue.DefaultConfig()
	b, c, m := queuedJob(t, q, &jobs.Job{ID: "fs-1", Code: "print(1)", MaxAttempts: 1})
	sub := jobs.Subjects{}
	events, err := c.JetStream().Stream(ctx, sub.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	claim, err := events.GetLastMsgForSubject(ctx, sub.Event(m.ID, jobs.EventSubmitted))
	if err != nil {
		t.Fatal(err)
	}
	if m.ClaimSeq == 0 || m.ClaimSeq != claim.Sequence {
		t.Fatalf("job message's claim_seq %d, want the submitted event's sequence %d", m.ClaimSeq, claim.Sequence)
	}
	start := func(worker string) jobs.Event { return startOf(m, 1, worker) }
	if err := c.PublishEvent(ctx, start("lost")); err != nil {
		t.Fatal(err)
	}
	if err := c.PublishStart(ctx, start("w1"), queue.StartAfter{ClaimSeq: m.ClaimSeq}, queue.NewDeliveryToken()); !errors.Is(err, queue.ErrHistoryMoved) {
		t.Fatalf("first start after another start: %v, want ErrHistoryMoved", err)
	}
	last, err := events.GetLastMsgForSubject(ctx, sub.JobEvents(m.ID))
	if err != nil {
		t.Fatal(err)
	}
	var ev jobs.Event
	if err := json.Unmarshal(last.Data, &ev); err != nil || ev.Worker != "lost" {
		t.Fatalf("the refused start was stored: last event %s (%v)", last.Data, err)
	}

	rt := &testutil.FakeRuntime{}
	testutil.Worker(t, b, rt, testutil.QuickWorker("w1", q))
	testutil.WaitRecord(t, b, "fs-1", jobs.StatusWorkerLost)
	if n := rt.Runs(); n != 0 {
		t.Fatalf("the job ran %d times, want 0 (its only attempt was spent)", n)
	}
	waitQueueEmpty(t, b)
}

// TestStartOnlyOnItsHistory: a power cut that loses a consumer's state makes
// JetStream deliver a message again, as a first delivery, to a worker while
// the one that had it still runs it. Each delivery records its start on the
// history it decided on, under its own token: the second one's start of the
// same attempt is refused (it was told it had started attempt 1, and the job
// ran twice as attempt 1), a retry tells its own landed start from another's
// by the job's history, and of two deliveries that read the same history
// only one starts the next attempt.
func TestStartOnlyOnItsHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, c, m := queuedJob(t, queue.DefaultConfig(), &jobs.Job{ID: "twice-1", Code: "print(1)", MaxAttempts: 3})
	nc := testutil.Connect(t, b, "state")
	start := func(attempt int) jobs.Event { return startOf(m, attempt, "w") }
	key, err := queue.ProxyKey(ctx, c.JetStream(), jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	history := func() queue.History {
		t.Helper()
		h, err := queue.LookupHistory(ctx, nc, jobs.Subjects{}, key, m.ID)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	first, second := queue.NewDeliveryToken(), queue.NewDeliveryToken()
	claim := queue.StartAfter{ClaimSeq: m.ClaimSeq}
	if err := c.PublishStart(ctx, start(1), claim, first); err != nil {
		t.Fatalf("first delivery's start: %v", err)
	}
	if err := c.PublishStart(ctx, start(1), claim, second); !errors.Is(err, queue.ErrHistoryMoved) {
		t.Fatalf("second first delivery's start of attempt 1: %v, want ErrHistoryMoved", err)
	}
	// The first delivery's retry (its answer lost) is refused as well; the
	// history says the start is its own, and not the other's.
	if err := c.PublishStart(ctx, start(1), claim, first); !errors.Is(err, queue.ErrHistoryMoved) {
		t.Fatalf("retry of a landed start: %v, want ErrHistoryMoved", err)
	}
	h := history()
	if h.LastAttempt != 1 || h.LastStartSeq == 0 || !h.StartedBy(start(1), first) || h.StartedBy(start(1), second) {
		t.Fatalf("history %+v: want the first delivery's start of attempt 1", h)
	}
	// Two later deliveries read that history: one starts attempt 2.
	after := queue.StartAfter{LastStartSeq: h.LastStartSeq}
	third, fourth := queue.NewDeliveryToken(), queue.NewDeliveryToken()
	if err := c.PublishStart(ctx, start(2), after, third); err != nil {
		t.Fatalf("a later delivery's start of attempt 2: %v", err)
	}
	if err := c.PublishStart(ctx, start(2), after, fourth); !errors.Is(err, queue.ErrHistoryMoved) {
		t.Fatalf("another delivery's start of attempt 2 on the same history: %v, want ErrHistoryMoved", err)
	}
	if h := history(); h.LastAttempt != 2 || !h.StartedBy(start(2), third) {
		t.Fatalf("history %+v: want the third delivery's start of attempt 2", h)
	}
	if err := c.PublishStart(ctx, start(3), after, "not a token!"); err == nil {
		t.Fatal("a start under a malformed delivery token was published")
	}
}

// TestBrokerRestart stops the broker with jobs queued and memory written, and
// starts a new one on the same directory: the jobs run, the records and the
// memory are all there.
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	q := queue.DefaultConfig()
	b1 := startBroker(t, dir, q)
	nc := testutil.ConnectInProcess(t, b1, "test")
	fe, err := frontend.New(nc, frontend.Config{ID: "fe", Limits: jobs.DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"br-1", "br-2", "br-3"}
	for _, id := range ids {
		testutil.MustSubmit(t, fe, &jobs.Job{ID: id, Code: "x"})
	}
	sc := state.NewClient(nc, jobs.Subjects{})
	if _, err := sc.MemoryPut(context.Background(), state.Memory{Namespace: "ns", Key: "k", Value: json.RawMessage(`"v"`)}, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		testutil.WaitRecord(t, b1, id, jobs.StatusQueued)
	}
	nc.Close()
	if err := b1.Close(); err != nil {
		t.Fatal(err)
	}

	b2 := testutil.Broker(t, dir, q)
	rt := &testutil.FakeRuntime{}
	testutil.Worker(t, b2, rt, testutil.QuickWorker("w", q))
	for _, id := range ids {
		testutil.WaitRecord(t, b2, id, jobs.StatusSuccess)
	}
	sc2 := state.NewClient(testutil.Connect(t, b2, "c"), jobs.Subjects{})
	if m, err := sc2.MemoryGet(context.Background(), "ns", "k"); err != nil || string(m.Value) != `"v"` {
		t.Fatalf("memory after restart: %+v %v", m, err)
	}
	if n := rt.Runs(); n != 3 {
		t.Fatalf("ran %d jobs after restart, want 3", n)
	}
}

func TestFullQueueRejects(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	q.MaxQueued = 2
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	res := testutil.Submit(t, fe, &jobs.Job{ID: "f-1", Code: "x"}, &jobs.Job{ID: "f-2", Code: "x"}, &jobs.Job{ID: "f-3", Code: "x"})
	if res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("first two: %v %v", res[0].Err, res[1].Err)
	}
	if !errors.Is(res[2].Err, queue.ErrQueueFull) || res[2].Record.Status != jobs.StatusRejected {
		t.Fatalf("third: %+v", res[2])
	}
	rec := testutil.WaitRecord(t, b, "f-3", jobs.StatusRejected)
	if !rec.DeadLetter() {
		t.Fatalf("rejected job is not a dead letter: %+v", rec)
	}
	// Resubmitting the rejected id returns the rejection; once the queue
	// drains, a new id is accepted.
	if s := testutil.Submit(t, fe, &jobs.Job{ID: "f-3", Code: "x"})[0]; !s.Existing || s.Record.Status != jobs.StatusRejected {
		t.Fatalf("resubmitted rejected: %+v", s)
	}
	testutil.Worker(t, b, &testutil.FakeRuntime{}, testutil.QuickWorker("w", q))
	testutil.WaitRecord(t, b, "f-2", jobs.StatusSuccess)
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "f-4", Code: "x"})
	testutil.WaitRecord(t, b, "f-4", jobs.StatusSuccess)
}

func startBroker(t *testing.T, dir string, q queue.Config) *broker.Broker {
	t.Helper()
	b, err := broker.Start(context.Background(), broker.Config{DataDir: dir, Listen: "127.0.0.1:-1", Queue: q, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// jobMessage reads and decodes the job message at seq of the jobs stream.
// queuedJob submits job through a front-end of a fresh broker of q, waits
// until it is queued, and returns the broker, a queue client of a
// connection of its own (as a worker's), and the job's message (the jobs
// stream's first).
func queuedJob(t *testing.T, q queue.Config, job *jobs.Job) (*broker.Broker, *queue.Client, *queue.Message) {
	t.Helper()
	b := testutil.Broker(t, "", q)
	testutil.MustSubmit(t, testutil.Frontend(t, b, "fe"), job)
	testutil.WaitRecord(t, b, job.ID, jobs.StatusQueued)
	c, err := queue.NewClient(testutil.Connect(t, b, "worker"), jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	return b, c, jobMessage(t, c, 1)
}

// startOf is worker's start of m's job's attempt, with its proof.
func startOf(m *queue.Message, attempt int, worker string) jobs.Event {
	return jobs.Event{Job: m.ID, Kind: jobs.EventStarted, Attempt: attempt, Worker: worker,
		Proof: jobs.EventProof(m.Capability, jobs.EventStarted, attempt)}
}

func jobMessage(t *testing.T, c *queue.Client, seq uint64) *queue.Message {
	t.Helper()
	s, err := c.JetStream().Stream(context.Background(), jobs.Subjects{}.JobsStream())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatal(err)
	}
	m, err := queue.DecodeMessage(raw.Data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func waitQueueEmpty(t *testing.T, b *broker.Broker) {
	t.Helper()
	js := testutil.Connect(t, b, "check")
	c, err := queue.NewClient(js, jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, err := c.JetStream().Stream(context.Background(), jobs.Subjects{}.JobsStream())
		if err != nil {
			t.Fatal(err)
		}
		if s.CachedInfo().State.Msgs == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d job messages left in the queue", s.CachedInfo().State.Msgs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStartStoredAsksNoBarrier: StartStored returns once the start is
// stored, before any barrier is asked (a run that calls nothing needs none
// of its own: its outcome's covers the start); its sync asks one. A sync
// after the connection was made again cannot vouch for the start, which a
// restarted broker may have lost: it says so (ErrStartUnconfirmed).
func TestStartStoredAsksNoBarrier(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	job := &jobs.Job{ID: "stored-1", Code: "print(1)", MaxAttempts: 3}
	testutil.MustSubmit(t, testutil.Frontend(t, b, "fe"), job)
	testutil.WaitRecord(t, b, job.ID, jobs.StatusQueued)
	nc := testutil.Connect(t, b, "worker")
	c, err := queue.NewClient(nc, jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	m := jobMessage(t, c, 1)

	// The barriers this client asks: requests answered to its inboxes.
	inbox := nc.NewRespInbox()
	inbox = inbox[:strings.LastIndexByte(inbox, '.')+1]
	var barriers atomic.Int32
	spy := testutil.Connect(t, b, "spy")
	if _, err := spy.Subscribe(jobs.Subjects{}.SyncBarrier(), func(m *nats.Msg) {
		if strings.HasPrefix(m.Reply, inbox) {
			barriers.Add(1)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}

	sync, err := c.StartStored(ctx, startOf(m, 1, "w"), queue.StartAfter{ClaimSeq: m.ClaimSeq}, queue.NewDeliveryToken())
	if err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := barriers.Load(); n != 0 {
		t.Fatalf("%d barriers asked before the start's sync", n)
	}
	if err := sync(ctx); err != nil {
		t.Fatalf("sync of a stored start: %v", err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return barriers.Load() > 0 }, "the start's sync asked no barrier")

	// The next attempt's start, then the connection made again before its
	// sync.
	sync, err = c.StartStored(ctx, startOf(m, 2, "w"), queue.StartAfter{LastStartSeq: c.EventsSeq()}, queue.NewDeliveryToken())
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.Reconnect(nc, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := sync(ctx); !errors.Is(err, queue.ErrStartUnconfirmed) {
		t.Fatalf("sync after a reconnect: %v, want ErrStartUnconfirmed", err)
	}
}
