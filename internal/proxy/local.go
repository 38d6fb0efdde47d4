package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
)

// Local is where a worker finds a Responder of its own process (the
// embedded default, `frontend --data`, runs both): a call to a subject that
// Responder serves is answered in process, without NATS. Over NATS a call
// was encoded and decoded twice each way and handed between some six
// goroutines (the worker's, the connections' readers, the subscription's,
// the responder's), each a wake-up that this machine's virtual CPUs make
// dear. The answer is the one the Responder would have sent: the same
// checks, the same handler, notices and bounds; a call to a subject it
// does not serve (a server only another front-end proxies), or one made
// while none is set, goes over NATS. The zero Local has no Responder.
type Local struct {
	r atomic.Pointer[Responder]
}

// Set makes r the Local's Responder (Responder.Start does, when it has a
// Local).
func (l *Local) Set(r *Responder) { l.r.Store(r) }

// Clear forgets r, if it is the Local's Responder (Responder.Stop does).
func (l *Local) Clear(r *Responder) { l.r.CompareAndSwap(r, nil) }

// Call answers req in process when the Local's Responder serves subject,
// as Call over NATS would: served is false when it does not (then nothing
// was done, and the caller goes over NATS). A parking call's notices stop
// the job's clock in ctx as over NATS. The call returns when ctx ends,
// though its handler runs on, bounded as over NATS, as it would for a
// worker that went away.
func (l *Local) Call(ctx context.Context, subject string, req Request, hdr nats.Header) (res json.RawMessage, served bool, err error) {
	r := l.r.Load()
	if r == nil {
		return nil, false, nil
	}
	req = bounded(ctx, req)
	if n := requestSize(req); n > r.nc.MaxPayload() {
		// Over NATS the worker's client refuses to send it.
		return nil, true, fmt.Errorf("proxy call %s: %w", MethodLabel(req.Method), nats.ErrMaxPayload)
	}
	var mu sync.Mutex // the notices' clock, between the handler and this call's end
	notices := &clockNotices{ctx: ctx}
	defer func() { mu.Lock(); notices.end(); mu.Unlock() }()
	notify := func(notice Response) { mu.Lock(); notices.notice(notice); mu.Unlock() }
	done, served := r.local(subject, req, hdr, notify)
	if !served {
		return nil, false, nil
	}
	select {
	case resp := <-done:
		res, err := resp.outcome()
		return res, true, err
	case <-ctx.Done():
		return nil, true, fmt.Errorf("proxy call %s: %w", MethodLabel(req.Method), ctx.Err())
	}
}

// local answers req for a caller in this process, as serve does for one
// over NATS, on a goroutine of its own (counted and bounded as serve's):
// the Response comes on done. served is false when r does not serve
// subject (not started, stopped, or another subject).
func (r *Responder) local(subject string, req Request, hdr nats.Header, notify func(Response)) (done <-chan Response, served bool) {
	out := make(chan Response, 1)
	r.mu.Lock()
	if r.ctx == nil || r.subs[subject] == nil {
		r.mu.Unlock()
		return nil, false
	}
	select {
	case r.slots <- struct{}{}:
	default:
		r.mu.Unlock()
		out <- Response{Error: busyError}
		return out, true
	}
	// Counted under mu: Stop drops the subjects under mu before it waits.
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		defer func() { <-r.slots }()
		if n := len(req.Params); n > MaxRequest {
			out <- Response{Error: fmt.Sprintf("proxy request of %d bytes is over the %d-byte limit", n, MaxRequest)}
			return
		}
		resp := r.answer(req, hdr, notify)
		if n := int64(len(resp.Result) + len(resp.Error) + len(`{"result":,"error":"","retry":true}`)); n > r.nc.MaxPayload() {
			// What a worker over NATS would hear of such an answer.
			resp = Response{Error: fmt.Sprintf("result of %d bytes exceeds the %d-byte message limit", n, r.nc.MaxPayload())}
		}
		out <- resp
	}()
	return out, true
}

// requestSize is about the size of req encoded, its headers included:
// enough to tell one that no NATS server of the Responder's would take.
func requestSize(req Request) int64 {
	return int64(len(req.Params)+len(req.Job)+len(req.Capability)+len(req.Method)+len(req.CallID)) + 512
}
