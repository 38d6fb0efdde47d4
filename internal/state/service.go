package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/queue"
)

// Error codes answered on request/reply (Nats-Service-Error-Code).
const (
	CodeBadRequest = "400"
	CodeNotFound   = "404"
	CodeConflict   = "409"
	CodeInternal   = "500"
)

// Operations of the state service; the request subject of each is
// jobs.Subjects.State(op).
const (
	OpJobGet         = "job.get"
	OpJobGetMany     = "job.getmany"
	OpJobList        = "job.list"
	OpDeadLetterList = "deadletter.list"
	OpMemoryGet      = "memory.get"
	OpMemoryPut      = "memory.put"
	OpMemoryList     = "memory.list"
	OpMemoryDelete   = "memory.delete"
)

// DefaultRetention keeps finished jobs for 7 days, and at most a million.
var DefaultRetention = Retention{MaxAge: 7 * 24 * time.Hour, MaxCount: 1_000_000}

// Service applies the events stream to the Store and answers state requests.
type Service struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	store  *Store
	sub    jobs.Subjects
	logger *slog.Logger

	// Retention is applied every RetentionEvery (zero: hourly). Set both before
	// Start.
	Retention      Retention
	RetentionEvery time.Duration
	// Metrics, when set before Start, records each job that reaches its terminal
	// status: the count by status and its queued, running and total times.
	Metrics *metrics.Metrics

	key []byte // the fleet's proxy key, which proves workers' events; set by Start

	mu     sync.Mutex // guards cancel, svc, advSub
	cancel context.CancelFunc
	svc    micro.Service
	advSub *nats.Subscription
	wg     sync.WaitGroup // applyLoop, retention loop, advisory loop, write handlers
	writes chan struct{}  // bounds concurrent write handlers
}

// NewService returns a Service; Start begins its work.
func NewService(nc *nats.Conn, store *Store, sub jobs.Subjects, logger *slog.Logger) (*Service, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Service{nc: nc, js: js, store: store, sub: sub, logger: logger,
		Retention: DefaultRetention, writes: make(chan struct{}, 64)}, nil
}

// Start rebuilds the job index from the events stream when the state file is
// new, creates the service's durable consumer on the events stream, begins
// applying events, and registers the request handlers.
func (s *Service) Start(ctx context.Context) error {
	key, err := queue.ProxyKey(ctx, s.js, s.sub)
	if err != nil {
		return fmt.Errorf("state service: %w", err)
	}
	s.key = key
	if s.store.Fresh() {
		n, err := s.Rebuild(ctx, false)
		if err != nil {
			return err
		}
		if n > 0 {
			s.logger.Info("rebuilt job index from the events stream", "events", n)
		}
	}
	cons, err := s.js.CreateOrUpdateConsumer(ctx, s.sub.EventsStream(), jetstream.ConsumerConfig{
		Durable:       "state",
		Description:   "mcpexec state service",
		AckPolicy:     jetstream.AckAllPolicy, // one ack per applied batch
		AckWait:       30 * time.Second,
		MaxDeliver:    -1,
		MaxAckPending: 20_000,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return fmt.Errorf("create state consumer: %w", err)
	}
	svc, err := micro.AddService(s.nc, micro.Config{
		Name:        s.sub.StateService(),
		Version:     "0.2.0",
		Description: "mcpexec job records and memory",
	})
	if err != nil {
		return fmt.Errorf("add state service: %w", err)
	}
	endpoints := []struct {
		op string
		h  micro.HandlerFunc
	}{
		{OpJobGet, s.handleJobGet},
		{OpJobGetMany, s.handleJobGetMany},
		{OpJobList, s.handleJobList},
		{OpDeadLetterList, s.handleDeadLetterList},
		{OpMemoryGet, s.handleMemoryGet},
		{OpMemoryPut, s.concurrently(s.handleMemoryPut)},
		{OpMemoryList, s.handleMemoryList},
		{OpMemoryDelete, s.concurrently(s.handleMemoryDelete)},
	}
	for _, e := range endpoints {
		name := endpointName(e.op)
		if err := svc.AddEndpoint(name, e.h, micro.WithEndpointSubject(s.sub.State(e.op))); err != nil {
			_ = svc.Stop()
			return fmt.Errorf("add %s endpoint: %w", e.op, err)
		}
	}
	advisories := make(chan *nats.Msg, 1024)
	advSub, err := s.nc.ChanSubscribe(maxDeliveriesAdvisory(s.sub), advisories)
	if err != nil {
		_ = svc.Stop()
		return fmt.Errorf("subscribe to max-deliveries advisories: %w", err)
	}
	// The server has the endpoints' subscriptions once Start returns, so no
	// request gets "no responders".
	if err := s.nc.FlushTimeout(10 * time.Second); err != nil {
		_ = svc.Stop()
		_ = advSub.Unsubscribe()
		return fmt.Errorf("register state service: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.mu.Lock()
	s.cancel, s.svc, s.advSub = cancel, svc, advSub
	s.mu.Unlock()
	s.wg.Add(3)
	go func() {
		defer s.wg.Done()
		s.applyLoop(runCtx, cons)
	}()
	go func() {
		defer s.wg.Done()
		s.retentionLoop(runCtx)
	}()
	go func() {
		defer s.wg.Done()
		s.advisoryLoop(runCtx, advisories)
	}()
	return nil
}

func endpointName(op string) string {
	b := []byte(op)
	for i, c := range b {
		if c == '.' {
			b[i] = '_'
		}
	}
	return string(b)
}

// Stop ends the service and waits for its goroutines. It is idempotent.
func (s *Service) Stop() {
	s.mu.Lock()
	cancel, svc, advSub := s.cancel, s.svc, s.advSub
	s.cancel, s.svc, s.advSub = nil, nil, nil
	s.mu.Unlock()
	if svc != nil {
		_ = svc.Stop()
	}
	if advSub != nil {
		_ = advSub.Unsubscribe()
	}
	if cancel != nil {
		cancel()
	}
	s.wg.Wait()
}

// applyLoop fetches events in batches and applies each batch in one transaction,
// acknowledging the batch (AckAll on its last event) only after the commit. When
// nothing is pending it blocks on a fetch of one event, so an event is applied
// as soon as it arrives.
func (s *Service) applyLoop(ctx context.Context, cons jetstream.Consumer) {
	for ctx.Err() == nil {
		batch, err := cons.FetchNoWait(1024)
		if err != nil {
			s.sleep(ctx, time.Second)
			continue
		}
		last, evs := s.decode(batch)
		if last == nil {
			one, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				s.sleep(ctx, 100*time.Millisecond)
				continue
			}
			if last, evs = s.decode(one); last == nil {
				continue
			}
		}
		if len(evs) > 0 {
			changed, err := s.store.ApplyEvents(evs)
			if err != nil {
				// Not acknowledged: JetStream redelivers the batch after AckWait.
				s.logger.Error("apply events", "count", len(evs), "err", err)
				s.sleep(ctx, time.Second)
				continue
			}
			s.observe(changed)
		}
		_ = last.Ack()
	}
}

// decode reads a batch; it returns the last message (to acknowledge the batch)
// and the events that decode, skipping (and logging) those that do not.
func (s *Service) decode(batch jetstream.MessageBatch) (jetstream.Msg, []jobs.Event) {
	var last jetstream.Msg
	var evs []jobs.Event
	for m := range batch.Messages() {
		last = m
		var ev jobs.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil || !jobs.ValidID(ev.Job) {
			s.logger.Warn("skipping malformed event", "subject", m.Subject(), "err", err)
			continue
		}
		if !s.proven(ev) {
			s.logger.Warn("skipping an event without its job's proof (a worker speaking for a job it does not hold?)",
				"job", ev.Job, "kind", ev.Kind, "worker", ev.Worker)
			continue
		}
		evs = append(evs, ev)
	}
	return last, evs
}

// Rebuild replays the events stream from its start into the store, up to the
// last event stored when it begins, and returns how many events it applied.
// Applying an event is idempotent (jobs.Apply fences by attempt and keeps
// terminal records), so replaying over existing records only fills gaps. With
// fresh the job records are deleted first (memory is kept) and the index is the
// stream's view alone. The durable consumer goes on from where it stopped.
func (s *Service) Rebuild(ctx context.Context, fresh bool) (int, error) {
	stream, err := s.js.Stream(ctx, s.sub.EventsStream())
	if err != nil {
		return 0, fmt.Errorf("rebuild: look up stream %s: %w", s.sub.EventsStream(), err)
	}
	lastSeq := stream.CachedInfo().State.LastSeq
	if fresh {
		if err := s.store.ResetJobs(); err != nil {
			return 0, err
		}
	}
	if stream.CachedInfo().State.Msgs == 0 {
		return 0, nil
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return 0, fmt.Errorf("rebuild: replay %s: %w", s.sub.EventsStream(), err)
	}
	applied := 0
	for {
		batch, err := cons.Fetch(1024, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return applied, fmt.Errorf("rebuild: read events: %w", err)
		}
		var evs []jobs.Event
		var seq uint64
		for m := range batch.Messages() {
			if md, err := m.Metadata(); err == nil {
				seq = md.Sequence.Stream
			}
			var ev jobs.Event
			if json.Unmarshal(m.Data(), &ev) == nil && jobs.ValidID(ev.Job) && s.proven(ev) {
				evs = append(evs, ev)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return applied, fmt.Errorf("rebuild: read events: %w", err)
		}
		if _, err := s.store.ApplyEvents(evs); err != nil {
			return applied, fmt.Errorf("rebuild: %w", err)
		}
		applied += len(evs)
		if seq >= lastSeq || (len(evs) == 0 && seq == 0) {
			return applied, nil
		}
		if ctx.Err() != nil {
			return applied, ctx.Err()
		}
	}
}

func (s *Service) retentionLoop(ctx context.Context) {
	every := s.RetentionEvery
	if every <= 0 {
		every = time.Hour
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.Retention == (Retention{}) {
			continue
		}
		n, err := s.store.Prune(s.Retention, time.Now())
		if err != nil {
			s.logger.Error("apply retention", "err", err)
		} else if n > 0 {
			s.logger.Info("deleted finished job records past retention", "count", n)
		}
	}
}

// maxDeliveriesAdvisory is the subject JetStream announces a job message that
// exhausted MaxDeliver on.
func maxDeliveriesAdvisory(sub jobs.Subjects) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + sub.JobsStream() + ".*"
}

type maxDeliveries struct {
	Stream     string `json:"stream"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries int    `json:"deliveries"`
}

// advisoryLoop turns a job message that JetStream gave up on (its workers kept
// dying or failing to record it) into a recorded worker_lost dead letter, and
// deletes the message, which a work queue would otherwise keep for ever.
func (s *Service) advisoryLoop(ctx context.Context, advisories <-chan *nats.Msg) {
	for {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			return
		case m = <-advisories:
		}
		var a maxDeliveries
		if err := json.Unmarshal(m.Data, &a); err != nil || a.StreamSeq == 0 {
			continue
		}
		if err := s.giveUp(ctx, a); err != nil {
			s.logger.Error("record job that exhausted its deliveries", "seq", a.StreamSeq, "err", err)
		}
	}
}

func (s *Service) giveUp(ctx context.Context, a maxDeliveries) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := s.js.Stream(ctx, s.sub.JobsStream())
	if err != nil {
		return err
	}
	raw, err := stream.GetMsg(ctx, a.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // already handled
	}
	if err != nil {
		return err
	}
	var job jobs.Job
	if err := json.Unmarshal(raw.Data, &job); err == nil && jobs.ValidID(job.ID) {
		ev := jobs.Event{Job: job.ID, Kind: jobs.EventFinished, Attempt: a.Deliveries, At: time.Now().UTC(),
			Result: &jobs.Result{Status: jobs.StatusWorkerLost, Attempt: a.Deliveries,
				Error: fmt.Sprintf("the job message was delivered %d times without a recorded result; kept as a dead letter", a.Deliveries)}}
		ev.Proof = jobs.EventProof(jobs.Capability(s.key, job.ID), ev.Kind, ev.Attempt)
		data, _ := json.Marshal(ev)
		msgID := fmt.Sprintf("%s.%s.%d", ev.Job, ev.Kind, ev.Attempt)
		if _, err := s.js.Publish(ctx, s.sub.Event(job.ID, jobs.EventFinished), data, jetstream.WithMsgID(msgID)); err != nil {
			return fmt.Errorf("record worker_lost of %s: %w", job.ID, err)
		}
	}
	if err := stream.DeleteMsg(ctx, a.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("delete exhausted job message %d: %w", a.StreamSeq, err)
	}
	return nil
}

// proven reports whether ev may be applied: started and finished events need
// their job's capability.
func (s *Service) proven(ev jobs.Event) bool {
	return !jobs.NeedsProof(ev.Kind) || jobs.CheckEvent(s.key, ev)
}

func (s *Service) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// concurrently runs h in its own goroutine (at most cap(s.writes) at once), so
// concurrent writes share bbolt commits (Store uses bolt.Batch).
func (s *Service) concurrently(h micro.HandlerFunc) micro.HandlerFunc {
	return func(req micro.Request) {
		s.writes <- struct{}{}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.writes }()
			h(req)
		}()
	}
}

// observe records the jobs that a batch brought to their terminal status (a
// terminal record never changes again, so a changed terminal record just ended).
func (s *Service) observe(changed []*jobs.Record) {
	if s.Metrics == nil {
		return
	}
	for _, rec := range changed {
		if !rec.Status.Terminal() {
			continue
		}
		var started, finished time.Time
		if rec.StartedAt != nil {
			started = *rec.StartedAt
		}
		if rec.FinishedAt != nil {
			finished = *rec.FinishedAt
		}
		if finished.IsZero() {
			finished = time.Now()
		}
		s.Metrics.Finished(string(rec.Status), rec.Job.SubmittedAt, started, finished)
	}
}
