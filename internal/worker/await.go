package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/queue"
)

// Waits of a start whose broker is not ready yet: the first, doubling up to
// the longest; and how long one attempt may take.
const (
	brokerFirstWait      = 250 * time.Millisecond
	brokerMaxWait        = 5 * time.Second
	brokerAttemptTimeout = 5 * time.Second
)

// notReady is an error of a start step whose stream, bucket or JetStream is
// not there yet: what names it.
type notReady struct {
	what string
	err  error
}

func (e *notReady) Error() string { return e.err.Error() }
func (e *notReady) Unwrap() error { return e.err }

// needs wraps err, an error of the step that needs what, as notReady when the
// broker may still be creating it (a stream or bucket not found, JetStream
// not answering or electing leaders); other errors are returned as they are.
func needs(what string, err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrBucketNotFound):
		return &notReady{what: what, err: err}
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), queue.Transient(err):
		return &notReady{what: "JetStream (the broker is starting, or its cluster electing leaders)", err: err}
	}
	return err
}

// awaitBroker runs open until it succeeds, or fails with an error other than
// notReady, or ctx ends. While the broker is still creating what open needs
// (a worker started with, or before, its broker), it waits 250 ms, doubling up
// to 5 s, and says each time what it waits for. A permission violation that
// the broker reported during an attempt (its request then only times out)
// fails at once.
func (w *Worker) awaitBroker(ctx context.Context, open func(context.Context) error) error {
	delay := brokerFirstWait
	start := time.Now()
	for attempt := 1; ; attempt++ {
		before := w.nc.LastError()
		err := w.attempt(ctx, before, open)
		if err == nil {
			if attempt > 1 {
				w.log.Info("the broker is ready", "waited", time.Since(start).Round(time.Millisecond).String(), "attempts", attempt)
			}
			return nil
		}
		if permissionRefused(w.nc, before) {
			// err is the attempt's cancellation: the violation says what was refused.
			return fmt.Errorf("the broker refused the worker: %w; check the worker's NATS credentials and the broker's permissions for them (`broker auth init` writes a worker's)", w.nc.LastError())
		}
		var nr *notReady
		if !errors.As(err, &nr) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("gave up waiting for %s after %s: %w", nr.what, time.Since(start).Round(time.Millisecond), err)
		}
		w.log.Warn("waiting for the broker: "+nr.what+" is not there yet", "err", err, "retry_in", delay.String(), "attempt", attempt,
			"fix", "start the mcpexec broker (`broker`) of this version on the NATS the worker uses: it creates the streams and buckets")
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("gave up waiting for %s after %s: %w", nr.what, time.Since(start).Round(time.Millisecond), err)
		}
		delay = min(2*delay, brokerMaxWait)
	}
}

// attempt runs open for at most brokerAttemptTimeout, and ends it as soon as
// the connection reports a permission violation newer than before: a request
// the broker refused is never answered, and would only time out.
func (w *Worker) attempt(ctx context.Context, before error, open func(context.Context) error) error {
	actx, cancel := context.WithTimeout(ctx, brokerAttemptTimeout)
	defer cancel()
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if permissionRefused(w.nc, before) {
					cancel()
					return
				}
			}
		}
	}()
	err := open(actx)
	close(stop)
	<-watched
	return err
}

// permissionRefused reports whether nc's last error is a permission violation other
// than before.
func permissionRefused(nc *nats.Conn, before error) bool {
	last := nc.LastError()
	// Identity, not kind: a violation that arrived since before, not the
	// same one seen again.
	return last != before && errors.Is(last, nats.ErrPermissionViolation) //nolint:errorlint // identity is meant

}
