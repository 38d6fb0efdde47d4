package state

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/periodic"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// Error codes answered on request/reply (Nats-Service-Error-Code).
const (
	CodeBadRequest = "400"
	CodeNotFound   = "404"
	CodeConflict   = "409"
	CodeInternal   = "500"
	// CodeUnavailable: this replica is behind what the asker has seen.
	CodeUnavailable = "503"
)

// AnyNode in place of a node's name asks any one replica (of a backup).
const AnyNode = "any"

// Operations of the state service; the request subject of each is
// jobs.Subjects.State(op).
const (
	OpJobGet         = "job.get"
	OpJobGetMany     = "job.getmany"
	OpJobStatuses    = "job.statuses"
	OpJobList        = "job.list"
	OpDeadLetterList = "deadletter.list"
	OpMemoryGet      = "memory.get"
	OpMemoryPut      = "memory.put"
	OpMemoryList     = "memory.list"
	OpMemoryDelete   = "memory.delete"
	// OpJobHistory answers a worker, for a job whose capability it holds,
	// what it must know before running the job (queue.History): workers may
	// not read the events stream themselves.
	OpJobHistory = "job.history"
)

// DefaultRetention keeps finished jobs for 7 days, and at most a million.
var DefaultRetention = Retention{MaxAge: 7 * 24 * time.Hour, MaxCount: 1_000_000}

// Service is one state replica: it folds the events and memory streams into
// its Store and answers state requests (any replica answers any request; the
// NATS micro service spreads them).
type Service struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	store  Store
	sub    jobs.Subjects
	logger *slog.Logger

	// Retention is applied every RetentionEvery (zero: hourly). Set both before
	// Start.
	Retention      Retention
	RetentionEvery time.Duration
	// AuditRetention, when set before Start, deletes audit entries older
	// than it (with the job records' retention pass).
	AuditRetention time.Duration
	// QueuedMaxAge, when set before Start, ends as rejected the record of a
	// job still queued this long after it was enqueued (the jobs stream's
	// MaxAge, queue.Config.QueuedMaxAge, deletes its message).
	QueuedMaxAge time.Duration
	// Metrics, when set before Start, records each job that reaches its terminal
	// status: the count by status and its queued, running and total times.
	Metrics *metrics.Metrics
	// Node names this replica for admin requests (the broker's server name).
	Node string
	// Barrier, when set before Start, makes what JetStream acknowledged
	// to the service durable before the service answers that a write
	// succeeded (a broker with group sync barriers); nil: JetStream's
	// acknowledgement is enough.
	Barrier durable.Barrier
	// Metadata, set before Start, is added to the micro service's metadata
	// ($SRV.INFO), e.g. the broker's sync policy that doctor reports.
	Metadata map[string]string
	// FilesBucket, when set before Start, is the file store's configuration
	// (queue.FilesBucketConfig), made when a job first has files; zero: the
	// store must exist already.
	FilesBucket jetstream.ObjectStoreConfig
	// Tracing, when set before Start, receives a span per job event applied
	// and per memory write.
	Tracing trace.TracerProvider
	tracer  trace.Tracer // from Tracing, by Start; nil: no spans

	key      []byte   // the fleet's proxy key, which proves workers' events; set by Start
	auditKey []byte   // audit.Key(key): proves front-ends' audit entries
	applied  *applied // set by Start
	quota    *reservations
	sched    *scheduler // releases waiting jobs; set by Start

	mu      sync.Mutex // guards cancel, svc, advSub, admSubs, stopped, and wg.Add of write handlers
	stopped bool
	cancel  context.CancelFunc
	svc     micro.Service
	advSub  *nats.Subscription
	admSubs []*nats.Subscription
	wg      sync.WaitGroup // followers, retention, expiry and advisory loops, write handlers
	writes  chan struct{}  // bounds concurrent write handlers
	reads   chan struct{}  // bounds concurrent read handlers
	lookups chan struct{}  // bounds concurrent job.history handlers
	fileOps chan struct{}  // bounds concurrent file handlers (each holds a file)

	filesMu sync.Mutex // guards obs
	obs     jetstream.ObjectStore
	tally   fileTally
}

// NewService returns a Service; Start begins its work.
func NewService(nc *nats.Conn, store Store, sub jobs.Subjects, logger *slog.Logger) (*Service, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Service{nc: nc, js: js, store: store, sub: sub, logger: logger,
		Retention: DefaultRetention, writes: make(chan struct{}, 64), reads: make(chan struct{}, MaxReads), lookups: make(chan struct{}, 64), fileOps: make(chan struct{}, 16), quota: newReservations()}, nil
}

// Start follows the streams from where the store left off, waits until it has
// caught up with them, then registers the request handlers.
func (s *Service) Start(ctx context.Context) error {
	if s.Tracing != nil {
		s.tracer = tracing.Tracer(s.Tracing)
	}
	key, err := queue.ProxyKey(ctx, s.js, s.sub)
	if err == nil {
		err = s.sync(ctx)
	}
	if err != nil {
		return fmt.Errorf("state service: %w", err)
	}
	s.key, s.auditKey = key, audit.Key(key)
	ev, mem, err := s.store.Applied()
	if err != nil {
		return err
	}
	s.applied = newApplied(ev, mem)
	if mem == 0 {
		if err := s.migrateMemory(ctx); err != nil {
			return fmt.Errorf("state service: %w", err)
		}
	}
	// A stream that lost its last writes (which this replica applied) is
	// resynchronised with before it is followed.
	rebuild, err := s.checkStreams(ctx)
	if err != nil {
		return fmt.Errorf("state service: %w", err)
	}
	ev, mem = s.applied.get()
	q, err := queue.NewClient(s.nc, s.sub)
	if err != nil {
		return fmt.Errorf("state service: %w", err)
	}
	q.UseKey(key) // its skips carry their proof
	s.sched = newScheduler(s, q)
	runCtx, cancel := context.WithCancel(context.Background())
	s.mu.Lock()
	s.cancel = cancel
	s.mu.Unlock()
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.follow(runCtx, s.sub.EventsStream(), ev, s.applyEvents)
	}()
	go func() {
		defer s.wg.Done()
		s.follow(runCtx, s.sub.MemoryStream(), mem, s.applyMemory)
	}()
	if as, ok := s.store.(AuditStore); ok {
		from, err := as.AuditApplied()
		if err != nil {
			return fmt.Errorf("state service: %w", err) // Stop ends the followers
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.followAudit(runCtx, as, from)
		}()
	}
	if err := s.catchUp(ctx); err != nil {
		return fmt.Errorf("state replica: %w", err)
	}
	if rebuild != nil {
		s.rebuilt(ctx, rebuild) // caught up: at once
	}
	svc, err := micro.AddService(s.nc, micro.Config{
		Name:        s.sub.StateService(),
		Version:     "0.3.0",
		Description: "mcpexec job records and memory (a replica)",
		Metadata:    s.metadata(),
	})
	if err != nil {
		return fmt.Errorf("add state service: %w", err)
	}
	endpoints := []struct {
		op string
		h  micro.HandlerFunc
	}{
		// Reads run side by side too (at most cap(s.reads)): one tenant's
		// large list does not hold up another's job.get.
		{OpJobGet, s.concurrently(s.reads, s.consistent(s.handleJobGet))},
		{OpJobGetMany, s.concurrently(s.reads, s.consistent(s.handleJobGetMany))},
		{OpJobStatuses, s.concurrently(s.reads, s.consistent(s.handleJobStatuses))},
		{OpJobList, s.concurrently(s.reads, s.consistent(s.handleJobList))},
		{OpDeadLetterList, s.concurrently(s.reads, s.consistent(s.handleDeadLetterList))},
		{OpMemoryGet, s.concurrently(s.reads, s.consistentMemory(s.handleMemoryGet))},
		{OpMemoryPut, s.concurrently(s.writes, s.tracedWrite("put", s.consistentMemory(s.handleMemoryPut)))},
		{OpMemoryList, s.concurrently(s.reads, s.consistentMemory(s.handleMemoryList))},
		{OpMemoryDelete, s.concurrently(s.writes, s.tracedWrite("delete", s.consistentMemory(s.handleMemoryDelete)))},
		// Every delivery of a job asks: its direct gets overlap.
		{OpJobHistory, s.concurrently(s.lookups, s.handleJobHistory)},
		// Each holds a file of up to 10 MiB: at most cap(s.fileOps) at once.
		{OpFilePut, s.concurrently(s.fileOps, s.consistent(s.handleFilePut))},
		{OpFileInput, s.concurrently(s.fileOps, s.consistent(s.handleFileInput))},
		{OpFileGet, s.concurrently(s.fileOps, s.consistent(s.handleFileGet))},
		// Audit entries are written asynchronously: no read-your-writes.
		{OpAuditList, s.concurrently(s.reads, s.handleAuditList)},
	}
	for _, e := range endpoints {
		name := endpointName(e.op)
		if err := svc.AddEndpoint(name, e.h, micro.WithEndpointSubject(s.sub.State(e.op))); err != nil {
			_ = svc.Stop() // the start failed: its error is the one to report
			return fmt.Errorf("add %s endpoint: %w", e.op, err)
		}
	}
	advisories := make(chan *nats.Msg, 1024)
	advSub, err := s.nc.ChanSubscribe(maxDeliveriesAdvisory(s.sub), advisories)
	if err != nil {
		_ = svc.Stop() // the start failed: its error is the one to report
		return fmt.Errorf("subscribe to max-deliveries advisories: %w", err)
	}
	// Backups: asked of this node by name, or of any one node.
	var admSubs []*nats.Subscription
	for _, subj := range []string{s.sub.AdminBackup(AnyNode), s.sub.AdminBackup(s.Node)} {
		if subj == s.sub.AdminBackup("") {
			continue // unnamed node: only "any" reaches it
		}
		sub, err := s.nc.QueueSubscribe(subj, "backup", s.handleBackup)
		if err != nil {
			_ = svc.Stop()           // the start failed: its error is the one to report
			_ = advSub.Unsubscribe() // the start failed: its error is the one to report
			for _, a := range admSubs {
				_ = a.Unsubscribe() // the start failed: its error is the one to report
			}
			return fmt.Errorf("answer backup requests: %w", err)
		}
		admSubs = append(admSubs, sub)
	}
	// The server has the endpoints' subscriptions once Start returns, so no
	// request gets "no responders".
	if err := s.nc.FlushTimeout(10 * time.Second); err != nil {
		_ = svc.Stop()           // the start failed: its error is the one to report
		_ = advSub.Unsubscribe() // the start failed: its error is the one to report
		return fmt.Errorf("register state service: %w", err)
	}
	s.mu.Lock()
	s.svc, s.advSub, s.admSubs = svc, advSub, admSubs
	s.mu.Unlock()
	s.wg.Add(4)
	go func() {
		defer s.wg.Done()
		s.retentionLoop(runCtx)
	}()
	go func() {
		defer s.wg.Done()
		s.expiryLoop(runCtx)
	}()
	go func() {
		defer s.wg.Done()
		s.sched.run(runCtx)
	}()
	go func() {
		defer s.wg.Done()
		s.advisoryLoop(runCtx, advisories)
	}()
	return nil
}

// Stop stops answering and following. It is idempotent.
func (s *Service) Stop() {
	s.mu.Lock()
	cancel, svc, advSub, admSubs := s.cancel, s.svc, s.advSub, s.admSubs
	s.cancel, s.svc, s.advSub, s.admSubs = nil, nil, nil, nil
	s.stopped = true
	s.mu.Unlock()
	if svc != nil {
		if err := svc.Stop(); err != nil {
			s.logger.Warn("stop state service", "err", err)
		}
	}
	for _, sub := range append(admSubs, advSub) {
		if sub != nil {
			_ = sub.Unsubscribe() // a closed connection has none left
		}
	}
	if cancel != nil {
		cancel()
	}
	s.wg.Wait()
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

func (s *Service) retentionLoop(ctx context.Context) {
	every := s.RetentionEvery
	if every <= 0 {
		every = time.Hour
	}
	periodic.Run(ctx, every, func() {
		s.pruneAudit(time.Now())
		if s.Retention == (Retention{}) {
			return
		}
		n, err := s.store.Prune(s.Retention, time.Now())
		if err != nil {
			s.logger.Error("apply retention", "err", err)
		} else if n > 0 {
			s.logger.Info("deleted finished job records past retention", "count", n)
		}
	})
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

// MaxReads bounds the read requests a replica answers at once.
const MaxReads = 8

// concurrently runs h in its own goroutine, at most cap(slots) at once: so
// that concurrent writes share bbolt commits (boltstore uses bolt.Batch), a
// slow read (a large page) does not queue every other read behind it, and
// look-ups that wait on the broker overlap.
func (s *Service) concurrently(slots chan struct{}, h micro.HandlerFunc) micro.HandlerFunc {
	return func(req micro.Request) {
		slots <- struct{}{}
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			<-slots
			_ = req.Error(CodeUnavailable, "this state replica is stopping: retry", nil) // the asker may be gone
			return
		}
		s.wg.Add(1)
		s.mu.Unlock()
		// The micro service inspects its own request once this handler
		// returns: the goroutine answers through a copy that shares nothing
		// with it.
		d := &detached{nc: s.nc, subject: req.Subject(), reply: req.Reply(), data: req.Data(), headers: req.Headers()}
		go func() {
			defer s.wg.Done()
			defer func() { <-slots }()
			h(d)
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

// migrateMemory republishes, once, the memory of a state file written before
// memory went through the memory stream: its entries would otherwise live on
// this node only, and their versions would never match a stream sequence. It
// does nothing when the stream holds writes already; the replica then folds
// the republished entries like any write (new versions).
func (s *Service) migrateMemory(ctx context.Context) error {
	if last, err := s.lastSeq(ctx, s.sub.MemoryStream()); err != nil || last > 0 {
		return err
	}
	legacy, err := s.store.AllMemory()
	if err != nil || len(legacy) == 0 {
		return err
	}
	for _, m := range legacy {
		op := MemoryOp{Op: MemoryPutOp, Namespace: m.Namespace, Key: m.Key, Value: m.Value, Metadata: m.Metadata, CreatedAt: m.CreatedAt, At: m.UpdatedAt}
		data, err := json.Marshal(op)
		if err != nil {
			return err
		}
		msg := nats.NewMsg(s.sub.Memory(m.Namespace, m.Key))
		msg.Data = data
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0") // never over a newer write
		if _, err := s.js.PublishMsg(ctx, msg); err != nil && !isWrongLastSeq(err) {
			return fmt.Errorf("republish memory %q of %q: %w", m.Key, m.Namespace, err)
		}
	}
	if err := s.sync(ctx); err != nil {
		return fmt.Errorf("republish memory: %w", err)
	}
	s.logger.Info("republished the memory of an earlier state file into the memory stream", "entries", len(legacy))
	return nil
}

// sync returns once what JetStream acknowledged to the service before the
// call is durable (Barrier).
func (s *Service) sync(ctx context.Context) error {
	if s.Barrier == nil {
		return nil
	}
	return s.Barrier.Sync(ctx)
}

// syncStream returns once what JetStream acknowledged to the service
// before the call on stream is durable: a pass over that stream's files
// where the Barrier can scope one (durable.SyncStream; the broker's
// Syncer, in this process). A pass over the whole store walks every
// stream and bucket of the node, where the replica, which waits for one
// before it folds each batch, needs only its stream's.
func (s *Service) syncStream(ctx context.Context, stream string) error {
	if s.Barrier == nil {
		return nil
	}
	return durable.SyncStream(ctx, s.Barrier, stream)
}

// metadata is the micro service's: Metadata and the node's name.
func (s *Service) metadata() map[string]string {
	md := maps.Clone(s.Metadata)
	if md == nil {
		md = map[string]string{}
	}
	md["node"] = s.Node
	return md
}
