package queue

// Group commit of events: the events that a client's callers publish at the
// same time go to the events stream as one atomic batch, so that the stream
// syncs once for all of them.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/mcpexec/mcpexec/internal/durable"
)

// Headers of JetStream's atomic batch publish (nats-server 2.12 and later).
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// Bounds of one group commit: messages, and bytes of their data. A message
// larger than groupMaxMsgBytes is published alone, so that a message too
// large for the connection fails with its own error.
const (
	groupMaxMsgs     = 256
	groupMaxBytes    = 1 << 20
	groupMaxMsgBytes = 64 << 10
)

// groupMinAtomic is the fewest messages a client's group commit sends as
// one atomic batch; fewer go all at once, each on its own. On one broker,
// nats-server stages an atomic batch in a file store of its own, created,
// synced and removed for each batch: under sync always a batch costs about
// 2.5 ms whatever its size (1 to 32 messages), where one message alone
// costs 0.25 ms and each more in flight with it 0.17 ms (measured on the
// test machine; BenchmarkGroupCommit). Batches pay from about 15 messages.
// Replicated streams stage in memory, and there one publish each in flight
// was as fast as an atomic batch at every size measured (2 to 32): they sync
// once per Raft append either way.
const groupMinAtomic = 16

// errCodeAtomicDisabled is JetStream's error code of an atomic batch sent
// to a stream that does not allow them (a broker older than the client).
const errCodeAtomicDisabled = 10174

// groupCommit publishes the events that its callers hand it at the same time
// as one atomic batch: one sync of the stream (one Raft proposal in a
// cluster) for all of them, where one publish each cost a sync each. The
// caller that finds no batch in flight leads: it publishes what is pending,
// answers each caller, and hands the lead to the first caller that arrived
// meanwhile. A lone event is published as it was, alone, and a batch of
// fewer than minAtomic events is published all at once, each on its own
// (groupMinAtomic says why).
//
// Every caller is answered with what JetStream answered for its event, so
// the promise is that of a plain publish: nil only once the event is stored
// (and, under the broker's sync policy, synced). A batch JetStream refused
// stores nothing; its events are then published one by one, each answered
// for itself (a duplicate Nats-Msg-Id refuses a whole batch, and is only a
// duplicate alone). A batch whose answer did not come (a node lost as it
// committed) is an error to every caller: it may have landed, and a retry
// with the same Nats-Msg-Id is deduplicated.
//
// It groups only where each write waits for its own fsync (durable.Mode),
// and where the brokers acknowledge writes before they sync them under sync
// always (one broker), it answers only after a barrier (durable.Fleet).
type groupCommit struct {
	nc *nats.Conn
	js jetstream.JetStream
	// fleet says whether to group (where each write waits for its own
	// sync) and makes what was acknowledged durable (a barrier, where the
	// brokers acknowledge before they sync); nil: always group, no barrier.
	fleet *durable.Fleet
	// barrier makes this stream's acknowledged writes durable (the fleet's
	// barrier for the stream); nil: the fleet's.
	barrier durable.Barrier
	// minAtomic is the fewest messages sent as one atomic batch
	// (groupMinAtomic); 0: every batch of more than one.
	minAtomic int

	mu       sync.Mutex // guards pending, leading, disabled
	pending  []*pendingPub
	leading  bool
	disabled bool // the stream refused an atomic batch: publish one by one
}

// SyncMetadata is the key of the brokers' sync policy in their state
// service's metadata: "always", or "interval:D".
const SyncMetadata = durable.SyncMetadata

// pendingPub is one caller's event waiting in a groupCommit.
type pendingPub struct {
	msg  *nats.Msg
	done chan pubResult // one value: the result, or the lead
}

// pubResult answers a pendingPub: its sequence or error (dup: JetStream
// had it already, by its Nats-Msg-Id), or lead (the caller is to publish
// what is pending next).
type pubResult struct {
	seq  uint64
	dup  bool
	err  error
	lead bool
}

// publish stores m in its stream and returns its sequence (or one at most
// the batch's last sequence above it: the batch is contiguous). It waits for
// the batch it joins even when ctx ends first: a caller that left would
// leave the lead with nobody; every batch is bounded by publishTimeout.
func (g *groupCommit) publish(ctx context.Context, m *nats.Msg) (uint64, error) {
	if len(m.Data) > groupMaxMsgBytes || !g.grouped(ctx) {
		// sync marks the results it could not make durable in place.
		r := []pubResult{g.publishOne(ctx, m)}
		g.sync(ctx, r)
		return r[0].seq, r[0].err
	}
	p := &pendingPub{msg: m, done: make(chan pubResult, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, p)
	if g.leading {
		g.mu.Unlock()
		if r := <-p.done; !r.lead {
			return r.seq, r.err
		}
		g.mu.Lock()
	}
	g.leading = true
	// p is first in line: the lead goes to the first caller waiting.
	n := batchLen(g.pending, func(p *pendingPub) *nats.Msg { return p.msg })
	batch := append([]*pendingPub(nil), g.pending[:n]...)
	g.pending = g.pending[n:]
	disabled := g.disabled
	g.mu.Unlock()

	results := g.publishBatch(ctx, batch, disabled)
	g.sync(ctx, results)

	g.mu.Lock()
	if len(g.pending) > 0 {
		g.pending[0].done <- pubResult{lead: true}
	} else {
		g.leading = false
	}
	g.mu.Unlock()
	for i, q := range batch[1:] {
		q.done <- results[i+1]
	}
	return results[0].seq, results[0].err
}

// publishStored stores m and returns once JetStream holds it, without the
// barrier that publish waits for where the brokers acknowledge before they
// sync (one broker under sync always): sync, called later, is that barrier
// (a no-op where the publish already waited for its sync, or where nothing
// is synced on demand).
func (g *groupCommit) publishStored(ctx context.Context, m *nats.Msg) (seq uint64, sync func(context.Context) error, err error) {
	if g.fleet == nil || len(m.Data) > groupMaxMsgBytes || g.grouped(ctx) {
		seq, err = g.publish(ctx, m)
		return seq, noSync, err
	}
	r := g.publishOne(ctx, m)
	if r.err != nil {
		return 0, noSync, r.err
	}
	return r.seq, g.syncStored, nil
}

func noSync(context.Context) error { return nil }

// syncStored returns once what the stream stored before the call is
// durable: sync's barrier, for one stored write.
func (g *groupCommit) syncStored(ctx context.Context) error {
	rs := []pubResult{{}}
	g.sync(ctx, rs)
	return rs[0].err
}

// publishBatch stores batch's messages, as one atomic batch when it has
// at least minAtomic (and the stream allows them), and returns each one's
// result.
func (g *groupCommit) publishBatch(ctx context.Context, batch []*pendingPub, disabled bool) []pubResult {
	results := make([]pubResult, len(batch))
	if len(batch) == 1 {
		results[0] = g.publishOne(ctx, batch[0].msg)
		return results
	}
	if !disabled && len(batch) >= g.minAtomic {
		last, err := g.atomic(batch)
		var apiErr *jetstream.APIError
		switch {
		case err == nil:
			for i := range results {
				results[i].seq = last - uint64(len(batch)-1-i)
			}
			return results
		case errors.As(err, &apiErr):
			// Refused: nothing of it is stored.
			if apiErr.ErrorCode == errCodeAtomicDisabled {
				g.mu.Lock()
				g.disabled = true
				g.mu.Unlock()
			}
		default:
			// Unanswered: it may be stored.
			for i := range results {
				results[i].err = err
			}
			return results
		}
	}
	futures := make([]jetstream.PubAckFuture, len(batch))
	for i, q := range batch {
		futures[i], results[i].err = g.js.PublishMsgAsync(q.msg)
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		ack, err := waitAck(context.WithoutCancel(ctx), f)
		if err == nil {
			results[i].seq, results[i].dup = ack.Sequence, ack.Duplicate
		}
		results[i].err = err
	}
	return results
}

// grouped reports whether writes go in batches: where each waits for its
// own sync.
func (g *groupCommit) grouped(ctx context.Context) bool {
	return g.fleet == nil || g.fleet.Mode(ctx).Grouped()
}

// sync makes the stored results durable where the brokers need a barrier
// for it; if the barrier fails, each is an error (a retry with the same
// Nats-Msg-Id is deduplicated, as after a lost ack).
func (g *groupCommit) sync(ctx context.Context, results []pubResult) {
	if g.fleet == nil || !slices.ContainsFunc(results, func(r pubResult) bool { return r.err == nil }) {
		return
	}
	b := g.barrier
	if b == nil {
		b = g.fleet
	}
	if err := b.Sync(context.WithoutCancel(ctx)); err != nil {
		for i := range results {
			if results[i].err == nil {
				results[i] = pubResult{err: fmt.Errorf("stored, but not yet synced: %w", err)}
			}
		}
	}
}

// publishOne publishes m alone and waits for its ack.
func (g *groupCommit) publishOne(ctx context.Context, m *nats.Msg) pubResult {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), publishTimeout)
	defer cancel()
	ack, err := g.js.PublishMsg(pctx, m)
	if err != nil {
		return pubResult{err: err}
	}
	return pubResult{seq: ack.Sequence, dup: ack.Duplicate}
}

// batchLen is how many of items, from the first, go in one batch: at most
// groupMaxMsgs and groupMaxBytes, and a message over groupMaxMsgBytes alone.
func batchLen[T any](items []T, msg func(T) *nats.Msg) int {
	n, size := 0, 0
	for n < len(items) && n < groupMaxMsgs {
		l := len(msg(items[n]).Data)
		if n > 0 && (size+l > groupMaxBytes || l > groupMaxMsgBytes) {
			break
		}
		size += l
		n++
		if l > groupMaxMsgBytes {
			break
		}
	}
	return n
}

// publishAll stores msgs, in as few atomic batches as the bounds allow, one
// batch after another, and returns each one's result: what a publish of
// each alone would have returned, or the error of a batch left unanswered.
func (g *groupCommit) publishAll(ctx context.Context, msgs []*nats.Msg) []pubResult {
	results := g.publishAllStored(ctx, msgs)
	g.sync(ctx, results)
	return results
}

// publishAllStored is publishAll without the barrier: each result says the
// message is stored; sync makes those durable where the brokers need a
// barrier.
func (g *groupCommit) publishAllStored(ctx context.Context, msgs []*nats.Msg) []pubResult {
	results := make([]pubResult, 0, len(msgs))
	// Ungrouped: publishBatch's path for a stream without atomic batches,
	// every message in flight at once.
	ungrouped := !g.grouped(ctx)
	for len(msgs) > 0 {
		n := batchLen(msgs, func(m *nats.Msg) *nats.Msg { return m })
		batch := make([]*pendingPub, n)
		for i, m := range msgs[:n] {
			batch[i] = &pendingPub{msg: m}
		}
		g.mu.Lock()
		disabled := g.disabled
		g.mu.Unlock()
		results = append(results, g.publishBatch(ctx, batch, disabled || ungrouped)...)
		msgs = msgs[n:]
	}
	return results
}

// atomic publishes batch as one atomic batch and returns the stream
// sequence of its last message: the messages before the last are staged
// (no reply), the last commits them all. A *jetstream.APIError means
// JetStream refused the batch and stored none of it.
func (g *groupCommit) atomic(batch []*pendingPub) (uint64, error) {
	id := nuid.Next()
	var commit *nats.Msg
	for i, q := range batch {
		m := nats.NewMsg(q.msg.Subject)
		m.Data = q.msg.Data
		for k, v := range q.msg.Header {
			m.Header[k] = v
		}
		m.Header.Set(batchIDHeader, id)
		m.Header.Set(batchSeqHeader, strconv.Itoa(i+1))
		if i == len(batch)-1 {
			m.Header.Set(batchCommitHeader, "1")
			commit = m
			break
		}
		if err := g.nc.PublishMsg(m); err != nil {
			return 0, fmt.Errorf("stage a batch of %d messages: %w", len(batch), err)
		}
	}
	resp, err := g.nc.RequestMsg(commit, publishTimeout)
	if err != nil {
		return 0, fmt.Errorf("commit a batch of %d messages: %w", len(batch), err)
	}
	var ack struct {
		Error    *jetstream.APIError `json:"error"`
		Sequence uint64              `json:"seq"`
		Count    int                 `json:"count"`
	}
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return 0, fmt.Errorf("commit a batch of %d messages: undecodable answer: %w", len(batch), err)
	}
	if ack.Error != nil {
		return 0, ack.Error
	}
	if ack.Count != len(batch) {
		return 0, fmt.Errorf("commit a batch of %d messages: JetStream stored %d", len(batch), ack.Count)
	}
	return ack.Sequence, nil
}
