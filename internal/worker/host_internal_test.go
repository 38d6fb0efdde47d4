package worker

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/testutil/natstest"
)

// TestTryAgainIsSentAgain: a memory write whose answer says to try again
// (the front-end's state service failing over) is sent again with the same
// call id, and the call's result is the next answer; a call_tool so
// answered (its method not retryable, the responder does not say Retry) is
// not sent again, and its error is the answer's. Both ways a
// call goes: over NATS, and to a front-end in this process (proxy.Local).
func TestTryAgainIsSentAgain(t *testing.T) {
	for _, inProcess := range []bool{false, true} {
		name := "nats"
		if inProcess {
			name = "local"
		}
		t.Run(name, func(t *testing.T) {
			nc := natstest.Conn(t)
			var mu sync.Mutex
			var ids []string
			r := proxy.NewResponder(nc, "", proxy.HandlerFunc(func(_ context.Context, req proxy.Request) (json.RawMessage, error) {
				mu.Lock()
				defer mu.Unlock()
				ids = append(ids, req.CallID)
				if len(ids) == 2 {
					return json.RawMessage(`{"version":7}`), nil
				}
				return nil, errs.New(errs.Unavailable, "memory: the state service is unreachable")
			}))
			if err := r.Start("proxy.test"); err != nil {
				t.Fatal(err)
			}
			defer r.Stop(time.Second)
			var local *proxy.Local
			if inProcess {
				local = &proxy.Local{}
				local.Set(r)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res, err := callRetrying(ctx, nc, local, "proxy.test", proxy.Request{Job: "j", Method: proxy.MethodMemoryPut, CallID: "c1"}, nil)
			if err != nil || string(res) != `{"version":7}` {
				t.Fatalf("memory_put: %s %v, want the second answer", res, err)
			}
			mu.Lock()
			if len(ids) != 2 || ids[0] != "c1" || ids[1] != "c1" {
				t.Fatalf("call ids sent %q, want c1 twice", ids)
			}
			ids = nil
			mu.Unlock()
			_, err = callRetrying(ctx, nc, local, "proxy.test", proxy.Request{Job: "j", Method: proxy.MethodCallTool, CallID: "c2"}, nil)
			mu.Lock()
			defer mu.Unlock()
			if err == nil || err.Error() != "memory: the state service is unreachable" || len(ids) != 1 {
				t.Fatalf("call_tool: %v after %d sends, want the first answer's error", err, len(ids))
			}
		})
	}
}
