package state

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A replica fsyncs every commit; JetStream, under an interval sync policy or
// when its files are damaged, may lose its last writes in a power cut. The
// replica then has applied sequences the stream no longer holds, and new
// writes take those sequences: followed from where it left off, the replica
// would skip them. It checks at start, and while it follows, and
// resynchronises:
//
//   - events: the records stay (they are the only copy of what the stream
//     lost), and the replica applies again what the stream holds from a
//     minute before its own last commit (rewindMargin: the nodes' clocks may
//     differ), so that the events that took the lost sequences since the
//     stream came back are applied. Folding an event is idempotent (a record
//     only moves forward: attempts, terminal statuses), so applying an event
//     again changes nothing.
//   - memory: a version is the sequence of its write, and compare-and-set
//     asks JetStream for it, so versions past the stream's last sequence
//     name writes the stream does not hold: the replica drops its memory and
//     folds the memory stream again from its start.
//
// A stream lost its tail when it holds less than the replica applied, or
// when the message at the replica's last applied sequence is not the one it
// applied (new writes took the lost sequences): at start, one published after
// the replica's last commit (clockTolerance allowing for the nodes' clocks);
// while following, one with another time than the one applied.

// rewindMargin is how long before its last commit a replica that rewinds
// the events stream applies the stream's events again: the streams' leaders
// and this node may disagree on the time by as much.
const rewindMargin = time.Minute

// clockTolerance is how much later than the replica's last commit (by its
// own clock) the message it applied last may say it was published, by the
// stream leader's clock, before the replica takes it for another one.
var clockTolerance = 2 * time.Second

// rewindCheck is how often a follower checks that its stream still holds
// what it has applied.
var rewindCheck = 10 * time.Second

// lostTail is what a replica found of a stream that lost its last writes.
type lostTail struct {
	st  jetstream.StreamState // what the stream holds
	why string
}

// checkTail reports whether stream lost what the replica applied up to
// applied. The message applied at applied was published at published (zero:
// unknown; then one published after notAfter is another).
func (s *Service) checkTail(ctx context.Context, stream string, applied uint64, published, notAfter time.Time) (*lostTail, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", stream, err)
	}
	state := st.CachedInfo().State
	if state.LastSeq < applied {
		return &lostTail{st: state, why: fmt.Sprintf("the stream holds up to sequence %d, the replica applied up to %d", state.LastSeq, applied)}, nil
	}
	if published.IsZero() && notAfter.IsZero() {
		return nil, nil
	}
	msg, err := st.GetMsg(ctx, applied)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil // deleted since (aged out, or its key written again): nothing to compare
	}
	if err != nil {
		return nil, fmt.Errorf("read message %d of stream %s: %w", applied, stream, err)
	}
	switch {
	case !published.IsZero() && (msg.Time.Sub(published) > time.Millisecond || published.Sub(msg.Time) > time.Millisecond):
		return &lostTail{st: state, why: fmt.Sprintf("the stream's message %d, which the replica applied, was published at %s; the stream's is of %s",
			applied, published.UTC().Format(time.RFC3339Nano), msg.Time.UTC().Format(time.RFC3339Nano))}, nil
	case published.IsZero() && msg.Time.After(notAfter.Add(clockTolerance)):
		return &lostTail{st: state, why: fmt.Sprintf("the stream's message %d was published at %s, after the replica applied its own message %d (at %s)",
			applied, msg.Time.UTC().Format(time.RFC3339Nano), applied, notAfter.UTC().Format(time.RFC3339Nano))}, nil
	}
	return nil, nil
}

// memoryRebuild is a fold of the memory stream from its start, after the
// replica dropped its memory: what it held before, and what the stream held
// when it began.
type memoryRebuild struct {
	before map[string][sha256.Size]byte
	upTo   uint64
}

// checkStreams resynchronises the replica, before it follows the streams,
// with streams that lost what it applied. It returns the memory rebuild it
// began, if any.
func (s *Service) checkStreams(ctx context.Context) (*memoryRebuild, error) {
	ev, mem := s.applied.get()
	evAt, memAt, err := s.store.AppliedAt()
	if err != nil {
		return nil, err
	}
	if ev > 0 {
		lost, err := s.checkTail(ctx, s.sub.EventsStream(), ev, time.Time{}, evAt)
		if err != nil {
			return nil, err
		}
		if lost != nil {
			if _, err := s.rewindEvents(ctx, ev, lost); err != nil {
				return nil, err
			}
		}
	}
	if mem > 0 {
		lost, err := s.checkTail(ctx, s.sub.MemoryStream(), mem, time.Time{}, memAt)
		if err != nil {
			return nil, err
		}
		if lost != nil {
			return s.resetMemory(mem, lost)
		}
	}
	return nil, nil
}

// rewindEvents applies the events stream again from before the events that
// may have taken the sequences it lost (keeping the records): the replica had
// applied up to applied. It returns the sequence to follow from.
func (s *Service) rewindEvents(ctx context.Context, applied uint64, lost *lostTail) (uint64, error) {
	stream := s.sub.EventsStream()
	from := s.rewindPoint(ctx, lost.st)
	s.logger.Error("this state replica has applied events that the events stream no longer holds: the stream lost its last events "+
		"(writes not yet on disk when the power went, or damaged files); keeping the job records it holds, and applying the stream's events "+
		"again from before its own last commit, so that the events that take the lost sequences are not skipped",
		"stream", stream, "found", lost.why, "applied", applied, "stream_last", lost.st.LastSeq, "stream_first", lost.st.FirstSeq,
		"applies_again_after", from, "node", s.Node)
	if err := s.store.RewindEvents(from); err != nil {
		return applied, fmt.Errorf("rewind the events applied to %d: %w", from, err)
	}
	s.applied.rewindEvents(from)
	s.Metrics.StateResync(stream)
	return from, nil
}

// rewindPoint is the sequence after which a rewound replica applies the
// events stream again: before every event published since the stream lost
// its tail. Those were published after this replica's last commit (it had
// applied what was lost), so it is the last event before that commit, less
// rewindMargin; the whole stream when that is unknown.
func (s *Service) rewindPoint(ctx context.Context, st jetstream.StreamState) uint64 {
	all := max(st.FirstSeq, 1) - 1
	at, _, err := s.store.AppliedAt()
	if err != nil || at.IsZero() {
		return all
	}
	since := at.Add(-rewindMargin)
	cons, err := s.js.OrderedConsumer(ctx, s.sub.EventsStream(), jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since})
	if err != nil {
		s.logger.Warn("find the events stream's first event since the replica's last commit: applying the whole stream again", "err", err)
		return all
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(time.Second))
	if errors.Is(err, nats.ErrTimeout) {
		return st.LastSeq // nothing since: the stream held no more when st was read
	}
	var md *jetstream.MsgMetadata
	if err == nil {
		md, err = msg.Metadata()
	}
	if err != nil {
		s.logger.Warn("find the events stream's first event since the replica's last commit: applying the whole stream again", "err", err)
		return all
	}
	return min(st.LastSeq, md.Sequence.Stream-1)
}

// resetMemory drops the replica's memory, to fold the memory stream again
// from its start: the replica had applied up to applied.
func (s *Service) resetMemory(applied uint64, lost *lostTail) (*memoryRebuild, error) {
	stream := s.sub.MemoryStream()
	before, err := s.store.MemoryDigests()
	if err != nil {
		return nil, err
	}
	s.logger.Error("this state replica has applied memory writes that the memory stream no longer holds: the stream lost its last writes "+
		"(writes not yet on disk when the power went, or damaged files); memory versions are stream sequences, so the replica drops its memory "+
		"and folds the memory stream again from its start: memory is what the stream holds",
		"stream", stream, "found", lost.why, "applied", applied, "stream_last", lost.st.LastSeq, "stream_first", lost.st.FirstSeq,
		"keys", len(before), "node", s.Node)
	if err := s.store.ResetMemory(); err != nil {
		return nil, err
	}
	s.applied.resetMemory(lost.st.LastSeq)
	s.quota.reset()
	s.Metrics.StateResync(stream)
	return &memoryRebuild{before: before, upTo: lost.st.LastSeq}, nil
}

// rebuilt reports, once the replica has folded the memory stream up to what
// it held when r began, how many keys the rebuild changed.
func (s *Service) rebuilt(ctx context.Context, r *memoryRebuild) {
	if err := s.applied.wait(ctx, 0, r.upTo, time.Hour, false); err != nil {
		return // stopping
	}
	after, err := s.store.MemoryDigests()
	if err != nil {
		s.logger.Warn("compare the memory rebuilt with what the replica held", "err", err)
		return
	}
	changed := 0
	for k, d := range r.before {
		if a, ok := after[k]; !ok || a != d {
			changed++
		}
	}
	for k := range after {
		if _, ok := r.before[k]; !ok {
			changed++
		}
	}
	s.logger.Warn("this state replica rebuilt its memory from the memory stream: keys whose value or version changed (the writes the stream lost are gone)",
		"stream", s.sub.MemoryStream(), "keys_changed", changed, "keys_before", len(r.before), "keys_after", len(after), "node", s.Node)
}

// resyncFollower resynchronises, while it runs, the follower of stream that
// found the stream lost what it applied (up to applied); it returns the
// sequence to follow from.
func (s *Service) resyncFollower(ctx context.Context, stream string, applied uint64, lost *lostTail) (uint64, error) {
	if stream == s.sub.EventsStream() {
		return s.rewindEvents(ctx, applied, lost)
	}
	r, err := s.resetMemory(applied, lost)
	if err != nil {
		return applied, err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.rebuilt(ctx, r)
	}()
	return 0, nil
}
