package queue

// Submissions and releases: a job's submitted (or released) event claims it
// once, then its message is enqueued.

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// ErrDuplicate is returned by Submit for a job id that was submitted before
// (within the events stream's retention): nothing is enqueued again.
var ErrDuplicate = errs.New(errs.Conflict, "a job with this id was already submitted")

// submitChunk bounds the asynchronous publishes in flight of one SubmitMany.
const submitChunk = 1024

// Submit records the submission of job, which must be normalised, and enqueues
// it. See SubmitMany.
func (c *Client) Submit(ctx context.Context, job *jobs.Job) error {
	return c.SubmitMany(ctx, []*jobs.Job{job})[0]
}

// SubmitMany records the submission of each job (which must be normalised) and
// enqueues it, pipelining the publishes. It returns one error per job: nil when
// the job was enqueued; ErrDuplicate when its id was submitted before (the
// submitted event claims the id in the events stream, so this holds beyond the
// jobs stream's dedupe window too); ErrQueueFull when the jobs stream is full, in
// which case the job is recorded as rejected; any other error when the broker
// could not be reached — submitting again is then safe.
//
// While the cluster fails over, SubmitMany retries the jobs whose submission
// failed transiently, for up to Patience: a retry of a job whose claim landed
// finds its own claim and repairs the enqueue, so nothing is submitted twice.
func (c *Client) SubmitMany(ctx context.Context, js []*jobs.Job) []error {
	errs := make([]error, len(js))
	c.submitAll(ctx, js, errs)
	patience := c.Patience
	if patience <= 0 {
		patience = DefaultPatience
	}
	deadline := time.Now().Add(patience)
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		var idx []int
		for i, err := range errs {
			if Transient(err) {
				idx = append(idx, i)
			}
		}
		if len(idx) == 0 || time.Now().Add(delay).After(deadline) {
			return errs
		}
		select {
		case <-ctx.Done():
			return errs
		case <-time.After(delay):
		}
		again := make([]*jobs.Job, len(idx))
		for k, i := range idx {
			again[k] = js[i]
		}
		aerrs := make([]error, len(again))
		c.submitAll(ctx, again, aerrs)
		for k, i := range idx {
			if errors.Is(aerrs[k], ErrDuplicate) {
				aerrs[k] = nil // the failed attempt's claim landed; this one enqueued
			}
			errs[i] = aerrs[k]
		}
	}
}

func (c *Client) submitAll(ctx context.Context, js []*jobs.Job, errs []error) {
	c.claimAll(ctx, js, errs, jobs.EventSubmitted)
}

// ReleaseMany enqueues waiting jobs whose parents have ended as they need
// (jobs, as recorded). The released event claims each job's release once,
// as the submitted event claims its id: it returns nil for a job it
// enqueued, ErrDuplicate for one released before (whose enqueue it repairs
// when the first releaser may have died before it), ErrQueueFull (the job
// is recorded as rejected), or another error when the broker could not be
// reached: releasing again is then safe.
func (c *Client) ReleaseMany(ctx context.Context, js []*jobs.Job) []error {
	errs := make([]error, len(js))
	c.claimAll(ctx, js, errs, jobs.EventReleased)
	return errs
}

func (c *Client) claimAll(ctx context.Context, js []*jobs.Job, errs []error, kind jobs.EventKind) {
	for lo := 0; lo < len(js); lo += submitChunk {
		hi := min(lo+submitChunk, len(js))
		c.claimChunk(ctx, js[lo:hi], errs[lo:hi], kind)
	}
}

// claimChunk claims each job's event of kind (submitted or released) and
// enqueues the jobs it claimed, except submitted jobs that wait for parents.
func (c *Client) claimChunk(ctx context.Context, js []*jobs.Job, errs []error, kind jobs.EventKind) {
	key, sign, err := c.proxyKey(ctx)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return
	}
	// 1. Claim each id: the event is stored only if its subject is empty.
	// The claims go in atomic batches (one sync for many); a batch holding
	// a duplicate is refused whole, and its claims are then made one by one.
	var claims []*nats.Msg
	var claimOf []int // claims[k] is js[claimOf[k]]'s
	for i, job := range js {
		ev := &jobs.Event{Job: job.ID, Kind: kind}
		if kind == jobs.EventSubmitted {
			ev.Spec, ev.At = job, job.SubmittedAt
		}
		m, err := c.eventMsg(ev, job.Trace())
		if err != nil {
			errs[i] = fmt.Errorf("record %s of %s: %w", kind, job.ID, err)
			continue
		}
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
		claims, claimOf = append(claims, m), append(claimOf, i)
	}
	claimSeqs := make([]uint64, len(js))
	stored := c.events.publishAllStored(ctx, claims)
	// The claims' barrier runs beside the enqueue: a claim is stored (its
	// condition checked, its sequence known) before its job is enqueued,
	// and the submission succeeds only once both are durable. A power cut
	// between the two barriers may keep a job message whose claim it lost:
	// its first delivery's start, made on the claim (StartAfter.ClaimSeq),
	// is refused, and the redelivery runs it on its history. Waiting for
	// the claim's barrier first cost every job one fsync in series (0.4-0.6
	// ms here) before a worker could have it.
	synced := slices.Clone(stored)
	syncDone := make(chan struct{})
	go func() {
		defer close(syncDone)
		c.events.sync(ctx, synced)
	}()
	defer func() {
		<-syncDone
		for k, r := range synced {
			if i := claimOf[k]; r.err != nil && stored[k].err == nil && errs[i] == nil {
				errs[i] = fmt.Errorf("record %s of %s: %w", kind, js[i].ID, r.err)
			}
		}
	}()
	for k, r := range stored {
		i := claimOf[k]
		if r.err == nil {
			c.sawEvent(r.seq)
		}
		if r.err == nil && !r.dup && kind == jobs.EventSubmitted {
			claimSeqs[i] = r.seq
		}
		switch {
		case isWrongLastSeq(r.err) || (r.err == nil && r.dup):
			errs[i] = ErrDuplicate
		case r.err != nil:
			errs[i] = fmt.Errorf("record %s of %s: %w", kind, js[i].ID, r.err)
		}
	}
	// 2. Enqueue the claimed jobs, and repair a duplicate whose first claimer
	// may have died between claim and enqueue (the jobs stream deduplicates).
	// A submitted job that waits for parents is enqueued by its release.
	enqueue := make([]bool, len(js))
	for i, job := range js {
		if kind == jobs.EventSubmitted && job.Waits() {
			continue
		}
		if errs[i] != nil {
			if !errors.Is(errs[i], ErrDuplicate) {
				continue
			}
			repair, err := c.mayBeUnqueued(ctx, job.ID, kind)
			if err != nil {
				// Whether its message is queued is unknown: taking the
				// duplicate for done would acknowledge a job no worker sees.
				errs[i] = fmt.Errorf("%w: job %s: %w", errUnsure, job.ID, err)
				continue
			}
			if !repair {
				continue
			}
		}
		enqueue[i] = true
	}
	c.enqueue(ctx, key, sign, js, enqueue, claimSeqs, errs)
}

// Requeue publishes again the message of each job (as recorded: normalised,
// claimed, and not waiting for parents), for jobs whose message the jobs
// stream lost: after a broker replaced a jobs stream no replica would lead
// (docs/design.md, "A stream no replica will lead"). The message is the one
// the submission published, under the same Nats-Msg-Id, so a job requeued
// twice within the dedupe window is queued once; a worker that gets a job
// already started or ended finds it in the job's history. It returns one
// error per job, as SubmitMany's second step does.
func (c *Client) Requeue(ctx context.Context, js []*jobs.Job) []error {
	errs := make([]error, len(js))
	key, sign, err := c.proxyKey(ctx)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	enqueue := make([]bool, len(js))
	for i := range enqueue {
		enqueue[i] = true
	}
	for lo := 0; lo < len(js); lo += submitChunk {
		hi := min(lo+submitChunk, len(js))
		c.enqueue(ctx, key, sign, js[lo:hi], enqueue[lo:hi], nil, errs[lo:hi])
	}
	return errs
}

// enqueue publishes the message of each js[i] with enqueue[i], signed with
// sign and carrying the capability of key and claimSeqs[i] (when claimSeqs
// is not nil), and sets errs[i] when that fails.
// errs[i] may already hold ErrDuplicate (a repaired duplicate claim): a
// failed republish then makes it errUnsure.
func (c *Client) enqueue(ctx context.Context, key []byte, sign ed25519.PrivateKey, js []*jobs.Job, enqueue []bool, claimSeqs []uint64, errs []error) {
	var enq []*nats.Msg
	var enqOf []int // enq[k] is js[enqOf[k]]'s
	for i, job := range js {
		if !enqueue[i] {
			continue
		}
		subject, done, rerr := c.route(ctx, job)
		if done {
			errs[i] = rerr
			continue
		}
		msg := NewMessage(key, job)
		if claimSeqs != nil {
			msg.ClaimSeq = claimSeqs[i]
		}
		data, err := msg.Encode()
		if err != nil {
			if errs[i] == nil {
				errs[i] = fmt.Errorf("publish job %s: %w", job.ID, err)
			}
			continue
		}
		m := nats.NewMsg(subject)
		m.Data = data
		m.Header.Set(jobs.TraceHeader, job.Trace())
		m.Header.Set(jetstream.MsgIDHeader, c.sub.JobMsgID(job.ID))
		SignMessage(m, sign)
		enq, enqOf = append(enq, m), append(enqOf, i)
	}
	var rejects []jetstream.PubAckFuture
	for k, r := range c.jobs.publishAll(ctx, enq) {
		i, err := enqOf[k], r.err
		if err == nil {
			continue
		}
		if errors.Is(errs[i], ErrDuplicate) {
			errs[i] = fmt.Errorf("%w: republish job %s: %w", errUnsure, js[i].ID, err)
			continue
		}
		if !isFull(err) {
			errs[i] = fmt.Errorf("publish job %s: %w", js[i].ID, err)
			continue
		}
		errs[i] = ErrQueueFull
		m, merr := c.eventMsg(&jobs.Event{Job: js[i].ID, Kind: jobs.EventFinished, Result: &jobs.Result{
			Status: jobs.StatusRejected,
			Error:  "the job queue is full: retry later with a new id, or add workers",
		}}, js[i].Trace())
		if merr == nil {
			var rf jetstream.PubAckFuture
			if rf, merr = c.js.PublishMsgAsync(m); merr == nil {
				rejects = append(rejects, rf)
			}
		}
		if merr != nil {
			errs[i] = fmt.Errorf("%w (and recording the rejection failed: %w)", ErrQueueFull, merr)
		}
	}
	for _, f := range rejects {
		_, _ = waitAck(ctx, f) // the rejection is deduplicated by id if republished
	}
}

// errUnsure is the error of a duplicate claim whose job may not be queued:
// checking, or republishing its message, failed. Submitting again is safe
// (and needed): it is transient.
var errUnsure = errors.New("the job was claimed before, and whether its message is queued could not be checked")

// mayBeUnqueued reports whether a duplicate claim (of kind) of id should
// republish the job message: the first claim is recent enough for the jobs
// stream to deduplicate the republish, and the job has not already finished or
// been rejected. It returns an error when the events stream could not tell.
//
// It reads through the events stream's leader, never by direct get: any
// replica answers a direct get, and one lagging behind (a node just cut off
// by a partition) says the claim is not there, which taken for "nothing to
// repair" acknowledged a job that was never queued (the fault suite's
// partition of the jobs leader found it). A claim the leader has not got
// either, although the claim was refused as a duplicate, is an error too:
// the caller retries, as for any answer it cannot trust.
func (c *Client) mayBeUnqueued(ctx context.Context, id string, kind jobs.EventKind) (bool, error) {
	window := c.DedupeWindow
	if window == 0 {
		window = DefaultConfig().DedupeWindow
	}
	claimed, found, err := c.leaderLastEvent(ctx, id, kind)
	if err != nil {
		return false, err
	}
	if !found {
		return false, fmt.Errorf("the %s event of %s was refused as a duplicate but the events stream's leader does not hold it yet", kind, id)
	}
	if time.Since(claimed) > window*9/10 {
		return false, nil
	}
	for _, k := range []jobs.EventKind{jobs.EventFinished, jobs.EventCancelled} {
		_, found, err := c.leaderLastEvent(ctx, id, k)
		if err != nil {
			return false, err
		}
		if found {
			return false, nil
		}
	}
	return true, nil
}

// leaderLastEvent reads the time of job id's last event of kind through the
// events stream's leader (lastEvent, for workers' look-ups, reads by direct
// get); found is false when there is none.
func (c *Client) leaderLastEvent(ctx context.Context, id string, kind jobs.EventKind) (at time.Time, found bool, err error) {
	req, err := json.Marshal(map[string]string{"last_by_subj": c.sub.Event(id, kind)})
	if err != nil {
		return time.Time{}, false, err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := c.nc.RequestWithContext(rctx, c.sub.MsgGet(c.sub.EventsStream()), req)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("look up the %s event of %s: %w", kind, id, err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Time time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return time.Time{}, false, fmt.Errorf("look up the %s event of %s: undecodable answer: %w", kind, id, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return time.Time{}, false, nil
	case resp.Error != nil:
		return time.Time{}, false, fmt.Errorf("look up the %s event of %s: %w", kind, id, resp.Error)
	case resp.Message == nil:
		return time.Time{}, false, fmt.Errorf("look up the %s event of %s: an answer without a message", kind, id)
	}
	return resp.Message.Time, true, nil
}

func waitAck(ctx context.Context, f jetstream.PubAckFuture) (*jetstream.PubAck, error) {
	select {
	case ack := <-f.Ok():
		return ack, nil
	case err := <-f.Err():
		return nil, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return err != nil && strings.Contains(err.Error(), "wrong last sequence")
}

func isFull(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "maximum messages exceeded") || strings.Contains(msg, "maximum bytes exceeded")
}
