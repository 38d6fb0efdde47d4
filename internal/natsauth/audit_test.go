package natsauth_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/natsauth"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestForgedAuditEntriesAreRefused attacks the audit trail from a worker
// host's credential: it may neither publish an entry nor read the trail;
// entries that reach the audit stream without a front-end's proof (a fleet
// without permissions, another key, another namespace's subject) are never
// kept; and the worker's 8 MB of tool arguments (10 MB are over the proxy's
// request limit), sent with its job's capability, are digested and clipped,
// not stored whole.
func TestForgedAuditEntriesAreRefused(t *testing.T) {
	t.Parallel()
	_, connect := fleet(t)
	wnc, wr := connect(natsauth.RoleWorker)
	testutil.WorkerOn(t, wnc, testutil.ProcessRuntime(t), worker.DefaultConfig("w1"))
	fnc, _ := connect(natsauth.RoleFrontend)
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	fe := testutil.FrontendOnWith(t, fnc, frontend.Config{ID: "fe1", Tools: pool, Policy: frontend.DefaultPolicy()})
	bnc, _ := connect(natsauth.RoleBroker)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sub := jobs.Subjects{}
	bjs, _ := jetstream.New(bnc)
	key, err := queue.ProxyKey(ctx, bjs, sub)
	if err != nil {
		t.Fatal(err)
	}
	forge := func(ns, tool string, sign []byte) []byte {
		e := audit.Entry{ID: tool, JobID: jobs.ScopedID(ns, "j"), Attempt: 1, Namespace: ns, Server: "ts", Tool: tool,
			Decision: audit.DecisionAllow, DecidedBy: audit.DecidedByPolicy, Outcome: audit.OutcomeOK, At: time.Now().UTC()}
		if sign != nil {
			audit.Sign(sign, &e)
		}
		data, _ := json.Marshal(e)
		return data
	}

	// The worker identity can neither write an entry nor read the trail.
	_ = wnc.Publish(sub.Audit("a"), forge("a", "forged-by-worker", audit.Key(key)))
	wr.wait(t, `Permissions Violation for Publish to "`+sub.Audit("a")+`"`)
	_, _ = wnc.Request(sub.State(state.OpAuditList), []byte(`{"namespace":"a"}`), 300*time.Millisecond)
	wr.wait(t, `Permissions Violation for Publish to "`+sub.State(state.OpAuditList)+`"`)

	// Entries that reach the stream anyway (as in a fleet without NATS
	// permissions) are kept only with a front-end's proof on their own
	// namespace's subject.
	for _, m := range []struct {
		subject string
		data    []byte
	}{
		{sub.Audit("a"), forge("a", "unsigned", nil)},
		{sub.Audit("a"), forge("a", "other-key", audit.Key([]byte("a key of the attacker's")))},
		{sub.Audit("a"), forge("b", "moved-from-b", audit.Key(key))},
		{sub.Audit("a"), []byte(`{"namespace": "a", "tool": "not even an entry`)},
		{sub.Audit("a"), []byte(strings.Repeat("x", 64<<10))},
	} {
		if _, err := bjs.Publish(ctx, m.subject, m.data); err != nil {
			t.Fatal(err)
		}
	}

	// A running job of namespace a, whose capability the worker holds: the
	// worker calls a tool with 10 MB of arguments itself.
	out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "slow", Code: "import time\ntime.sleep(60)", Timeout: 90, Servers: []string{"ts"}}}, "a")
	if out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	for {
		rec, err := fe.Get(ctx, "a", "slow")
		if err == nil && rec.Status == jobs.StatusRunning {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("job never ran: %+v %v", rec, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	id := jobs.ScopedID("a", "slow")
	call := func(blob int) string {
		params, _ := json.Marshal(map[string]any{"server": "ts", "tool": "add", "arguments": map[string]any{"a": 1, "b": 2, "blob": strings.Repeat("y", blob)}})
		req, _ := json.Marshal(proxy.Request{Job: id, Attempt: 1, Capability: jobs.Capability(key, id), Method: proxy.MethodCallTool, Params: params, CallID: "c1"})
		reply, err := wnc.RequestMsgWithContext(ctx, &nats.Msg{Subject: sub.ProxyServer("ts"), Data: req})
		if err != nil {
			t.Fatalf("the worker's call: %v", err)
		}
		return string(reply.Data)
	}
	// 10 MB is over the proxy's request limit: refused before it is
	// looked at (and so never audited); 8 MB is answered and audited.
	if got := call(10 << 20); !strings.Contains(got, "over the") {
		t.Fatalf("10 MB call: %.200s", got)
	}
	if got := call(8_000_000); !strings.Contains(got, "sum") {
		t.Fatalf("8 MB call: %.200s", got)
	}
	var views []audit.View
	for {
		views, _, err = fe.AuditEntries(ctx, "a", audit.Query{})
		if err == nil && len(views) > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the call's entry never came: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(views) != 1 {
		t.Fatalf("namespace a's trail holds %d entries, want the real one: %+v", len(views), views)
	}
	v := views[0]
	if v.Tool != "add" || v.JobID != "slow" || v.Index != 1 || v.Prev != audit.Genesis || v.ArgsBytes < 8_000_000 || len(v.Args) > audit.PreviewBytes || !v.ArgsClipped {
		t.Fatalf("entry %+v", v)
	}
	if b, _, err := fe.AuditEntries(ctx, "b", audit.Query{}); err != nil || len(b) != 0 {
		t.Fatalf("namespace b: %+v %v", b, err)
	}
	if err := fe.Cancel(ctx, "a", "slow", "test"); err != nil {
		t.Fatal(err)
	}
}
