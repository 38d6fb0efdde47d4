package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobclock"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// The proxy methods a sandbox may call. Anything else is refused where it is
// received (the worker and the front-end) and counted as "unknown".
const (
	MethodCallTool          = "call_tool"
	MethodListServers       = "list_servers"
	MethodDiscoveredServers = "discovered_servers"
	MethodListTools         = "list_tools"
	MethodQueryToolDocs     = "query_tool_docs"
	MethodSearchToolDocs    = "search_tool_docs"
	MethodCapabilitySummary = "capability_summary"
	MethodMemoryGet         = "memory_get"
	MethodMemoryPut         = "memory_put"
	MethodMemoryDelete      = "memory_delete"
	MethodMemoryList        = "memory_list"
	MethodJobResult         = "job_result"
	// MethodJobFile reads a file an ended job of the namespace wrote.
	MethodJobFile = "job_file"
	// Saved tools: functions kept per namespace and defined in its later jobs.
	MethodSavedToolPut    = "saved_tool_put"
	MethodSavedToolDelete = "saved_tool_delete"
	MethodSavedToolList   = "saved_tool_list"
	// The server catalog: find_servers, enable_server, disable_server.
	MethodCatalogFind    = "catalog_find"
	MethodCatalogEnable  = "catalog_enable"
	MethodCatalogDisable = "catalog_disable"
)

var knownMethods = map[string]bool{
	MethodCallTool: true, MethodListServers: true, MethodDiscoveredServers: true,
	MethodListTools: true, MethodQueryToolDocs: true, MethodSearchToolDocs: true,
	MethodCapabilitySummary: true, MethodMemoryGet: true, MethodMemoryPut: true,
	MethodMemoryDelete: true, MethodMemoryList: true, MethodJobResult: true, MethodJobFile: true,
	MethodSavedToolPut: true, MethodSavedToolDelete: true, MethodSavedToolList: true,
	MethodCatalogFind: true, MethodCatalogEnable: true, MethodCatalogDisable: true,
}

// Methods returns the proxy methods, sorted.
func Methods() []string {
	out := make([]string, 0, len(knownMethods))
	for m := range knownMethods {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// KnownMethod reports whether m is a proxy method.
func KnownMethod(m string) bool { return knownMethods[m] }

// MethodLabel is m when it is a known method, else "unknown": what metrics and
// logs may carry of a name a sandbox chose.
func MethodLabel(m string) string {
	if knownMethods[m] {
		return m
	}
	return "unknown"
}

// ServerMethod reports whether m names one MCP server in its "server"
// parameter, so that only front-ends proxying that server can answer it.
func ServerMethod(m string) bool {
	return m == MethodCallTool || m == MethodListTools || m == MethodQueryToolDocs
}

// Request is a sandbox's proxy call as carried over NATS from a worker to the
// front-ends. Capability is the job's proxy capability, which proves the call
// comes from a worker that holds the job (jobs.Capability); Attempt fences
// calls of a stale attempt.
type Request struct {
	Job        string          `json:"job"`
	Attempt    int             `json:"attempt,omitempty"`
	Capability string          `json:"capability,omitempty"`
	Method     string          `json:"method"`
	Params     json.RawMessage `json:"params,omitempty"`
	// TimeoutMS is how long the worker waits for the answer.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// CallID names this call, the same across the worker's retries of it
	// (at most MaxCallID bytes): a memory write retried after its answer was
	// lost is applied once.
	CallID string `json:"call_id,omitempty"`
	// StartedSeq is the events stream's sequence the worker had written up
	// to once this attempt's start was recorded: the responder reads the
	// job's record from a replica that has applied it, instead of polling
	// until one has. A worker's word only: the wait it buys is bounded.
	StartedSeq uint64 `json:"started_seq,omitempty"`
	// Parks says the worker stops the job's clock while the call waits for
	// a person: the responder may then send interim Responses (Waiting set)
	// before the answer, and bounds the call by TimeoutMS of running time
	// only (see package jobclock). A worker that does not set it hears only
	// the answer, as before.
	Parks bool `json:"parks,omitempty"`
}

// MaxCallID bounds Request.CallID.
const MaxCallID = 64

// Retryable reports whether a call of method may be sent again when its
// answer did not come (a node of the cluster died with it in flight): every
// method but call_tool, whose tools may not be idempotent, is.
func Retryable(method string) bool { return method != MethodCallTool }

// Response answers a Request: a result, or an error whose text reaches the
// sandbox's code as MCPError.
type Response struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
	// Waiting, in an interim Response to a request that Parks, says the call
	// has begun (true) or stopped (false) waiting for a person; the answer
	// follows.
	Waiting *bool `json:"waiting,omitempty"`
	// WaitMS, with Waiting true, bounds the wait: the worker's clock runs
	// again after it even if no further word comes (the answer lost, or
	// refused by a NATS configuration that allows one response only).
	WaitMS int64 `json:"wait_ms,omitempty"`
	// Retry, with Error, says the call did not complete for a passing
	// reason (the state service unreachable while the cluster fails over,
	// or the call's bound passed) and, its method being Retryable, may be
	// sent again with the same call id: a write retried so is not applied
	// twice.
	Retry bool `json:"retry,omitempty"`
}

// encode is req as JSON, its Params spliced in as they came (spliced).
func (req Request) encode() ([]byte, error) {
	head := req
	head.Params = nil
	return spliced(&head, rawField{"params", req.Params})
}

// encode is resp as JSON, its Result spliced in as it came (spliced).
func (resp Response) encode() ([]byte, error) {
	head := resp
	head.Result = nil
	return spliced(&head, rawField{"result", resp.Result})
}

// MaxResponses is how many messages a responder may send to one request: a
// "waiting" and a "no longer waiting" notice, and the answer.
const MaxResponses = 3

type interimKey struct{}

// Waiting tells the worker that the call ctx answers now waits for a person,
// so that it stops the job's clock, and stops the responder's own clock of
// the call; the returned function says the wait is over. For a request that
// does not Park both do nothing.
func Waiting(ctx context.Context, bound time.Duration) (done func()) {
	send, _ := ctx.Value(interimKey{}).(func(Response))
	resume := jobclock.From(ctx).Pause()
	if send == nil {
		return resume
	}
	yes, no := true, false
	send(Response{Waiting: &yes, WaitMS: max(bound.Milliseconds(), 1)})
	var once sync.Once
	return func() {
		once.Do(func() {
			resume()
			send(Response{Waiting: &no})
		})
	}
}

// waitSlack is how much longer than a notice's WaitMS the worker's clock
// stands still: the answer of a call approved at the last moment is on
// its way.
const waitSlack = 5 * time.Second

// Handler answers proxy calls on the front-end.
type Handler interface {
	Handle(ctx context.Context, req Request) (json.RawMessage, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, req Request) (json.RawMessage, error)

// Handle implements Handler.
func (f HandlerFunc) Handle(ctx context.Context, req Request) (json.RawMessage, error) {
	return f(ctx, req)
}

// MaxRequest is the largest proxy request a Responder decodes.
const MaxRequest = 8 << 20

// DefaultMaxInFlight bounds the requests a Responder answers at once; more are
// answered "busy" at once rather than queued without bound.
const DefaultMaxInFlight = 1024

// Responder serves a Handler on proxy subjects, as a member of a queue group:
// each request is answered by one member.
type Responder struct {
	nc    *nats.Conn
	queue string
	h     Handler
	// MaxInFlight bounds concurrent requests (default DefaultMaxInFlight). Set
	// before Start.
	MaxInFlight int

	mu     sync.Mutex // guards subs, cancel, ctx
	subs   map[string]*nats.Subscription
	ctx    context.Context
	cancel context.CancelFunc
	slots  chan struct{}
	wg     sync.WaitGroup // requests in flight
}

// NewResponder returns a Responder in queue group queue ("" for none).
func NewResponder(nc *nats.Conn, queue string, h Handler) *Responder {
	return &Responder{nc: nc, queue: queue, h: h, subs: map[string]*nats.Subscription{}}
}

// Start subscribes to subjects. Each request is answered on its own goroutine,
// whose context ends only when Stop gives up waiting: a process that is
// shutting down still answers the calls of jobs it lets finish.
func (r *Responder) Start(subjects ...string) error {
	r.mu.Lock()
	if r.ctx == nil {
		r.ctx, r.cancel = context.WithCancel(context.Background())
		n := r.MaxInFlight
		if n <= 0 {
			n = DefaultMaxInFlight
		}
		r.slots = make(chan struct{}, n)
	}
	r.mu.Unlock()
	return r.SetSubjects(subjects...)
}

// SetSubjects changes the subjects served: new ones are subscribed, those no
// longer listed unsubscribed (their requests in flight are still answered).
func (r *Responder) SetSubjects(subjects ...string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx == nil {
		return errors.New("proxy responder is not started")
	}
	want := map[string]bool{}
	for _, s := range subjects {
		want[s] = true
		if r.subs[s] != nil {
			continue
		}
		sub, err := r.nc.QueueSubscribe(s, r.queue, r.receive)
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", s, err)
		}
		r.subs[s] = sub
	}
	for s, sub := range r.subs {
		if !want[s] {
			_ = sub.Unsubscribe() // a failed unsubscribe of a live connection only leaves extra requests to answer
			delete(r.subs, s)
		}
	}
	return nil
}

// busyError answers a request over the Responder's bound (MaxInFlight).
const busyError = "the front-end is busy answering other proxy calls: retry shortly"

func (r *Responder) receive(m *nats.Msg) {
	select {
	case r.slots <- struct{}{}:
	default:
		respond(m, Response{Error: busyError}, r.nc.MaxPayload())
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer func() { <-r.slots }()
		r.serve(m)
	}()
}

func (r *Responder) serve(m *nats.Msg) {
	if len(m.Data) > MaxRequest {
		respond(m, Response{Error: fmt.Sprintf("proxy request of %d bytes is over the %d-byte limit", len(m.Data), MaxRequest)}, r.nc.MaxPayload())
		return
	}
	var req Request
	if err := json.Unmarshal(m.Data, &req); err != nil {
		respond(m, Response{Error: malformedRequest}, r.nc.MaxPayload())
		return
	}
	respond(m, r.answer(req, m.Header, func(notice Response) { respond(m, notice, r.nc.MaxPayload()) }), r.nc.MaxPayload())
}

// malformedRequest is the error of a request without a job or a method.
const malformedRequest = "malformed proxy request: want {job, method, params}"

// answer answers req, whose headers are hdr, from a worker over NATS or in
// this process (Local): notify sends a parking request's notices (never
// after the answer).
func (r *Responder) answer(req Request, hdr nats.Header, notify func(Response)) Response {
	var resp Response
	switch {
	case req.Job == "" || req.Method == "":
		resp.Error = malformedRequest
	case !KnownMethod(req.Method):
		resp.Error = fmt.Sprintf("unknown proxy method %q", errs.Clip(req.Method, 40))
	default:
		// The worker's call span, when it sent one, is the parent of the
		// handler's spans (the header is validated: it comes from a worker).
		ctx := tracing.FromHeader(r.ctx, hdr)
		if req.Parks {
			// Bounded by the job's running time only: the worker's clock
			// stops while the call waits for a person, and so does this one.
			if req.TimeoutMS > 0 {
				var cancel context.CancelFunc
				ctx, _, cancel = jobclock.WithBudget(ctx, time.Duration(req.TimeoutMS)*time.Millisecond, context.DeadlineExceeded)
				defer cancel()
			}
			var mu sync.Mutex // notices in order, never after the answer
			answered := false
			defer func() { mu.Lock(); answered = true; mu.Unlock() }()
			ctx = context.WithValue(ctx, interimKey{}, func(notice Response) {
				mu.Lock()
				defer mu.Unlock()
				if !answered {
					notify(notice)
				}
			})
		} else if req.TimeoutMS > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMS)*time.Millisecond)
			defer cancel()
		}
		if res, err := r.h.Handle(ctx, req); err != nil {
			resp.Error = err.Error()
			// A part unreachable for now, or this attempt's bound passed
			// (the worker's too): the worker sends the call again.
			resp.Retry = Retryable(req.Method) && (errs.KindOf(err) == errs.Unavailable || ctx.Err() != nil)
		} else {
			resp.Result = res
		}
	}
	return resp
}

func respond(m *nats.Msg, resp Response, maxPayload int64) {
	data, err := resp.encode()
	if err != nil {
		data, _ = json.Marshal(Response{Error: "encode proxy response: " + err.Error()})
	}
	if int64(len(data)) > maxPayload {
		data, _ = json.Marshal(Response{Error: fmt.Sprintf("result of %d bytes exceeds the %d-byte message limit", len(data), maxPayload)})
	}
	_ = m.Respond(data) // the requester may be gone; nothing to do then
}

// Stop unsubscribes, so that other members of the queue group take new
// requests, then lets the requests in flight finish for up to grace before
// cancelling them, and waits for them. It is idempotent.
func (r *Responder) Stop(grace time.Duration) {
	r.mu.Lock()
	subs, cancel := r.subs, r.cancel
	r.subs, r.cancel = map[string]*nats.Subscription{}, nil
	r.mu.Unlock()
	for _, sub := range subs {
		_ = sub.Unsubscribe() // a closed connection has no subscriptions left anyway
	}
	if cancel == nil {
		return
	}
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
	}
	cancel()
	<-done
}

// ErrNoResponder is returned by Call when no front-end answers the subject.
var ErrNoResponder = errors.New("no front-end is answering proxy calls")

// Call sends req to subject and returns the result.
// hdr, when given, travels with the request (e.g. the job's trace context).
func Call(ctx context.Context, nc *nats.Conn, subject string, req Request, hdr ...nats.Header) (json.RawMessage, error) {
	req = bounded(ctx, req)
	data, err := req.encode()
	if err != nil {
		return nil, fmt.Errorf("encode proxy request: %w", err)
	}
	out := nats.NewMsg(subject)
	out.Data = data
	for _, h := range hdr {
		for k, v := range h {
			out.Header[k] = v
		}
	}
	if req.Parks {
		return callParking(ctx, nc, out, req.Method)
	}
	msg, err := nc.RequestMsgWithContext(ctx, out)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, ErrNoResponder
	}
	if err != nil {
		return nil, fmt.Errorf("proxy call %s: %w", MethodLabel(req.Method), err)
	}
	resp, err := decodeResponse(msg.Data)
	if err != nil {
		return nil, err
	}
	return resp.outcome()
}

// bounded is req with its TimeoutMS, unless set, from ctx: its deadline,
// or for a request that Parks the running time left on the job's clock.
func bounded(ctx context.Context, req Request) Request {
	if dl, ok := ctx.Deadline(); ok && req.TimeoutMS == 0 {
		req.TimeoutMS = max(time.Until(dl).Milliseconds(), 1)
	}
	if c := jobclock.From(ctx); c != nil && req.Parks && req.TimeoutMS == 0 {
		req.TimeoutMS = max(c.Remaining().Milliseconds(), 1)
	}
	return req
}

func decodeResponse(data []byte) (Response, error) {
	var resp Response
	if err := json.Unmarshal(data, &resp); err != nil {
		return resp, fmt.Errorf("decode proxy response: %w", err)
	}
	return resp, nil
}

// ErrTryAgain matches the error of a call whose answer said it may be sent
// again (Response.Retry).
var ErrTryAgain = errors.New("the call may be sent again")

// tryAgain is an answer's error that matches ErrTryAgain, its text the
// answer's.
type tryAgain struct{ text string }

func (e tryAgain) Error() string        { return e.text }
func (e tryAgain) Is(target error) bool { return target == ErrTryAgain }

// outcome is what the call answered r gets: its result, or its error.
func (r Response) outcome() (json.RawMessage, error) {
	switch {
	case r.Error != "" && r.Retry:
		return nil, tryAgain{r.Error}
	case r.Error != "":
		return nil, errors.New(r.Error)
	}
	return r.Result, nil
}

// callParking sends a request that Parks on an inbox of its own and reads
// the responder's notices until its answer: while the call waits for a
// person, the job's clock in ctx (if any) stands still. A responder may send
// at most MaxResponses messages (the NATS permissions say so too); anything
// after the answer is not read.
//
// The inbox's channel holds MaxResponses messages and a no-responders
// status: a subscription's default channel (nats.SubscribeSync) holds 64K
// and cost every call a 512 KiB allocation, zeroed and then scanned by the
// collector (~8% of the in-process fleet's CPU per proxied call).
func callParking(ctx context.Context, nc *nats.Conn, out *nats.Msg, method string) (json.RawMessage, error) {
	out.Reply = nc.NewInbox()
	answers := make(chan *nats.Msg, MaxResponses+1)
	sub, err := nc.ChanSubscribe(out.Reply, answers)
	if err != nil {
		return nil, fmt.Errorf("proxy call %s: %w", MethodLabel(method), err)
	}
	defer func() { _ = sub.Unsubscribe() }() // a closed connection has no subscription left anyway
	_ = sub.AutoUnsubscribe(MaxResponses)    // fails only on a closed subscription: the wait below sees the connection closed
	if err := nc.PublishMsg(out); err != nil {
		return nil, fmt.Errorf("proxy call %s: %w", MethodLabel(method), err)
	}
	notices := &clockNotices{ctx: ctx}
	defer notices.end()
	// A channel subscription is not told that its connection closed: look
	// now and then while the answer is due.
	closed := time.NewTicker(closedCheck)
	defer closed.Stop()
	for {
		var msg *nats.Msg
		select {
		case msg = <-answers:
		case <-ctx.Done():
			return nil, fmt.Errorf("proxy call %s: %w", MethodLabel(method), ctx.Err())
		case <-closed.C:
			if nc.IsClosed() {
				return nil, fmt.Errorf("proxy call %s: %w", MethodLabel(method), nats.ErrConnectionClosed)
			}
			continue
		}
		if len(msg.Data) == 0 && msg.Header.Get("Status") == "503" {
			return nil, ErrNoResponder
		}
		resp, err := decodeResponse(msg.Data)
		if err != nil {
			return nil, err
		}
		if resp.Waiting == nil || resp.Result != nil || resp.Error != "" {
			return resp.outcome()
		}
		notices.notice(resp)
	}
}

// clockNotices applies a parking call's notices to the job's clock in ctx:
// stopped from a "waiting" notice (for at most its WaitMS and waitSlack)
// until the next notice or the call's end. Its methods are called by one
// goroutine at a time.
type clockNotices struct {
	ctx    context.Context
	resume func() // nil: the clock runs
	ended  bool
}

// notice applies notice, a Response with Waiting set.
func (c *clockNotices) notice(notice Response) {
	if c.ended {
		return // the call is over: its clock is not the responder's to stop
	}
	c.release()
	if *notice.Waiting {
		c.resume = pauseFor(c.ctx, time.Duration(notice.WaitMS)*time.Millisecond+waitSlack)
	}
}

// end runs the clock again, for good: the call is over.
func (c *clockNotices) end() {
	c.release()
	c.ended = true
}

func (c *clockNotices) release() {
	if c.resume != nil {
		c.resume()
		c.resume = nil
	}
}

// closedCheck is how often a parking call that waits for its answer looks
// whether its connection closed.
const closedCheck = 500 * time.Millisecond

// pauseFor pauses the clock in ctx until the returned function is called,
// or for at most d (bounded by jobclock.DefaultMaxPaused): a responder's
// notice is trusted to stop the clock, not to stop it for ever.
func pauseFor(ctx context.Context, d time.Duration) (resume func()) {
	r := jobclock.From(ctx).Pause()
	t := time.AfterFunc(min(d, jobclock.DefaultMaxPaused), r)
	return func() {
		t.Stop()
		r()
	}
}

// QuoteNames lists server or tool names for an error message: quoted,
// comma-separated, "none" for none.
func QuoteNames(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}
