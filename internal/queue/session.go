package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Sessions pin a sandbox, and the Python globals in it, to one worker. The first
// job of a session goes to its pool; the worker that takes it records
// session → worker in the sessions bucket, and front-ends publish the session's
// later jobs on that worker's own subject (jobs.Subjects.WorkerJobs), which only
// that worker consumes. Before routing there, a front-end asks the worker whether
// it still holds the session (jobs.Subjects.WorkerSessions); when it does not
// (idle timeout, worker gone), the job ends with SessionGoneMessage.

// SessionTTL is how long a session's entry outlives its worker's last refresh.
// Workers refresh the entries of their live sessions every SessionTTL/3, so the
// entries of a worker that died vanish within SessionTTL (front-ends ask the
// worker before routing to it, so a stale entry costs no job). An ended session's
// entry stays as a tombstone for SessionTTL, so that its next job is told the
// session is gone rather than silently starting afresh.
const SessionTTL = 15 * time.Minute

// sessionAskTimeout bounds a front-end's question to a session's worker.
const sessionAskTimeout = 2 * time.Second

// ErrSessionGone says a job's session is no longer held by any worker.
var ErrSessionGone = errs.New(errs.NotFound, "session has expired or its worker is gone")

// SessionGoneMessage is the error of a job whose session is gone.
func SessionGoneMessage(session string) string {
	return fmt.Sprintf("session %s has expired or its worker is gone; start a new session "+
		"(calling again with this name starts it afresh, without the old globals)", session)
}

// SessionEntry is the value of a session's key in the sessions bucket.
type SessionEntry struct {
	Worker  string    `json:"worker"`
	Session string    `json:"session"`
	Since   time.Time `json:"since"`
	// Ended is set when the worker ended the session (idle timeout, worker
	// stop): the entry is a tombstone.
	Ended bool `json:"ended,omitempty"`
	// Proof is jobs.SessionProof of the session's key and Worker, under the
	// session's capability (which only the messages of the session's jobs
	// carry). Any worker host may write the bucket: an entry counts, for
	// routing, listing, ending and the namespace's session cap, only with
	// its proof.
	Proof string `json:"proof,omitempty"`
}

// Proven reports whether e, the entry of the session with key, carries its
// proof under the proxy key.
func (e *SessionEntry) Proven(proxyKey []byte, key string) bool {
	if len(proxyKey) == 0 {
		return false
	}
	return jobs.CheckSessionProof(jobs.SessionCapability(proxyKey, key), key, e.Worker, e.Proof)
}

// SessionKey is jobs.Subjects.SessionKey (the key does not depend on the
// subjects' prefix).
func SessionKey(namespace, session string) string {
	return jobs.Subjects{}.SessionKey(namespace, session)
}

// SessionsBucket creates or updates the sessions bucket and returns it.
func SessionsBucket(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.KeyValue, error) {
	return keyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      cfg.Subjects.SessionsBucket(),
		Description: "mcpexec sessions: which worker holds each",
		History:     1,
		TTL:         SessionTTL,
		MaxBytes:    sessionsMaxBytes,
		Storage:     jetstream.FileStorage,
		Replicas:    max(cfg.Replicas, 1),
	})
}

// WorkerJobsConsumer creates or updates the durable consumer of the jobs routed
// to one worker (its sessions' jobs). It is deleted by JetStream after an hour
// without the worker.
func WorkerJobsConsumer(ctx context.Context, js jetstream.JetStream, cfg Config, worker string) (jetstream.Consumer, error) {
	s := cfg.Subjects
	return jobConsumer(ctx, js, cfg, s.WorkerConsumer(worker), "mcpexec jobs routed to worker "+worker, s.WorkerJobs(worker), time.Hour)
}

// Route returns the subject job is to be published on: its pool's, or, for a
// job of a session a live worker holds, that worker's. It returns an error
// wrapping ErrSessionGone when the session's worker no longer holds it (and
// forgets the session, so that the next job of that name starts it afresh).
func (c *Client) Route(ctx context.Context, job *jobs.Job) (string, error) {
	pool := c.sub.LangJob(job.Pool, job.Lang())
	if job.Session == "" {
		return pool, nil
	}
	kv, err := c.js.KeyValue(ctx, c.sub.SessionsBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return pool, nil // a broker without sessions support: run it fresh
	}
	if err != nil {
		return "", fmt.Errorf("open sessions bucket: %w", err)
	}
	key := SessionKey(job.Namespace, job.Session)
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return pool, nil // the session's first job: whichever worker takes it keeps it
	}
	if err != nil {
		return "", fmt.Errorf("look up session %s: %w", job.Session, err)
	}
	proxyKey, _, err := c.proxyKey(ctx)
	if err != nil {
		return "", err
	}
	ent, err := DecodeSessionEntry(e.Value())
	if err != nil || !ent.Proven(proxyKey, key) {
		// Undecodable, or not written by a worker given a job of the
		// session (any worker host may write the bucket): as if there were
		// none. The worker holding the session, if one does, takes the job
		// from the pool and announces it again.
		_ = kv.Delete(ctx, key, jetstream.LastRevision(e.Revision())) // a stale entry expires by itself
		return pool, nil
	}
	if !ent.Ended && HoldsSession(ctx, c.nc, c.sub, ent.Worker, key) {
		return c.sub.WorkerJobs(ent.Worker), nil
	}
	_ = kv.Delete(ctx, key, jetstream.LastRevision(e.Revision())) // a stale entry expires by itself
	return "", fmt.Errorf("%w: %s", ErrSessionGone, SessionGoneMessage(job.Session))
}

// HoldsSession asks worker whether it holds the session with key; no answer
// (or one that does not decode) means no.
func HoldsSession(ctx context.Context, nc *nats.Conn, s jobs.Subjects, worker, key string) bool {
	return askSession(ctx, nc, s, worker, SessionRequest{Key: key}) == SessionHeld
}

// EndSession asks worker to end the session with key and reports whether it
// did (false: it did not hold it, or did not answer).
func EndSession(ctx context.Context, nc *nats.Conn, s jobs.Subjects, worker, key string) bool {
	return askSession(ctx, nc, s, worker, SessionRequest{Key: key, End: true}) == SessionEnded
}

// askSession sends worker r and returns its answer: SessionGone when it
// does not answer, or answers what does not decode.
func askSession(ctx context.Context, nc *nats.Conn, s jobs.Subjects, worker string, r SessionRequest) SessionAnswer {
	ctx, cancel := context.WithTimeout(ctx, sessionAskTimeout)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, s.WorkerSessions(worker), r.Encode())
	if err != nil {
		return SessionGone
	}
	a, err := DecodeSessionAnswer(msg.Data)
	if err != nil {
		return SessionGone
	}
	return a
}

// ForwardSessionJob hands a session's job, delivered from the pool to a
// worker that does not hold the session, to worker, which does: the message
// goes on as the front-end signed it (same bytes, same signature and trace
// headers), so the holder verifies it as any delivery. A forward repeated
// after a lost acknowledgement is deduplicated.
func ForwardSessionJob(ctx context.Context, js jetstream.JetStream, s jobs.Subjects, worker, job string, msg jetstream.Msg) error {
	m := nats.NewMsg(s.WorkerJobs(worker))
	m.Data = msg.Data()
	for _, h := range []string{jobs.SignatureHeader, jobs.TraceHeader} {
		if v := msg.Headers().Get(h); v != "" {
			m.Header.Set(h, v)
		}
	}
	if _, err := js.PublishMsg(ctx, m, jetstream.WithMsgID(s.SessionJobMsgID(job))); err != nil {
		return fmt.Errorf("forward session job %s to %s: %w", job, worker, err)
	}
	return nil
}

// route is Route for SubmitMany. done reports that the job must not be
// enqueued: its session is gone and its terminal record was written (err says
// when writing it failed), or it could not be routed (err).
func (c *Client) route(ctx context.Context, job *jobs.Job) (subject string, done bool, err error) {
	subject, err = c.Route(ctx, job)
	if err == nil {
		return subject, false, nil
	}
	if !errors.Is(err, ErrSessionGone) {
		return "", true, fmt.Errorf("route job %s: %w", job.ID, err)
	}
	ev := jobs.Event{Job: job.ID, Kind: jobs.EventFinished, Result: &jobs.Result{
		Status: jobs.StatusError, ExitCode: -1, Error: SessionGoneMessage(job.Session),
	}}
	if perr := c.PublishEvent(ctx, ev); perr != nil {
		return "", true, fmt.Errorf("record that the session of job %s is gone: %w", job.ID, perr)
	}
	return "", true, nil
}

// keyValue creates or updates the key-value bucket of kc and returns it.
func keyValue(ctx context.Context, js jetstream.JetStream, kc jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, kc)
	if err != nil {
		return nil, fmt.Errorf("create key-value bucket %s: %w", kc.Bucket, err)
	}
	return kv, nil
}
