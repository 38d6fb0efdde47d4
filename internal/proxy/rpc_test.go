package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobclock"
	"github.com/mcpexec/mcpexec/internal/testutil/natstest"
)

var errTimeUp = errors.New("time is up")

// TestParkedCallStopsTheClock: a responder's "waiting" notice stops the
// caller's job clock until its "no longer waiting" notice, and the answer
// after them is the call's result.
func TestParkedCallStopsTheClock(t *testing.T) {
	nc := natstest.Conn(t)
	r := NewResponder(nc, "", HandlerFunc(func(ctx context.Context, req Request) (json.RawMessage, error) {
		done := Waiting(ctx, time.Minute)
		time.Sleep(1500 * time.Millisecond) // longer than the job's whole budget
		done()
		return json.RawMessage(`"approved"`), nil
	}))
	if err := r.Start("proxy.test"); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(time.Second)
	ctx, clock, cancel := jobclock.WithBudget(context.Background(), time.Second, errTimeUp)
	defer cancel()
	res, err := Call(ctx, nc, "proxy.test", Request{Job: "j", Method: MethodCallTool, Parks: true})
	if err != nil || string(res) != `"approved"` {
		t.Fatalf("call: %s %v", res, err)
	}
	if _, paused := clock.Times(); paused < time.Second {
		t.Fatalf("the clock stood still %s, want the wait", paused)
	}
	if ctx.Err() != nil {
		t.Fatalf("the job's budget ran out while its call waited: %v", context.Cause(ctx))
	}
}

// TestLostAnswerDoesNotStopTheClockForEver: a responder that says it waits
// and never answers (its later messages lost, or refused by a NATS
// configuration that allows one response) holds the clock only for the
// wait it announced; then the job's time runs out as usual.
func TestLostAnswerDoesNotStopTheClockForEver(t *testing.T) {
	nc := natstest.Conn(t)
	sub, err := nc.Subscribe("proxy.test", func(m *nats.Msg) {
		yes := true
		data, _ := json.Marshal(Response{Waiting: &yes, WaitMS: 100})
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	ctx, _, cancel := jobclock.WithBudget(context.Background(), 200*time.Millisecond, errTimeUp)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Call(ctx, nc, "proxy.test", Request{Job: "j", Method: MethodCallTool, Parks: true})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !errors.Is(context.Cause(ctx), errTimeUp) {
			t.Fatalf("call ended with %v, job with %v: want its time up", err, context.Cause(ctx))
		}
	case <-time.After(time.Minute):
		t.Fatal("the clock stood still for a minute after a wait announced for 100 ms")
	}
}

// TestRequestWithoutParksHearsOnlyTheAnswer: a worker that does not say it
// Parks gets no notices (an older worker would take one for the answer).
func TestRequestWithoutParksHearsOnlyTheAnswer(t *testing.T) {
	nc := natstest.Conn(t)
	r := NewResponder(nc, "", HandlerFunc(func(ctx context.Context, req Request) (json.RawMessage, error) {
		Waiting(ctx, time.Minute)()
		return json.RawMessage(`"answer"`), nil
	}))
	if err := r.Start("proxy.test"); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(time.Second)
	res, err := Call(context.Background(), nc, "proxy.test", Request{Job: "j", Method: MethodCallTool})
	if err != nil || string(res) != `"answer"` {
		t.Fatalf("call: %s %v", res, err)
	}
}

// TestParkedCallEnds: a parking call with no responder hears ErrNoResponder
// at once, and one whose connection closes while it waits ends with the
// connection's error, well before its context.
func TestParkedCallEnds(t *testing.T) {
	nc := natstest.Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := Call(ctx, nc, "proxy.nobody", Request{Job: "j", Method: MethodCallTool, Parks: true}); !errors.Is(err, ErrNoResponder) {
		t.Fatalf("no responder: %v", err)
	}
	sub, err := nc.Subscribe("proxy.silent", func(*nats.Msg) {}) // hears, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	done := make(chan error, 1)
	go func() {
		_, err := Call(ctx, nc, "proxy.silent", Request{Job: "j", Method: MethodCallTool, Parks: true})
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	nc.Close()
	select {
	case err := <-done:
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Fatalf("closed connection: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a parked call waited on a closed connection")
	}
}

// TestAnswerSaysTryAgain: a retryable call that failed because a part was
// unreachable, or because its bound passed, is answered with Retry, which
// the caller sees as ErrTryAgain with the handler's text; a call_tool (not
// retryable) and an error of any other kind are final.
func TestAnswerSaysTryAgain(t *testing.T) {
	nc := natstest.Conn(t)
	unreachable := errs.New(errs.Unavailable, "the state service is unreachable")
	r := NewResponder(nc, "", HandlerFunc(func(ctx context.Context, req Request) (json.RawMessage, error) {
		switch string(req.Params) {
		case `"unreachable"`:
			return nil, fmt.Errorf("memory: %w", unreachable)
		case `"bound"`:
			<-ctx.Done()
			return nil, fmt.Errorf("memory: %w", ctx.Err())
		}
		return nil, errs.New(errs.Conflict, "memory: version 3 is not the key's")
	}))
	if err := r.Start("proxy.test"); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(time.Second)
	for _, c := range []struct {
		method, params string
		again          bool
	}{
		{MethodMemoryPut, `"unreachable"`, true},
		{MethodMemoryPut, `"bound"`, true},
		{MethodMemoryPut, `"conflict"`, false},
		{MethodCallTool, `"unreachable"`, false},
	} {
		req := Request{Job: "j", Method: c.method, Params: json.RawMessage(c.params), TimeoutMS: 100}
		_, err := Call(context.Background(), nc, "proxy.test", req)
		if err == nil || errors.Is(err, ErrTryAgain) != c.again || !strings.HasPrefix(err.Error(), "memory: ") {
			t.Errorf("%s %s: %v, want ErrTryAgain %v with the handler's text", c.method, c.params, err, c.again)
		}
	}
}
