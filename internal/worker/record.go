package worker

// This file records a job's events: its outcome, retried while the cluster
// fails over, and shrunk when it does not fit a message.
import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
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

// publishFirstStart records ev, the start of a first delivery's attempt 1,
// on condition that the job's claim is still its last event. When the
// first try's answer is lost (a failover), the tries after it go without
// the condition, under the same Nats-Msg-Id: a start that landed is then
// not stored twice (where JetStream checks the condition before the
// deduplication, a repeat would fail it), and a cancellation recorded in
// between is announced to the cancel subscription, as for any running job.
func (w *Worker) publishFirstStart(ctx context.Context, d *delivery, ev jobs.Event) error {
	pubCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), eventTryWait)
	err := w.client.PublishFirstStart(d.traced(pubCtx), ev, d.claimSeq)
	cancel()
	if !queue.Transient(err) {
		return err
	}
	d.log.Warn("record event: retrying", "event", ev.Kind, "err", err)
	return w.publishEvent(ctx, d, ev, nil)
}

// publishEvent records ev, retrying while the cluster fails over (the
// event's Nats-Msg-Id makes a retry of one that landed a no-op): a start or an
// outcome not recorded would cost the job an attempt. shrink, when set, is
// called once if ev is too large for a message, before publishing it again.
func (w *Worker) publishEvent(ctx context.Context, d *delivery, ev jobs.Event, shrink func()) error {
	deadline := time.Now().Add(queue.DefaultPatience)
	for {
		pubCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), eventTryWait)
		err := w.client.PublishEvent(d.traced(pubCtx), ev)
		if err != nil && shrink != nil && isTooLarge(err) {
			shrink()
			err = w.client.PublishEvent(d.traced(pubCtx), ev)
		}
		cancel()
		if !queue.Transient(err) || time.Now().After(deadline) {
			return err
		}
		d.log.Warn("record event: retrying", "event", ev.Kind, "err", err)
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
