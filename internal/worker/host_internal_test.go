package worker

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/testutil/natstest"
)

// TestTryAgainIsSentAgain: a memory write whose answer says to try again
// (the front-end's state service failing over) is sent again with the same
// call id, and the call's result is the next answer; a call_tool so
// answered is not sent again, and its error is the answer's.
func TestTryAgainIsSentAgain(t *testing.T) {
	nc := natstest.Conn(t)

	var ids []string
	sub, err := nc.Subscribe("proxy.test", func(m *nats.Msg) {
		var req proxy.Request
		if err := json.Unmarshal(m.Data, &req); err != nil {
			t.Error(err)
			return
		}
		ids = append(ids, req.CallID)
		resp := proxy.Response{Error: "memory: the state service is unreachable", Retry: true}
		if len(ids) == 2 {
			resp = proxy.Response{Result: json.RawMessage(`{"version":7}`)}
		}
		data, _ := json.Marshal(resp)
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := callRetrying(ctx, nc, "proxy.test", proxy.Request{Job: "j", Method: proxy.MethodMemoryPut, CallID: "c1"}, nats.Header{})
	if err != nil || string(res) != `{"version":7}` {
		t.Fatalf("memory_put: %s %v, want the second answer", res, err)
	}
	if len(ids) != 2 || ids[0] != "c1" || ids[1] != "c1" {
		t.Fatalf("call ids sent %q, want c1 twice", ids)
	}

	ids = nil
	_, err = callRetrying(ctx, nc, "proxy.test", proxy.Request{Job: "j", Method: proxy.MethodCallTool, CallID: "c2"}, nats.Header{})
	if !errors.Is(err, proxy.ErrTryAgain) || err.Error() != "memory: the state service is unreachable" || len(ids) != 1 {
		t.Fatalf("call_tool: %v after %d sends, want the first answer's error", err, len(ids))
	}
}
