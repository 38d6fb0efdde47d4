package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
)

// Request is a sandbox's proxy call as carried over NATS from a worker to the
// front-end that submitted the job.
type Request struct {
	Job    string          `json:"job"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params,omitempty"`
}

// Response answers a Request: a result, or an error whose text reaches the
// sandbox's code as MCPError.
type Response struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

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

// Responder serves a Handler on a front-end's proxy subject.
type Responder struct {
	nc      *nats.Conn
	subject string
	h       Handler

	mu     sync.Mutex // guards sub, cancel
	sub    *nats.Subscription
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewResponder returns a Responder for subject.
func NewResponder(nc *nats.Conn, subject string, h Handler) *Responder {
	return &Responder{nc: nc, subject: subject, h: h}
}

// Start subscribes. Each request is answered on its own goroutine.
func (r *Responder) Start(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	sub, err := r.nc.Subscribe(r.subject, func(m *nats.Msg) {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.serve(ctx, m)
		}()
	})
	if err != nil {
		cancel()
		return fmt.Errorf("subscribe %s: %w", r.subject, err)
	}
	r.mu.Lock()
	r.sub, r.cancel = sub, cancel
	r.mu.Unlock()
	return nil
}

func (r *Responder) serve(ctx context.Context, m *nats.Msg) {
	var req Request
	var resp Response
	if err := json.Unmarshal(m.Data, &req); err != nil || req.Job == "" || req.Method == "" {
		resp.Error = "malformed proxy request: want {job, method, params}"
	} else if res, err := r.h.Handle(ctx, req); err != nil {
		resp.Error = err.Error()
	} else {
		resp.Result = res
	}
	data, err := json.Marshal(resp)
	if err != nil {
		data, _ = json.Marshal(Response{Error: "encode proxy response: " + err.Error()})
	}
	if len(data) > int(r.nc.MaxPayload()) {
		data, _ = json.Marshal(Response{Error: fmt.Sprintf("result of %d bytes exceeds the %d-byte message limit", len(data), r.nc.MaxPayload())})
	}
	_ = m.Respond(data)
}

// Stop unsubscribes and waits for in-flight requests. It is idempotent.
func (r *Responder) Stop() {
	r.mu.Lock()
	sub, cancel := r.sub, r.cancel
	r.sub, r.cancel = nil, nil
	r.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
	if cancel != nil {
		cancel()
	}
	r.wg.Wait()
}

// ErrNoResponder is returned by Call when no front-end answers the subject.
var ErrNoResponder = errors.New("the front-end that submitted this job is not reachable")

// Call sends req to subject and returns the result.
// hdr, when given, travels with the request (e.g. the job's trace context).
func Call(ctx context.Context, nc *nats.Conn, subject string, req Request, hdr ...nats.Header) (json.RawMessage, error) {
	data, err := json.Marshal(req)
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
	msg, err := nc.RequestMsgWithContext(ctx, out)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, ErrNoResponder
	}
	if err != nil {
		return nil, fmt.Errorf("proxy call %s: %w", req.Method, err)
	}
	var resp Response
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("decode proxy response: %w", err)
	}
	if resp.Error != "" {
		return nil, errors.New(resp.Error)
	}
	return resp.Result, nil
}
