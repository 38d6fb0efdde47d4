// Package auditlog writes a front-end's audit entries (package audit) to the
// audit stream, off the proxied call's path: a call hands its entry to a
// bounded queue and goes on; one goroutine digests the arguments, signs the
// entry with the audit key and publishes it: the entries of a namespace
// gathered within Config.Linger go in one message, a JSON object a line. Entries are
// never dropped silently: a full queue makes the call wait (up to
// Config.Block), and an entry that could not be queued or published after
// its retries is logged at ERROR and counted (Dropped).
package auditlog

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Config configures a Writer.
type Config struct {
	Subjects jobs.Subjects
	Logger   *slog.Logger
	// Queue is how many entries may wait to be published (default
	// DefaultQueue); Block how long a call waits for room in a full queue
	// before its entry is dropped, logged and counted (default DefaultBlock).
	Queue int
	Block time.Duration
	// Attempts is how many times an entry is published before it is
	// dropped, logged and counted (default DefaultAttempts, a second apart
	// and more).
	Attempts int
	// Linger is how long entries are gathered before they are published
	// (default DefaultLinger): an entry is in the stream within about
	// Linger of its call's end.
	Linger time.Duration
}

// Defaults of Config.
const (
	DefaultQueue    = 4096
	DefaultBlock    = 5 * time.Second
	DefaultAttempts = 5
	// DefaultLinger is how long the writer gathers entries before it
	// publishes them: calls in quick succession share a message, and the
	// replicas a commit.
	DefaultLinger = 100 * time.Millisecond
	// batch bounds the entries of one gathering, maxMessage a message.
	batch      = 256
	maxMessage = 1 << 20
	// ackWait bounds the wait for a batch's acknowledgements.
	ackWait = 10 * time.Second
)

// Call is a proxied call's entry before it is digested: its arguments are
// digested and redacted by the writer's goroutine, not on the call's path.
type Call struct {
	Entry    audit.Entry
	Args     map[string]any // never changed by the writer
	Redactor *audit.Redactor
}

// Writer publishes audit entries. Start it with the fleet's proxy key;
// Stop publishes what is queued (within Block) and stops.
type Writer struct {
	cfg Config
	log *slog.Logger
	js  jetstream.JetStream
	// durable makes stored entries durable (the brokers' barrier, where
	// they need one).
	durable durable.Barrier
	queue   chan Call

	dropped atomic.Uint64
	written atomic.Uint64

	// mu guards key, started and stopped; senders hold it for reading while
	// they send, so Stop (which closes queue) waits for them.
	mu      sync.RWMutex
	key     []byte // audit.Key of the proxy key, set by Start
	started bool
	stopped bool
	done    chan struct{} // closed when the goroutine returns
}

// New returns a Writer on nc; it publishes nothing until Start.
func New(nc *nats.Conn, cfg Config) (*Writer, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.Block <= 0 {
		cfg.Block = DefaultBlock
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = DefaultAttempts
	}
	if cfg.Linger <= 0 {
		cfg.Linger = DefaultLinger
	}
	return &Writer{cfg: cfg, log: cfg.Logger, js: js, durable: durable.NewFleet(nc, cfg.Subjects.StateService(), cfg.Subjects.SyncBarrier()),
		queue: make(chan Call, cfg.Queue), done: make(chan struct{})}, nil
}

// Start begins publishing with the audit key of proxyKey. Only the first
// call starts it.
func (w *Writer) Start(proxyKey []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started || w.stopped {
		return
	}
	w.key, w.started = audit.Key(proxyKey), true
	go w.run()
}

// Stop publishes what is queued (waiting at most Block for it) and stops.
// It is idempotent and safe before Start.
func (w *Writer) Stop() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.stopped = true
	started := w.started
	close(w.queue)
	w.mu.Unlock()
	if !started {
		if n := len(w.queue); n > 0 {
			w.dropped.Add(uint64(n))
			w.log.Error("audit entries not written: the front-end stopped before it started", "count", n)
		}
		return
	}
	<-w.done
}

// Dropped counts the entries that could not be written; Written those that
// the audit stream acknowledged.
func (w *Writer) Dropped() uint64 { return w.dropped.Load() }

// Written counts the entries the audit stream acknowledged.
func (w *Writer) Written() uint64 { return w.written.Load() }

// Record queues c's entry. When the queue is full it waits up to Block for
// room (the call's sandbox waits with it); then the entry is dropped,
// logged and counted. It never blocks after Stop.
func (w *Writer) Record(c Call) {
	if c.Entry.ID == "" {
		var b [16]byte
		_, _ = rand.Read(b[:]) // never fails
		c.Entry.ID = hex.EncodeToString(b[:])
	}
	w.mu.RLock()
	defer w.mu.RUnlock() // held while sending: Stop cannot close the queue under a send
	if w.stopped {
		w.drop(c.Entry, "the front-end is stopping")
		return
	}
	select {
	case w.queue <- c:
		return
	default:
	}
	t := time.NewTimer(w.cfg.Block)
	defer t.Stop()
	select {
	case w.queue <- c:
	case <-t.C:
		w.drop(c.Entry, "the audit queue stayed full for "+w.cfg.Block.String()+" (is the broker reachable?)")
	}
}

func (w *Writer) drop(e audit.Entry, why string) {
	n := w.dropped.Add(1)
	w.log.Error("audit entry not written", "reason", why, "job", e.JobID, "server", e.Server, "tool", e.Tool, "dropped_total", n)
}

// run publishes queued entries until the queue is closed and empty: it
// gathers what arrives within Linger of the first (at most batch entries),
// and publishes each namespace's as one message.
func (w *Writer) run() {
	defer close(w.done)
	for {
		c, ok := <-w.queue
		if !ok {
			return
		}
		calls := []Call{c}
		linger := time.NewTimer(w.cfg.Linger)
	more:
		for len(calls) < batch {
			select {
			case c, ok := <-w.queue:
				if !ok {
					break more
				}
				calls = append(calls, c)
			case <-linger.C:
				break more
			}
		}
		linger.Stop()
		w.publish(calls)
	}
}

// message is one audit message: a namespace's entries, one JSON object a
// line (encoding/json never writes a raw newline), and the entries it holds.
type message struct {
	msg     *nats.Msg
	entries []audit.Entry
}

// messages digests and signs calls and groups them by namespace, at most
// maxMessage bytes a message.
func (w *Writer) messages(calls []Call) []*message {
	var out []*message
	open := map[string]*message{}
	for _, c := range calls {
		e := c.Entry
		c.Redactor.Digest(&e, c.Args)
		audit.Sign(w.key, &e)
		data, err := json.Marshal(e)
		if err != nil {
			w.drop(e, "encode: "+err.Error())
			continue
		}
		m := open[e.Namespace]
		if m != nil && len(m.msg.Data)+1+len(data) > maxMessage {
			m = nil
		}
		if m == nil {
			m = &message{msg: nats.NewMsg(w.cfg.Subjects.Audit(e.Namespace))}
			open[e.Namespace] = m
			out = append(out, m)
		} else {
			m.msg.Data = append(m.msg.Data, '\n')
		}
		m.msg.Data = append(m.msg.Data, data...)
		m.entries = append(m.entries, e)
	}
	for _, m := range out {
		// A retried publish is stored once: the id names its entries.
		h := sha256.New()
		for _, e := range m.entries {
			h.Write([]byte(e.ID))
		}
		m.msg.Header.Set(jetstream.MsgIDHeader, w.cfg.Subjects.AuditMsgID(hex.EncodeToString(h.Sum(nil)[:16])))
	}
	return out
}

// publish publishes calls' entries, retrying the messages the stream did
// not acknowledge.
func (w *Writer) publish(calls []Call) {
	msgs := w.messages(calls)
	delay := 250 * time.Millisecond
	for attempt := 1; len(msgs) > 0; attempt++ {
		var failed []*message
		var lastErr error
		futures := make([]jetstream.PubAckFuture, len(msgs))
		for i, m := range msgs {
			f, err := w.js.PublishMsgAsync(m.msg)
			if err != nil {
				failed, lastErr = append(failed, m), err
				continue
			}
			futures[i] = f
		}
		ctx, cancel := context.WithTimeout(context.Background(), ackWait)
		var stored []*message
		for i, f := range futures {
			if f == nil {
				continue
			}
			select {
			case <-f.Ok():
				stored = append(stored, msgs[i])
			case err := <-f.Err():
				failed, lastErr = append(failed, msgs[i]), err
			case <-ctx.Done():
				failed, lastErr = append(failed, msgs[i]), ctx.Err()
			}
		}
		if len(stored) > 0 {
			// Durable before it counts as written (the brokers' barrier,
			// where they need one); else sent again, deduplicated.
			if err := w.durable.Sync(ctx); err != nil {
				failed, lastErr = append(failed, stored...), err
				stored = nil
			}
		}
		for _, m := range stored {
			w.written.Add(uint64(len(m.entries)))
		}
		cancel()
		if len(failed) == 0 {
			return
		}
		if attempt >= w.cfg.Attempts {
			for _, m := range failed {
				for _, e := range m.entries {
					w.drop(e, "the audit stream did not take it after "+strconv.Itoa(attempt)+" attempts: "+lastErr.Error())
				}
			}
			return
		}
		w.log.Warn("audit entries not acknowledged: retrying", "messages", len(failed), "attempt", attempt, "err", lastErr)
		time.Sleep(delay)
		delay = min(2*delay, 2*time.Second)
		msgs = failed
	}
}
