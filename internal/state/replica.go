package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Every broker node runs a replica: it folds the replicated streams (job
// events, memory writes) into its own bbolt file, each from the sequence after
// the last one it applied (kept in the file, written in the same transaction
// as what it applied). No replica is special; any answers any read.

// Headers of read-your-writes. A request may carry the stream sequences its
// sender has seen; the replica answers once it has applied them (or says it is
// behind). Every answer carries the replica's applied sequences.
const (
	HeaderEventsSeq = "Mcpexec-Events-Seq"
	HeaderMemorySeq = "Mcpexec-Memory-Seq"
)

// Bounds of read-your-writes.
const (
	// catchUpWait bounds a request's wait for the replica to apply what its
	// sender has seen; past it the replica answers ErrBehind.
	catchUpWait = time.Second
	// writeWait bounds a write's wait for its own application.
	writeWait = 3 * time.Second
)

// Pull settings of the followers (the heartbeat must be at most half the
// expiry).
const (
	followExpiry    = 5 * time.Second
	followHeartbeat = 500 * time.Millisecond
	// Under load (the last batch held more than one message), a batch
	// smaller than lingerBelow waits up to followLinger for more, so that
	// each commit (page writes and an fsync, which the replicas of a
	// cluster on one machine contend for) applies many messages; unless a
	// request waits for what the batch holds (applied.hurry).
	followLinger = 10 * time.Millisecond
	lingerBelow  = 512
)

// ErrBehind is the error of a replica that has not applied what a request's
// sender has seen: another replica (or a retry) answers.
var ErrBehind = errs.New(errs.Unavailable, "this state replica is behind the streams")

// applied tracks how far the replica has folded each stream, and wakes those
// who wait for it.
type applied struct {
	mu     sync.Mutex // guards the fields below
	events uint64
	memory uint64
	// lostEvents and lostMemory are what the replica had applied of each
	// stream when it found the stream held less (0: never): an asker may
	// have seen sequences up to them that the stream lost.
	lostEvents, lostMemory uint64
	// memoryFloor is what memory requests wait for while the replica folds
	// the memory stream again (the stream's last sequence then).
	memoryFloor uint64
	wake        chan struct{} // closed (and replaced) at each advance
	// hurryEvents and hurryMemory get a token when a request waits for
	// more of that stream than is applied: its follower stops lingering
	// for a larger batch and applies what it has.
	hurryEvents, hurryMemory chan struct{}
}

func newApplied(events, memory uint64) *applied {
	return &applied{events: events, memory: memory, wake: make(chan struct{}),
		hurryEvents: make(chan struct{}, 1), hurryMemory: make(chan struct{}, 1)}
}

// hurry returns the channel that tells stream's follower a request waits.
func (a *applied) hurry(memory bool) <-chan struct{} {
	if memory {
		return a.hurryMemory
	}
	return a.hurryEvents
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (a *applied) get() (events, memory uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.events, a.memory
}

func (a *applied) advance(events, memory uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events, a.memory = max(a.events, events), max(a.memory, memory)
	a.wakeLocked()
}

func (a *applied) wakeLocked() {
	close(a.wake)
	a.wake = make(chan struct{})
}

// rewindEvents sets the events applied back to seq (the stream lost what
// followed).
func (a *applied) rewindEvents(seq uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lostEvents = max(a.lostEvents, a.events)
	a.events = seq
	a.wakeLocked()
}

// resetMemory sets the memory applied back to 0: it is folded again, and
// memory requests wait until floor is.
func (a *applied) resetMemory(floor uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lostMemory = max(a.lostMemory, a.memory)
	a.memory, a.memoryFloor = 0, floor
	a.wakeLocked()
}

// lost returns what the replica has applied of each stream, and what it had
// applied when it found a stream held less (0: never).
func (a *applied) lost() (events, memory, lostEvents, lostMemory uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.events, a.memory, a.lostEvents, a.lostMemory
}

// wait returns nil once events and memory are applied (and, when
// memoryFloor is set, the memory a rebuild waits for), else ErrBehind when d
// passes (or ctx ends).
func (a *applied) wait(ctx context.Context, events, memory uint64, d time.Duration, memoryFloor bool) error {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		a.mu.Lock()
		mem := memory
		if memoryFloor {
			mem = max(mem, a.memoryFloor)
		}
		ok := a.events >= events && a.memory >= mem
		wake := a.wake
		ae, am := a.events, a.memory
		a.mu.Unlock()
		if ok {
			return nil
		}
		if ae < events {
			signal(a.hurryEvents)
		}
		if am < mem {
			signal(a.hurryMemory)
		}
		select {
		case <-wake:
		case <-t.C:
			return fmt.Errorf("%w: it has applied events %d and memory %d, the request needs %d and %d: retry (another replica may answer)", ErrBehind, ae, am, events, mem)
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrBehind, ctx.Err())
		}
	}
}

// seqHeader reads a sequence header (0 when absent or malformed).
func seqHeader(h nats.Header, key string) uint64 {
	n, _ := strconv.ParseUint(h.Get(key), 10, 64)
	return n
}

// follow folds stream into the store, from the message after from, until ctx
// ends. apply is given each batch and the stream sequence of its last message.
// When the stream is found to hold less than the follower has applied, it
// resynchronises (resyncFollower) and follows on from what that says.
func (s *Service) follow(ctx context.Context, stream string, from uint64, apply func([]jetstream.Msg, uint64) error) {
	for ctx.Err() == nil {
		cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
		if from > 0 {
			cfg = jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from + 1}
		}
		cons, err := s.js.OrderedConsumer(ctx, stream, cfg)
		if err != nil {
			s.logger.Warn("follow stream", "stream", stream, "err", err)
			s.sleep(ctx, time.Second)
			continue
		}
		var lost *lostTail
		from, lost = s.drain(ctx, stream, cons, from, apply)
		if lost != nil {
			next, err := s.resyncFollower(ctx, stream, from, lost)
			if err != nil {
				s.logger.Error("resynchronise with stream", "stream", stream, "err", err)
				s.sleep(ctx, time.Second)
			}
			from = next
		}
	}
}

// drain applies what cons delivers, in batches of what has arrived, until it
// fails or ctx ends; it returns the last sequence applied. The ordered
// consumer recreates itself across leader changes and reconnects. Every
// rewindCheck it checks that the stream still holds what it has applied: a
// consumer that starts after it would skip what takes the lost sequences, so
// it returns what it found when the stream lost it.
func (s *Service) drain(ctx context.Context, stream string, cons jetstream.Consumer, from uint64, apply func([]jetstream.Msg, uint64) error) (uint64, *lostTail) {
	const maxBatch = 1024
	msgs := make(chan jetstream.Msg, 4*maxBatch)
	stop := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-stop:
		}
	}, jetstream.PullMaxMessages(maxBatch),
		// A consumer whose node died is noticed after two missed heartbeats,
		// and recreated on a live node: the replica stalls about a second,
		// not the 10 s of the default heartbeat.
		jetstream.PullExpiry(followExpiry), jetstream.PullHeartbeat(followHeartbeat),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			// Missed heartbeats are the normal sign of a node going: the
			// ordered consumer recreates itself. Anything else is worth a look.
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				s.logger.Debug("follow stream", "stream", stream, "err", err)
				return
			}
			s.logger.Warn("fetch from stream", "stream", stream, "err", err)
		}))
	if err != nil {
		s.logger.Warn("follow stream", "stream", stream, "err", err)
		s.sleep(ctx, time.Second)
		return from, nil
	}
	defer cc.Stop()
	defer close(stop) // runs first: a blocked callback returns
	check := time.NewTicker(rewindCheck)
	defer check.Stop()
	var published time.Time // of the message at from, once this drain applied it
	prev := 0               // the size of the last batch: more than one means load
	lostTail := func() *lostTail {
		if from == 0 {
			return nil
		}
		var notAfter time.Time // when the replica applied from, when this drain did not
		if published.IsZero() {
			evAt, memAt, _ := s.store.AppliedAt() // zero on error: no comparison
			notAfter = memAt
			if stream == s.sub.EventsStream() {
				notAfter = evAt
			}
		}
		lost, err := s.checkTail(ctx, stream, from, published, notAfter)
		if err != nil {
			s.logger.Debug("check the stream holds what was applied", "stream", stream, "err", err)
		}
		return lost
	}
	for {
		var batch []jetstream.Msg
		select {
		case m := <-msgs:
			batch = append(batch, m)
		case <-check.C:
			if lost := lostTail(); lost != nil {
				return from, lost
			}
			continue
		case <-ctx.Done():
			return from, nil
		}
		// Under load, linger for more, so that commits each apply many
		// messages; without load, or when a request waits, a message is
		// applied at once.
		batch = gather(msgs, batch, maxBatch, prev > 1, s.applied.hurry(stream == s.sub.MemoryStream()))
		prev = len(batch)
		// The ordered consumer's first message, and its first after it was
		// created again (a node or the stream lost and back): what it
		// delivers now may follow writes that took the sequences the stream
		// lost, which the tick's check would find too late, once later ones
		// had moved from past them.
		for _, m := range batch {
			if md, err := m.Metadata(); err == nil && md.Sequence.Consumer == 1 {
				if lost := lostTail(); lost != nil {
					return from, lost
				}
				break
			}
		}
		// Drop what a reset redelivered: applied already.
		fresh, last, lastAt := batch[:0], from, published
		for _, m := range batch {
			if md, err := m.Metadata(); err == nil && md.Sequence.Stream > from {
				fresh, last, lastAt = append(fresh, m), md.Sequence.Stream, md.Timestamp
			}
		}
		if batch = fresh; len(batch) == 0 {
			continue
		}
		// What the replica folds is durable in the stream first (a broker
		// with barriers acknowledges writes before it syncs them): a power
		// cut never leaves the replica holding what the stream lost. A pass
		// over that stream's files is enough.
		err := s.syncStream(ctx, stream)
		if err == nil {
			err = apply(batch, last)
		}
		if err != nil {
			// Not applied: start again after what was (the store says).
			s.logger.Error("apply stream", "stream", stream, "count", len(batch), "err", err)
			s.sleep(ctx, time.Second)
			return from, nil
		}
		from, published = last, lastAt
	}
}

// gather adds to batch what has arrived on msgs, up to limit messages; when
// linger is set and the batch is under lingerBelow, it waits up to
// followLinger for more, unless hurry says a request waits (nil: none does).
func gather(msgs <-chan jetstream.Msg, batch []jetstream.Msg, limit int, linger bool, hurry <-chan struct{}) []jetstream.Msg {
	var deadline <-chan time.Time
	for len(batch) < limit {
		select {
		case m := <-msgs:
			batch = append(batch, m)
			continue
		default:
		}
		if !linger || len(batch) >= lingerBelow {
			return batch
		}
		if deadline == nil {
			t := time.NewTimer(followLinger)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case m := <-msgs:
			batch = append(batch, m)
		case <-deadline:
			return batch
		case <-hurry:
			return batch
		}
	}
	return batch
}

// applyEvents folds a batch of the events stream.
func (s *Service) applyEvents(msgs []jetstream.Msg, last uint64) error {
	start := time.Now()
	evs := make([]jobs.Event, 0, len(msgs))
	kept := msgs[:0:0] // the messages of evs, for their spans
	for _, m := range msgs {
		var ev jobs.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil || !jobs.ValidID(ev.Job) {
			s.logger.Warn("skipping malformed event", "subject", m.Subject(), "err", err)
			continue
		}
		if m.Subject() != s.sub.Event(ev.Job, ev.Kind) {
			// A worker may publish any job's started and finished subjects:
			// what it says there must be that event, not a cancellation or
			// a submission, which need no proof.
			s.logger.Warn("skipping an event on another event's subject", "subject", m.Subject(), "job", ev.Job, "kind", ev.Kind)
			continue
		}
		if !s.proven(ev) {
			s.logger.Warn("skipping an event without its job's proof (a worker speaking for a job it does not hold?)",
				"job", ev.Job, "kind", ev.Kind, "worker", ev.Worker)
			continue
		}
		evs = append(evs, ev)
		if s.tracer != nil {
			kept = append(kept, m)
		}
	}
	changed, err := s.store.ApplyEvents(evs, last)
	s.appliedSpans(kept, evs, start, err)
	if err != nil {
		return err
	}
	s.observe(changed)
	s.sched.observe(changed)
	s.applied.advance(last, 0)
	return nil
}

// applyMemory folds a batch of the memory stream.
func (s *Service) applyMemory(msgs []jetstream.Msg, last uint64) error {
	ops := make([]MemoryOp, 0, len(msgs))
	for _, m := range msgs {
		var op MemoryOp
		md, err := m.Metadata()
		if err == nil {
			err = json.Unmarshal(m.Data(), &op)
		}
		if err != nil || (op.Op != MemoryPutOp && op.Op != MemoryDeleteOp) {
			s.logger.Warn("skipping malformed memory write", "subject", m.Subject(), "err", err)
			continue
		}
		op.Seq = md.Sequence.Stream
		ops = append(ops, op)
	}
	if err := s.store.ApplyMemory(ops, last); err != nil {
		return err
	}
	s.quota.fold(last) // the store counts these writes now
	s.applied.advance(0, last)
	return nil
}

// catchUp waits until the replica has applied what the streams held when it
// began, so that it never answers from an old view after a restart or a
// rebuild.
func (s *Service) catchUp(ctx context.Context) error {
	var want [2]uint64
	for i, name := range []string{s.sub.EventsStream(), s.sub.MemoryStream()} {
		last, err := s.lastSeq(ctx, name)
		if err != nil {
			return err
		}
		want[i] = last
	}
	start := time.Now()
	for {
		err := s.applied.wait(ctx, want[0], want[1], 10*time.Second, false)
		if err == nil {
			if d := time.Since(start); d > time.Second {
				s.logger.Info("state replica caught up with the streams", "events", want[0], "memory", want[1], "took", d.Round(time.Millisecond))
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		e, m := s.applied.get()
		s.logger.Info("state replica catching up", "events", e, "of", want[0], "memory", m, "of_memory", want[1])
	}
}

// lastSeq returns the sequence of the last message stream holds now.
func (s *Service) lastSeq(ctx context.Context, stream string) (uint64, error) {
	st, err := s.js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("look up stream %s: %w", stream, err)
	}
	return st.CachedInfo().State.LastSeq, nil
}
