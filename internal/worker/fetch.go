package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// fetchLoop pulls one language's jobs for the worker's slots (slots holds a
// token per job running, whatever its language). It takes what is pending for
// the free slots at once; when nothing is, it waits (up to FetchWait) for the
// next job holding no slot, so that the other languages' loops keep them all.
func (w *Worker) fetchLoop(ctx, jobsCtx context.Context, cons jetstream.Consumer, slots chan struct{}) {
	dispatch := func(msg jetstream.Msg) {
		w.running.Add(1)
		w.inFlight.Add(1)
		go func() {
			defer w.running.Done()
			defer w.inFlight.Add(-1)
			defer func() { <-slots }()
			w.handle(jobsCtx, msg)
		}()
	}
	for {
		// A sick worker takes no job until a probe of its runtime succeeds.
		if !w.health.wait(ctx) {
			return
		}
		// No free slot, no fetch: the fleet's other workers take the jobs.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		n := 1
	more:
		for n < w.cfg.Slots {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break more
			}
		}
		got := 0
		batch, err := cons.FetchNoWait(n)
		if err == nil {
			for msg := range batch.Messages() {
				got++
				dispatch(msg)
			}
			err = batch.Error()
		}
		for range n - got {
			<-slots
		}
		if got == 0 && (err == nil || errors.Is(err, nats.ErrTimeout)) {
			err = w.awaitJob(ctx, cons, slots, dispatch)
		}
		if err != nil && ctx.Err() == nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			w.log.Warn("fetch jobs", "err", err)
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return
			}
		}
	}
}

// awaitJob waits up to FetchWait for the next job, then for a slot to run it
// in (telling JetStream the job is in progress meanwhile, so it is not
// redelivered). A job still without a slot when the worker stops is handed
// back.
func (w *Worker) awaitJob(ctx context.Context, cons jetstream.Consumer, slots chan struct{}, dispatch func(jetstream.Msg)) error {
	fctx, cancel := context.WithTimeout(ctx, w.cfg.FetchWait)
	defer cancel()
	batch, err := cons.Fetch(1, jetstream.FetchContext(fctx))
	if err != nil {
		return err
	}
	for msg := range batch.Messages() {
		if !w.slotFor(ctx, msg, slots) {
			if err := msg.Nak(); err != nil {
				w.log.Debug("hand back a job not started", "err", err)
			}
			continue
		}
		dispatch(msg)
	}
	return batch.Error()
}

// slotFor takes a slot for msg, keeping msg in progress while it waits;
// false when ctx ends first.
func (w *Worker) slotFor(ctx context.Context, msg jetstream.Msg, slots chan struct{}) bool {
	select {
	case slots <- struct{}{}:
		return true
	default:
	}
	tick := time.NewTicker(max(w.cfg.Queue.AckWait/3, 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case slots <- struct{}{}:
			return true
		case <-tick.C:
			if err := msg.InProgress(); err != nil {
				w.log.Debug("keep a waiting job in progress", "err", err)
			}
		case <-ctx.Done():
			return false
		}
	}
}
