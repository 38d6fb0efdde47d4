package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/state"
)

// JobEvent is a job's lifecycle event as its namespace sees it.
type JobEvent = jobs.EventView

// trusted reports whether ev, which came on subject, may be shown to its
// tenant or acted upon: it is the event its subject names, and if of a kind
// workers publish (started, finished; released, which the state service
// publishes, too) it carries its job's proof. A worker host may publish those
// subjects for any job; only the one that holds a job has its capability.
// Submissions and cancellations come from front-ends alone (the roles'
// permissions), and a front-end's own finished events (rejections, sessions
// that are gone) carry their proof like a worker's.
func (f *Frontend) trusted(subject string, ev jobs.Event) bool {
	if subject != f.cfg.Subjects.Event(ev.Job, ev.Kind) {
		return false
	}
	return !jobs.NeedsProof(ev.Kind) || jobs.CheckEvent(f.key, ev)
}

// maxLabelCache bounds the labels Follow remembers per follower.
const maxLabelCache = 10_000

// Follow calls fn with each job event of namespace ns, in the events
// stream's order, until ctx ends (it returns nil) or fn returns an error (it
// returns it). With resume it starts after stream sequence after (0: the
// oldest event kept); without, at the next new event.
func (f *Frontend) Follow(ctx context.Context, ns string, after uint64, resume bool, fn func(JobEvent) error) error {
	ns = jobs.NamespaceOf(ns)
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{f.cfg.Subjects.AllEvents()}, DeliverPolicy: jetstream.DeliverNewPolicy}
	if resume {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	cons, err := f.client.JetStream().OrderedConsumer(ctx, f.cfg.Subjects.EventsStream(), cfg)
	if err != nil {
		return fmt.Errorf("%w: follow the events stream: %w", ErrUnavailable, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("%w: follow the events stream: %w", ErrUnavailable, err)
	}
	defer it.Stop()
	// Next blocks: ctx's end stops the iterator.
	defer context.AfterFunc(ctx, it.Stop)()
	labels := map[string]map[string]string{}
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return fmt.Errorf("%w: follow the events stream: %w", ErrUnavailable, err)
		}
		var ev jobs.Event
		md, merr := m.Metadata()
		if merr != nil || json.Unmarshal(m.Data(), &ev) != nil || !f.trusted(m.Subject(), ev) {
			continue
		}
		id, ok := jobs.UnscopedID(ns, ev.Job)
		if !ok || id == "" {
			continue
		}
		out := JobEvent{Seq: md.Sequence.Stream, Job: id, Kind: ev.Kind, Attempt: ev.Attempt, Worker: ev.Worker, At: ev.At}
		switch ev.Kind {
		case jobs.EventSubmitted:
			out.Status = jobs.StatusQueued
			if ev.Spec != nil {
				if ev.Spec.Waits() {
					out.Status = jobs.StatusWaiting
				}
				labels[ev.Job] = ev.Spec.Labels
			}
		case jobs.EventReleased:
			out.Status = jobs.StatusQueued
		case jobs.EventStarted:
			out.Status = jobs.StatusRunning
		case jobs.EventFinished:
			if ev.Result == nil {
				continue
			}
			out.Status, out.Error = ev.Result.Status, ev.Result.Error
		case jobs.EventCancelled:
			out.Status, out.Error = jobs.StatusCancelled, ev.Reason
		default:
			continue
		}
		l, known := labels[ev.Job]
		if !known {
			if rec, err := f.state.Job(ctx, ev.Job); err == nil {
				l = rec.Job.Labels
			} else if !errors.Is(err, state.ErrNotFound) && ctx.Err() == nil {
				return fmt.Errorf("%w: labels of job %s: %w", ErrUnavailable, id, err)
			}
			if len(labels) >= maxLabelCache {
				clear(labels)
			}
			labels[ev.Job] = l
		}
		out.Labels = l
		if err := fn(out); err != nil {
			return err
		}
	}
}
