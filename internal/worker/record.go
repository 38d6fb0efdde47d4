package worker

// This file records a job's events: its outcome, retried while the cluster
// fails over, and shrunk when it does not fit a message.
import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
)

// record publishes the job's terminal event (its result), shrinking the output
// if the message would be too large.
func (w *Worker) record(ctx context.Context, d *delivery, attempt int, res jobs.Result) error {
	res.Worker, res.Attempt = w.cfg.ID, attempt
	ev := jobs.Event{Job: d.job.ID, Kind: jobs.EventFinished, Attempt: attempt, Worker: w.cfg.ID, Result: &res,
		Proof: jobs.EventProof(d.capability, jobs.EventFinished, attempt)}
	err := w.publishEvent(ctx, d, ev, func() { shrinkOutput(&res, int(w.nc.MaxPayload())/4) })
	if err == nil {
		w.cfg.Metrics.WorkerJob(string(res.Status))
	}
	return err
}

// eventTryWait bounds one try of publishing an event.
const eventTryWait = 4 * time.Second

// publishStart records ev, the delivery's start of its attempt, on the
// condition after (queue.PublishStart), retrying while the cluster fails
// over or a barrier fails. A retry is refused once an earlier try landed
// (its own start is then the job's last): the job's history then says
// whether the start it finds is this delivery's. Any other start, or a
// history that cannot be read before the patience runs out, leaves the
// attempt not started (ErrHistoryMoved hands the message back, to be
// delivered again with its history read).
//
// It returns once the start is stored, not yet durable where the broker
// syncs behind a barrier: durable makes it so, and the run's first call
// waits for it (natsHost.startIsDurable). A run that calls nothing needs
// no barrier of its own: its outcome's, later in the same stream, covers
// the start.
func (w *Worker) publishStart(ctx context.Context, d *delivery, ev jobs.Event, after queue.StartAfter) (durable queue.Durable, err error) {
	err = retryEvent(ctx, d, ev.Kind, func(ctx context.Context, try int) error {
		sync, err := w.client.StartStored(ctx, ev, after, d.token)
		if err == nil {
			durable = sync
			return nil
		}
		if try == 0 || !errors.Is(err, queue.ErrHistoryMoved) {
			return err
		}
		if err = w.startedBy(ctx, d, ev); err == nil {
			// An earlier try landed: a barrier, then the history read
			// again, say it is durable.
			durable = func(ctx context.Context) error {
				if err := w.client.SyncEvents(ctx); err != nil {
					return err
				}
				return w.startedBy(ctx, d, ev)
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return w.durableStart(d, ev, durable), nil
}

// durableStart returns sync, retried like the start. A start that the
// broker may have lost (the connection was made again before its barrier)
// is durable if the job's history, read after the barrier, still has it;
// otherwise it is ErrHistoryMoved.
func (w *Worker) durableStart(d *delivery, ev jobs.Event, sync queue.Durable) queue.Durable {
	return func(ctx context.Context) error {
		return retryEvent(ctx, d, ev.Kind, func(ctx context.Context, _ int) error {
			err := sync(ctx)
			if errors.Is(err, queue.ErrStartUnconfirmed) {
				return w.startedBy(ctx, d, ev)
			}
			return err
		})
	}
}

// startedBy returns nil when the job's history says its last start is ev,
// by this delivery; ErrHistoryMoved when it is not.
func (w *Worker) startedBy(ctx context.Context, d *delivery, ev jobs.Event) error {
	h, err := w.state.JobHistory(ctx, d.job.ID, d.capability)
	if err == nil && !h.StartedBy(ev, d.token) {
		err = fmt.Errorf("%w: the job's last start is another delivery's", queue.ErrHistoryMoved)
	}
	return err
}

// publishEvent records ev, retrying while the cluster fails over (the
// event's Nats-Msg-Id makes a retry of one that landed a no-op): a start or an
// outcome not recorded would cost the job an attempt. shrink, when set, is
// called once if ev is too large for a message, before publishing it again.
func (w *Worker) publishEvent(ctx context.Context, d *delivery, ev jobs.Event, shrink func()) error {
	return retryEvent(ctx, d, ev.Kind, func(ctx context.Context, _ int) error {
		err := w.client.PublishEvent(ctx, ev)
		if err != nil && shrink != nil && isTooLarge(err) {
			shrink()
			err = w.client.PublishEvent(ctx, ev)
		}
		return err
	})
}

// retryEvent runs try (the try-th, from 0, on the delivery's trace, each
// bounded by eventTryWait and not by ctx's cancellation) until it succeeds
// or fails for good, 250 ms apart, within queue.DefaultPatience: a failure
// that may pass (queue.Transient, state.ErrUnavailable) is tried again.
func retryEvent(ctx context.Context, d *delivery, kind jobs.EventKind, try func(ctx context.Context, n int) error) error {
	deadline := time.Now().Add(queue.DefaultPatience)
	for n := 0; ; n++ {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), eventTryWait)
		err := try(d.traced(tctx), n)
		cancel()
		if !(queue.Transient(err) || errors.Is(err, state.ErrUnavailable)) || time.Now().After(deadline) {
			return err
		}
		d.log.Warn("record event: retrying", "event", kind, "err", err)
		time.Sleep(250 * time.Millisecond)
	}
}

func isTooLarge(err error) bool {
	return errors.Is(err, nats.ErrMaxPayload)
}

// shrinkOutput keeps at most limit bytes of each stream, cut at a character
// boundary.
func shrinkOutput(res *jobs.Result, limit int) {
	if len(res.Stdout) > limit {
		res.Stdout, res.StdoutTruncated = errs.Cut(res.Stdout, limit), true
	}
	if len(res.Stderr) > limit {
		res.Stderr, res.StderrTruncated = errs.Cut(res.Stderr, limit), true
	}
}
