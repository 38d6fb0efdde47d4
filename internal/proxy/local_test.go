package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobclock"
	"github.com/mcpexec/mcpexec/internal/testutil/natstest"
)

// localHandler answers by the call's id: "ok" with a result, "down" with
// an error a retryable call may be sent again for, "park" after a wait
// announced with Waiting, "slow" once ctx ends or after three seconds.
var localHandler = HandlerFunc(func(ctx context.Context, req Request) (json.RawMessage, error) {
	switch req.CallID {
	case "down":
		return nil, errs.New(errs.Unavailable, "the state service is unreachable")
	case "park":
		done := Waiting(ctx, time.Minute)
		time.Sleep(300 * time.Millisecond)
		done()
	case "slow":
		select {
		case <-ctx.Done():
		case <-time.After(3 * time.Second):
		}
	}
	return json.Marshal(map[string]any{"job": req.Job, "params": req.Params, "timeout_ms_set": req.TimeoutMS > 0})
})

// TestLocalAnswersAsNATS: a call answered in process (Local) gets what the
// same call over NATS gets, for every kind of answer: a result, the
// envelope's refusals (no job, no method, an unknown method, parameters
// over the limit), an error to send again, and a parking call whose wait
// stops the job's clock.
func TestLocalAnswersAsNATS(t *testing.T) {
	nc := natstest.Conn(t)
	r := NewResponder(nc, "", localHandler)
	if err := r.Start("proxy.test"); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(time.Second)
	local := &Local{}
	local.Set(r)
	big := json.RawMessage(`"` + strings.Repeat("x", MaxRequest) + `"`)
	for _, req := range []Request{
		{Job: "j", Method: MethodCallTool, CallID: "ok", Params: json.RawMessage(`{"server":"s","tool":"t"}`)},
		{Method: MethodCallTool, CallID: "ok"},
		{Job: "j", CallID: "ok"},
		{Job: "j", Method: "rm_rf", CallID: "ok"},
		{Job: "j", Method: MethodMemoryPut, CallID: "ok", Params: big},
		{Job: "j", Method: MethodMemoryPut, CallID: "down"},
		{Job: "j", Method: MethodCallTool, CallID: "park", Parks: true},
	} {
		type outcome struct {
			res, err string
			again    bool
			paused   bool
		}
		do := func(call func(ctx context.Context) (json.RawMessage, error)) outcome {
			ctx, clock, cancel := jobclock.WithBudget(context.Background(), time.Minute, errTimeUp)
			defer cancel()
			res, err := call(ctx)
			o := outcome{res: string(res), again: errors.Is(err, ErrTryAgain)}
			if err != nil {
				o.err = err.Error()
			}
			_, paused := clock.Times()
			o.paused = paused >= 250*time.Millisecond
			return o
		}
		overNATS := do(func(ctx context.Context) (json.RawMessage, error) { return Call(ctx, nc, "proxy.test", req) })
		inProcess := do(func(ctx context.Context) (json.RawMessage, error) {
			res, served, err := local.Call(ctx, "proxy.test", req, nil)
			if !served {
				t.Fatalf("%s: not served in process", req.CallID)
			}
			return res, err
		})
		if overNATS != inProcess {
			t.Errorf("job %q method %q call %q: over NATS %+v, in process %+v", req.Job, req.Method, req.CallID, overNATS, inProcess)
		}
		if req.CallID == "park" && !inProcess.paused {
			t.Errorf("a parked call in process did not stop the clock: %+v", inProcess)
		}
	}
}

// TestLocalServesOnlyItsSubjects: a Local answers only what its Responder
// serves; anything else, and everything once the Responder stops or before
// one is set, is left to NATS (served false, nothing done).
func TestLocalServesOnlyItsSubjects(t *testing.T) {
	nc := natstest.Conn(t)
	var local Local
	req := Request{Job: "j", Method: MethodCallTool, CallID: "ok"}
	if _, served, _ := local.Call(context.Background(), "proxy.test", req, nil); served {
		t.Fatal("a Local without a Responder served a call")
	}
	r := NewResponder(nc, "", localHandler)
	if err := r.Start("proxy.test"); err != nil {
		t.Fatal(err)
	}
	local.Set(r)
	if _, served, _ := local.Call(context.Background(), "proxy.other", req, nil); served {
		t.Fatal("a subject the Responder does not serve was served in process")
	}
	if _, served, err := local.Call(context.Background(), "proxy.test", req, nil); !served || err != nil {
		t.Fatalf("its own subject: served %v, %v", served, err)
	}
	r.Stop(time.Second)
	if _, served, _ := local.Call(context.Background(), "proxy.test", req, nil); served {
		t.Fatal("a stopped Responder served a call")
	}
	local.Clear(r)
	if local.r.Load() != nil {
		t.Fatal("Clear kept the Responder")
	}
}

// TestLocalCallEndsWithItsContext: a caller that goes away (its job
// cancelled) returns at once, as over NATS; its handler runs on within its
// bound, and Stop waits for it; a call over the Responder's bound is
// answered busy.
func TestLocalCallEndsWithItsContext(t *testing.T) {
	nc := natstest.Conn(t)
	handled := make(chan struct{})
	r := NewResponder(nc, "", HandlerFunc(func(ctx context.Context, req Request) (json.RawMessage, error) {
		defer close(handled)
		return localHandler(ctx, req)
	}))
	r.MaxInFlight = 1
	if err := r.Start("proxy.test"); err != nil {
		t.Fatal(err)
	}
	var local Local
	local.Set(r)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := local.Call(ctx, "proxy.test", Request{Job: "j", Method: MethodCallTool, CallID: "slow"}, nil)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	_, served, err := local.Call(context.Background(), "proxy.test", Request{Job: "j", Method: MethodCallTool, CallID: "ok"}, nil)
	if !served || err == nil || err.Error() != busyError {
		t.Fatalf("a call over the bound: served %v, %v", served, err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the cancelled call: %v", err)
		}
	case <-time.After(500 * time.Millisecond):
		t.Fatal("a cancelled call waited for its handler")
	}
	select {
	case <-handled:
		t.Fatal("the handler ended with its caller")
	default:
	}
	r.Stop(10 * time.Second)
	select {
	case <-handled:
	default:
		t.Fatal("Stop returned before the handler in flight ended")
	}
}
