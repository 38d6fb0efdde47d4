package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// Session defaults (DESIGN.md §7).
const (
	DefaultSessionIdle = 300 * time.Second
	DefaultMaxSessions = 16
)

// sessionTable holds the sessions this worker keeps (see package queue for the
// routing). The sandbox runtime keeps each session's sandbox; the table tracks
// use, announces the sessions in the sessions bucket, answers front-ends' "do
// you hold it?" and ends sessions left idle.
type sessionTable struct {
	w    *Worker
	rt   sandbox.SessionRuntime // nil: the runtime keeps no sessions
	kv   jetstream.KeyValue
	idle time.Duration
	max  int

	sub  *nats.Subscription
	stop chan struct{} // closed by close
	done chan struct{} // closed when the janitor returns
	once sync.Once     // guards the shutdown

	mu   sync.Mutex // guards held
	held map[string]*heldSession
}

// heldSession is one session this worker holds.
type heldSession struct {
	name     string    // the session as jobs name it
	since    time.Time // when this worker took it
	lastUsed time.Time // when its last job ended
	busy     int       // its jobs admitted and not yet released
	fresh    bool      // no job has run in it yet
	proof    string    // the proof of its entry (queue.SessionEntry.Proof)
}

// openSessions opens the sessions bucket and creates this worker's
// routed-jobs consumer; an error of a bucket or stream the broker has not
// created yet is notReady.
func (w *Worker) openSessions(ctx context.Context) (jetstream.Consumer, error) {
	st := &sessionTable{w: w, idle: w.cfg.SessionIdle, max: w.cfg.MaxSessions,
		stop: make(chan struct{}), done: make(chan struct{}), held: map[string]*heldSession{}}
	if st.idle <= 0 {
		st.idle = DefaultSessionIdle
	}
	if st.max <= 0 {
		st.max = DefaultMaxSessions
	}
	st.rt, _ = w.rt.(sandbox.SessionRuntime)
	// Opened, not created: the broker creates it (a worker may not administer
	// streams).
	bucket := w.cfg.Queue.Subjects.SessionsBucket()
	kv, err := w.client.JetStream().KeyValue(ctx, bucket)
	if err != nil {
		return nil, needs("the sessions bucket "+bucket, fmt.Errorf("open sessions bucket %s (is the broker up to date?): %w", bucket, err))
	}
	st.kv = kv
	lookups := w.client.Subjects().WorkerSessions(w.cfg.ID)
	st.sub, err = w.nc.Subscribe(lookups, st.answer)
	if err != nil {
		return nil, fmt.Errorf("answer session look-ups: %w", err)
	}
	// A named worker identity may answer only as its own worker id: say so
	// rather than run without answering (every session would seem gone).
	if w.nc.FlushTimeout(5*time.Second) == nil {
		if err := w.nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+lookups+`"`) {
			_ = st.sub.Unsubscribe() // refused by the server anyway
			return nil, fmt.Errorf("worker %s may not answer session look-ups on %s: its NATS identity is another worker's "+
				"(a `broker auth add worker NAME` identity runs only as --id NAME): %w", w.cfg.ID, lookups, err)
		}
	}
	cons, err := queue.WorkerJobsConsumer(ctx, w.client.JetStream(), w.cfg.Queue, w.cfg.ID)
	if err != nil {
		_ = st.sub.Unsubscribe() // the start fails (or waits): its error is the one to report
		return nil, needs("the jobs stream "+w.cfg.Queue.Subjects.JobsStream(), err)
	}
	w.sess = st
	return cons, nil
}

// dropSessions undoes openSessions for a Start that failed after it: the
// session look-up subscription would otherwise outlive the worker.
func (w *Worker) dropSessions() {
	if w.sess == nil {
		return
	}
	_ = w.sess.sub.Unsubscribe() // the start failed: its error is the one to report
	w.sess = nil
}

// startSessions starts taking the jobs routed to this worker, and the janitor.
func (w *Worker) startSessions(loopCtx, jobsCtx context.Context, cons jetstream.Consumer) {
	w.loop.Add(1)
	go func() {
		defer w.loop.Done()
		w.fetchLoop(loopCtx, jobsCtx, cons, make(chan struct{}, w.cfg.Slots)) // slots of their own, as sessions always had
	}()
	go w.sess.janitor()
}

// answer replies to a front-end's queue.SessionRequest: whether this worker
// holds a session, or, asked to end one, ending it (a job of it that is
// running finishes first; the session's next job is told it ended). A
// request that does not decode is answered queue.SessionGone.
func (st *sessionTable) answer(m *nats.Msg) {
	reply := queue.SessionGone
	defer func() { _ = m.Respond([]byte(reply)) }() // the asker may be gone
	r, err := queue.DecodeSessionRequest(m.Data)
	if err != nil {
		st.w.log.Warn("refusing a session look-up", "err", err)
		return
	}
	st.mu.Lock()
	_, ok := st.held[r.Key]
	st.mu.Unlock()
	if !ok {
		return
	}
	reply = queue.SessionHeld
	if r.End {
		st.w.log.Info("ending session on request", "session", r.Key)
		st.forget(context.Background(), r.Key, true)
		reply = queue.SessionEnded
	}
}

// admit decides whether this worker runs a job of a session. When it does
// not, it returns the outcome of the delivery (refused, with the reason;
// forwarded to the worker holding the session; or transient) and false. A
// true return must be paired with releaseSession.
func (w *Worker) admit(ctx context.Context, d *delivery) (outcomeKind, error, bool) {
	job := &d.job
	st := w.sess
	fail := func(text string) (outcomeKind, error, bool) { return refused, errors.New(text), false }
	if st == nil || st.rt == nil {
		return fail(fmt.Sprintf("worker %s cannot keep sessions (its sandbox runtime has none): run the job without a session", w.cfg.ID))
	}
	key := queue.SessionKey(job.Namespace, job.Session)
	proof := ""
	if d.sessionCapability != "" {
		proof = jobs.SessionProof(d.sessionCapability, key, w.cfg.ID)
	}
	now := time.Now()
	st.mu.Lock()
	if h := st.held[key]; h != nil {
		h.busy++
		h.lastUsed = now
		if h.proof == "" {
			h.proof = proof
		}
		ent := queue.SessionEntry{Worker: w.cfg.ID, Session: h.name, Since: h.since.UTC(), Proof: h.proof}
		st.mu.Unlock()
		if d.msg.Subject() != w.client.Subjects().WorkerJobs(w.cfg.ID) {
			// From the pool: the front-end found no entry it could trust
			// (expired, or overwritten by another worker host): put it back.
			st.announce(ctx, key, ent)
		}
		return 0, nil, true
	}
	st.mu.Unlock()
	if d.msg.Subject() == w.client.Subjects().WorkerJobs(w.cfg.ID) {
		// Routed here for a session this worker (or its previous life) no
		// longer holds.
		st.forget(ctx, key, false)
		return fail(queue.SessionGoneMessage(job.Session))
	}
	// From the pool: the session's first job, or a race with another worker.
	for range 2 {
		e, err := st.kv.Get(ctx, key)
		if err == nil {
			// Any worker host may write the bucket: forward only to a worker
			// the entry proves was given a job of the session.
			ent, derr := queue.DecodeSessionEntry(e.Value())
			if derr == nil && ent.Worker != w.cfg.ID && !ent.Ended &&
				jobs.CheckSessionProof(d.sessionCapability, key, ent.Worker, ent.Proof) &&
				queue.HoldsSession(ctx, w.nc, w.client.Subjects(), ent.Worker, key) {
				if err := w.forward(ctx, d, ent.Worker); err != nil {
					return transient, err, false
				}
				return forwarded, nil, false
			}
			if err := st.kv.Delete(ctx, key, jetstream.LastRevision(e.Revision())); err != nil {
				w.log.Warn("drop a stale session entry", "job", job.ID, "session", job.Session, "err", err)
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			w.log.Warn("look up session", "job", job.ID, "session", job.Session, "err", err)
		}
		st.mu.Lock()
		if len(st.held) >= st.max {
			st.mu.Unlock()
			return fail(fmt.Sprintf("worker %s already holds its maximum of %d sessions: retry when one has ended "+
				"(sessions end after %s idle), run the job without a session, or add workers", w.cfg.ID, st.max, st.idle))
		}
		st.held[key] = &heldSession{name: job.Session, since: now, lastUsed: now, busy: 1, fresh: true, proof: proof}
		st.mu.Unlock()
		data, err := queue.SessionEntry{Worker: w.cfg.ID, Session: job.Session, Since: now.UTC(), Proof: proof}.Encode()
		if err == nil {
			_, err = st.kv.Create(ctx, key, data)
		}
		if err == nil || !errors.Is(err, jetstream.ErrKeyExists) {
			if err != nil {
				w.log.Warn("announce session", "job", job.ID, "session", job.Session, "err", err)
			}
			return 0, nil, true
		}
		// Another worker took the session meanwhile: run it there.
		st.mu.Lock()
		delete(st.held, key)
		st.mu.Unlock()
	}
	return fail(fmt.Sprintf("session %s is being started by several workers at once: retry", job.Session))
}

// forward hands a pool-delivered job of a session to the worker holding it.
func (w *Worker) forward(ctx context.Context, d *delivery, worker string) error {
	if err := queue.ForwardSessionJob(ctx, w.client.JetStream(), w.client.Subjects(), worker, d.job.ID, d.msg); err != nil {
		return err
	}
	// Durable before the pool's message is acknowledged.
	if err := w.client.Sync(ctx); err != nil {
		return fmt.Errorf("forward session job %s to %s: %w", d.job.ID, worker, err)
	}
	w.log.Debug("forwarded session job", "job", d.job.ID, "session", d.job.Session, "to", worker)
	return nil
}

// releaseSession ends what admit began.
func (w *Worker) releaseSession(job *jobs.Job) {
	key := queue.SessionKey(job.Namespace, job.Session)
	st := w.sess
	st.mu.Lock()
	defer st.mu.Unlock()
	if h := st.held[key]; h != nil {
		h.busy--
		h.lastUsed = time.Now()
	}
}

// runSandbox runs a job: in its session's sandbox when it names one, else in a
// fresh one.
func (w *Worker) runSandbox(ctx context.Context, job *jobs.Job, sj sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	if job.Session == "" || w.sess == nil || w.sess.rt == nil {
		return w.rt.Run(ctx, sj, host)
	}
	st := w.sess
	key := queue.SessionKey(job.Namespace, job.Session)
	st.mu.Lock()
	h := st.held[key]
	fresh := h != nil && h.fresh
	if h != nil {
		h.fresh = false
	}
	st.mu.Unlock()
	if !fresh && !st.rt.HasSession(key) {
		// Its sandbox ended (a timeout or crash of an earlier job) while this
		// job waited: do not start a blank one behind the caller's back.
		st.forget(context.WithoutCancel(ctx), key, false)
		return sandbox.Result{Status: sandbox.StatusError, ExitCode: -1, Error: queue.SessionGoneMessage(job.Session)}, nil
	}
	res, err := st.rt.RunInSession(ctx, key, sj, host)
	if !st.rt.HasSession(key) {
		st.forget(context.WithoutCancel(ctx), key, false)
		if err == nil {
			note := fmt.Sprintf("session %s ended with this job (its sandbox could not go on); the next call with this name starts it afresh", job.Session)
			if res.Error == "" {
				res.Error = note
			} else {
				res.Error += "; " + note
			}
		}
	}
	return res, err
}

// forget drops a session from the table, the runtime and the bucket. With
// tombstone, the bucket keeps an ended entry so the session's next job is told
// it is gone; without, the next job starts the session afresh.
func (st *sessionTable) forget(ctx context.Context, key string, tombstone bool) {
	st.mu.Lock()
	delete(st.held, key)
	st.mu.Unlock()
	if st.rt != nil {
		if err := st.rt.EndSession(key); err != nil {
			st.w.log.Warn("end session", "session", key, "err", err)
		}
	}
	st.unannounce(ctx, key, tombstone)
}

// unannounce deletes key from the bucket, or marks it ended, if it still names
// this worker.
func (st *sessionTable) unannounce(ctx context.Context, key string, tombstone bool) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e, err := st.kv.Get(ctx, key)
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			st.w.log.Warn("read the session's entry to end it (it expires by itself)", "session", key, "err", err)
		}
		return
	}
	ent, err := queue.DecodeSessionEntry(e.Value())
	if err != nil || ent.Worker != st.w.cfg.ID {
		return
	}
	if !tombstone {
		// A revision that moved on means another worker holds the session now.
		if err := st.kv.Delete(ctx, key, jetstream.LastRevision(e.Revision())); err != nil {
			st.w.log.Warn("remove the session's entry (it expires by itself)", "session", key, "err", err)
		}
		return
	}
	ent.Ended = true
	data, err := ent.Encode()
	if err == nil {
		_, err = st.kv.Update(ctx, key, data, e.Revision())
	}
	if err != nil {
		st.w.log.Warn("mark the session ended (its next job may wait for it to expire)", "session", key, "err", err)
	}
}

// janitor ends idle sessions and keeps the bucket's entries of the others alive.
func (st *sessionTable) janitor() {
	defer close(st.done)
	sweep := time.NewTicker(min(max(st.idle/4, 50*time.Millisecond), 5*time.Second))
	defer sweep.Stop()
	refresh := time.NewTicker(queue.SessionTTL / 3)
	defer refresh.Stop()
	ctx := context.Background()
	for {
		select {
		case <-st.stop:
			return
		case now := <-sweep.C:
			var idle []string
			st.mu.Lock()
			for key, h := range st.held {
				if h.busy == 0 && now.Sub(h.lastUsed) >= st.idle {
					idle = append(idle, key)
				}
			}
			st.mu.Unlock()
			for _, key := range idle {
				st.w.log.Info("session idle: ending it", "session", key, "idle", st.idle)
				st.forget(ctx, key, true)
			}
		case <-refresh.C:
			st.mu.Lock()
			entries := map[string]queue.SessionEntry{}
			for key, h := range st.held {
				entries[key] = queue.SessionEntry{Worker: st.w.cfg.ID, Session: h.name, Since: h.since.UTC(), Proof: h.proof}
			}
			st.mu.Unlock()
			for key, ent := range entries {
				st.announce(ctx, key, ent)
			}
		}
	}
}

// announce puts ent, this worker's entry of a session it holds, in the bucket.
func (st *sessionTable) announce(ctx context.Context, key string, ent queue.SessionEntry) {
	data, err := ent.Encode()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err == nil {
		_, err = st.kv.Put(ctx, key, data)
	}
	if err != nil {
		st.w.log.Warn("announce session", "session", key, "err", err)
	}
}

// closeSessions ends every session: called by Stop once no job runs.
func (w *Worker) closeSessions() {
	st := w.sess
	if st == nil {
		return
	}
	st.once.Do(func() {
		close(st.stop)
		_ = st.sub.Unsubscribe() // a closed connection has no subscription left
		// The janitor's bucket calls have deadlines: wait for it, and say so
		// when it takes long.
		select {
		case <-st.done:
		case <-time.After(10 * time.Second):
			w.log.Warn("waiting for the session janitor to stop")
			<-st.done
		}
		st.mu.Lock()
		keys := make([]string, 0, len(st.held))
		for key := range st.held {
			keys = append(keys, key)
		}
		st.mu.Unlock()
		for _, key := range keys {
			st.forget(context.Background(), key, true)
		}
	})
}
