package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// modernReq is one 2026-07-28 request over HTTP.
type modernReq struct {
	token, method string
	params        map[string]any
	ext           bool              // declare the tasks extension
	elicits       bool              // declare elicitation
	headers       map[string]string // over the standard ones
}

type modernReply struct {
	status int
	result map[string]any
	err    *struct {
		Code    int            `json:"code"`
		Message string         `json:"message"`
		Data    map[string]any `json:"data"`
	}
	raw []byte
}

// post sends r to url/mcp with the standard headers of its method.
func (r modernReq) post(t *testing.T, url string) modernReply {
	t.Helper()
	caps := map[string]any{}
	if r.ext {
		caps["extensions"] = map[string]any{mcpserver.TasksExtension: map[string]any{}}
	}
	if r.elicits {
		caps["elicitation"] = map[string]any{}
	}
	params := maps.Clone(r.params)
	if params == nil {
		params = map[string]any{}
	}
	params["_meta"] = map[string]any{mcp.MetaKeyProtocolVersion: "2026-07-28", mcp.MetaKeyClientCapabilities: caps,
		"io.modelcontextprotocol/clientInfo": map[string]any{"name": "tasksext-test", "version": "1"}}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 9, "method": r.method, "params": params})
	req, _ := http.NewRequest(http.MethodPost, url+"/mcp", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+r.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", r.method)
	if name, ok := r.params["name"].(string); ok {
		req.Header.Set("Mcp-Name", name)
	}
	if id, ok := r.params["taskId"].(string); ok {
		req.Header.Set("Mcp-Name", id)
	}
	for k, v := range r.headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read below
	b, _ := io.ReadAll(resp.Body)
	if i := bytes.Index(b, []byte("data: ")); i >= 0 { // an event stream: its one message
		b = b[i+len("data: "):]
	}
	out := modernReply{status: resp.StatusCode, raw: b}
	var msg struct {
		Result map[string]any `json:"result"`
		Error  *struct {
			Code    int            `json:"code"`
			Message string         `json:"message"`
			Data    map[string]any `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &msg); err != nil {
		t.Fatalf("%s: HTTP %d %s: %v", r.method, resp.StatusCode, b, err)
	}
	out.result, out.err = msg.Result, msg.Error
	return out
}

func (r modernReply) ok(t *testing.T) map[string]any {
	t.Helper()
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("HTTP %d: %s", r.status, r.raw)
	}
	return r.result
}

func (r modernReply) wantError(t *testing.T, status, code int, contains string) {
	t.Helper()
	if r.err == nil || r.err.Code != code || r.status != status || !strings.Contains(r.err.Message, contains) {
		t.Fatalf("want HTTP %d, error %d containing %q; got HTTP %d %s", status, code, contains, r.status, r.raw)
	}
}

// pollTask polls tasks/get on url until the task's status is one of want.
func pollTask(t *testing.T, url, token, id string, want ...string) map[string]any {
	t.Helper()
	for waited := time.Now(); ; {
		got := modernReq{token: token, method: "tasks/get", params: map[string]any{"taskId": id}, ext: true}.post(t, url).ok(t)
		if slices.Contains(want, got["status"].(string)) {
			return got
		}
		if s := got["status"].(string); s == "completed" || s == "failed" || s == "cancelled" || time.Since(waited) > time.Minute {
			t.Fatalf("task %s is %s, want %v: %v", id, s, want, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serveTasksWith serves r (a front-end, or one wrapped) like serveTasks.
func serveTasksWith(t *testing.T, r jobs.Service) string {
	t.Helper()
	opts := mcpserver.Options{Namespace: httpauth.Namespace}
	srv := mcpserver.New(r, opts)
	tasks := mcpserver.NewTasks(srv, r, opts, 0)
	t.Cleanup(tasks.Close)
	hs := httptest.NewServer(mcpserver.Handler(srv, mcpserver.HTTPOptions{Tasks: tasks, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"token-alpha": "alpha", "token-beta": "beta"}})}))
	t.Cleanup(hs.Close)
	return hs.URL
}

// TestTasksExtensionAnyFrontend: the tasks extension's wire (SEP-2663) on
// 2026-07-28 requests. A client that declares the extension gets run_python
// as a task on one front-end and its result inlined by tasks/get on
// another; cancels it from either; another namespace cannot name it; a
// client that does not declare it gets the tool's result, and -32021 from
// the task methods; hostile or mistaken requests get errors that say what to
// do.
func TestTasksExtensionAnyFrontend(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.NewFakeRuntime(64), worker.DefaultConfig("w1"))
	url1 := serveTasks(t, testutil.Frontend(t, b, "fe1"))
	url2 := serveTasks(t, testutil.Frontend(t, b, "fe2"))
	call := func(code string, ext bool, extra map[string]any) modernReq {
		p := map[string]any{"name": "run_python", "arguments": map[string]any{"code": code}}
		maps.Copy(p, extra)
		return modernReq{token: "token-alpha", method: "tools/call", params: p, ext: ext}
	}

	// server/discover advertises the extension, not the 2025-11-25 capability.
	disc := modernReq{token: "token-alpha", method: "server/discover"}.post(t, url1).ok(t)
	caps, _ := disc["capabilities"].(map[string]any)
	ext, _ := caps["extensions"].(map[string]any)
	if _, ok := ext[mcpserver.TasksExtension]; !ok || caps["tasks"] != nil {
		t.Fatalf("discover capabilities %v", caps)
	}

	// Server-directed creation: a flat CreateTaskResult.
	created := call("sleep 300ms", true, nil).post(t, url1).ok(t)
	id, _ := created["taskId"].(string)
	if created["resultType"] != "task" || id == "" || created["status"] != "working" ||
		created["ttlMs"] != float64((7*24*time.Hour).Milliseconds()) || created["pollIntervalMs"].(float64) <= 0 {
		t.Fatalf("created %v", created)
	}
	for _, k := range []string{"task", "ttl", "pollInterval", "result", "error", "inputRequests", "requestState"} {
		if _, ok := created[k]; ok {
			t.Errorf("CreateTaskResult carries %q: %v", k, created)
		}
	}
	// Found at once by another front-end, then its result inlined.
	if got := (modernReq{token: "token-alpha", method: "tasks/get", params: map[string]any{"taskId": id}, ext: true}).post(t, url2).ok(t); got["taskId"] != id || got["resultType"] != "complete" {
		t.Fatalf("immediate get on fe2 %v", got)
	}
	done := pollTask(t, url2, "token-alpha", id, "completed")
	res, _ := done["result"].(map[string]any)
	content, _ := res["content"].([]any)
	if done["resultType"] != "complete" || len(content) == 0 || content[0].(map[string]any)["text"] != "sleep 300ms" ||
		res["isError"] == true || res["resultType"] != "complete" || res["_meta"] != nil || done["error"] != nil {
		t.Fatalf("completed %v", done)
	}

	// Another namespace cannot name it.
	for _, m := range []string{"tasks/get", "tasks/cancel", "tasks/update"} {
		modernReq{token: "token-beta", method: m, params: map[string]any{"taskId": id, "inputResponses": map[string]any{}}, ext: true}.
			post(t, url2).wantError(t, 400, -32602, "not found")
	}

	// Cancel, from the other front-end: an empty acknowledgement, then cancelled.
	blocked := call("block", true, nil).post(t, url1).ok(t)["taskId"].(string)
	ack := modernReq{token: "token-alpha", method: "tasks/cancel", params: map[string]any{"taskId": blocked}, ext: true}.post(t, url2).ok(t)
	if len(ack) != 1 || ack["resultType"] != "complete" {
		t.Fatalf("cancel ack %v", ack)
	}
	pollTask(t, url1, "token-alpha", blocked, "cancelled")
	if again := (modernReq{token: "token-alpha", method: "tasks/cancel", params: map[string]any{"taskId": blocked}, ext: true}).post(t, url1).ok(t); again["resultType"] != "complete" {
		t.Fatalf("cancel of an ended task %v", again)
	}

	// A client that does not declare the extension: the tool's result (a
	// legacy task param changes nothing), and -32021 from the task methods.
	for _, extra := range []map[string]any{nil, {"task": map[string]any{"ttl": -1}}} {
		sync := call("sleep 10ms", false, extra).post(t, url1).ok(t)
		if sync["taskId"] != nil || sync["resultType"] == "task" || sync["task"] != nil || sync["content"] == nil {
			t.Fatalf("tools/call without the extension (%v): %v", extra, sync)
		}
	}
	for _, m := range []string{"tasks/get", "tasks/update", "tasks/cancel"} {
		r := modernReq{token: "token-alpha", method: m, params: map[string]any{"taskId": "gate-test", "inputResponses": map[string]any{}}}.post(t, url2)
		r.wantError(t, 400, -32021, mcpserver.TasksExtension)
		need, _ := r.err.Data["requiredCapabilities"].(map[string]any)
		if exts, _ := need["extensions"].(map[string]any); exts[mcpserver.TasksExtension] == nil {
			t.Fatalf("%s: data %v", m, r.err.Data)
		}
	}
	modernReq{token: "token-alpha", method: "subscriptions/listen", params: map[string]any{"notifications": map[string]any{"taskIds": []string{id}}}}.
		post(t, url1).wantError(t, 400, -32021, mcpserver.TasksExtension)
	// The 2025-11-25 methods are not the extension's.
	for _, m := range []string{"tasks/result", "tasks/list"} {
		modernReq{token: "token-alpha", method: m, params: map[string]any{"taskId": id}, ext: true}.post(t, url1).wantError(t, 404, -32601, "tasks/get")
	}

	// A legacy task param with a bad ttl is ignored: the server chooses.
	odd := call("sleep 10ms", true, map[string]any{"task": map[string]any{"ttl": "forever"}}).post(t, url1).ok(t)
	if odd["resultType"] != "task" || odd["ttlMs"] != created["ttlMs"] {
		t.Fatalf("task with a bad legacy ttl %v", odd)
	}

	// Hostile or mistaken requests.
	for _, c := range []struct {
		method   string
		params   map[string]any
		headers  map[string]string
		status   int
		code     int
		contains string
	}{
		{"tasks/get", map[string]any{}, nil, 400, -32602, "taskId is required"},
		{"tasks/get", map[string]any{"taskId": 7}, nil, 400, -32602, "taskId is required"},
		{"tasks/get", map[string]any{"taskId": "../../etc/passwd"}, nil, 400, -32602, "not found"},
		{"tasks/get", map[string]any{"taskId": strings.Repeat("x", 5000)}, nil, 400, -32602, "not found"},
		{"tasks/cancel", map[string]any{"taskId": "01HZZZZZZZZZZZZZZZZZZZZZZZ"}, nil, 400, -32602, "not found"},
		{"tasks/update", map[string]any{"taskId": id}, nil, 400, -32602, "inputResponses"},
		{"tasks/update", map[string]any{"taskId": id, "inputResponses": "yes"}, nil, 400, -32602, "inputResponses"},
		{"tasks/update", map[string]any{"taskId": "nope", "inputResponses": map[string]any{}}, nil, 400, -32602, "not found"},
		{"tasks/get", map[string]any{"taskId": id}, map[string]string{"Mcp-Name": "another-task"}, 400, -32020, "Mcp-Name"},
		{"tasks/get", map[string]any{"taskId": id}, map[string]string{"Mcp-Method": "tasks/cancel"}, 400, -32020, "Mcp-Method"},
		{"tools/call", map[string]any{"name": "run_python", "arguments": map[string]any{}}, nil, 400, -32602, "code is required"},
		{"tools/call", map[string]any{"name": "run_python", "arguments": map[string]any{"code": "x", "timeout": 99999}}, nil, 400, -32602, "timeout"},
	} {
		modernReq{token: "token-alpha", method: c.method, params: c.params, ext: true, headers: c.headers}.post(t, url1).wantError(t, c.status, c.code, c.contains)
	}

	// The 2025-11-25 tasks are as they were: initialize still declares them.
	if r := httpRPC(t, url1, "token-alpha", "initialize", map[string]any{"protocolVersion": "2025-11-25",
		"clientInfo": map[string]any{"name": "t", "version": "0"}, "capabilities": map[string]any{}}); r.Error != nil || !strings.Contains(string(r.Result), `"tasks"`) {
		t.Fatalf("initialize: %+v %s", r.Error, r.Result)
	}
}

// approvalsDouble is a front-end whose parked calls are a map: the test
// parks calls by hand and reads the answers that reach it.
type approvalsDouble struct {
	*frontend.Frontend
	mu      sync.Mutex                          // guards pending and decided
	pending map[string]map[string]jobs.Approval // namespace → id → call
	decided map[string][3]string                // id → decision, by, reason
}

func (d *approvalsDouble) park(ns string, ap jobs.Approval) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pending[ns] == nil {
		d.pending[ns] = map[string]jobs.Approval{}
	}
	d.pending[ns][ap.ID] = ap
}

func (d *approvalsDouble) Approvals(_ context.Context, ns string) ([]jobs.Approval, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Collect(maps.Values(d.pending[ns])), nil
}

func (d *approvalsDouble) DecideApproval(_ context.Context, ns, id, decision, by, reason string) (jobs.Approval, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ap, ok := d.pending[ns][id]
	if !ok {
		return jobs.Approval{}, &errs.Error{Kind: errs.NotFound, Msg: "no such approval"}
	}
	delete(d.pending[ns], id)
	d.decided[id] = [3]string{decision, by, reason}
	return ap, nil
}

func (d *approvalsDouble) FollowApprovals(ctx context.Context, _ string, _ func(jobs.ApprovalEvent) error) error {
	<-ctx.Done()
	return ctx.Err()
}

var _ jobs.Service = (*approvalsDouble)(nil)

// TestTasksExtensionApproval: a call of a task's job parked for approval
// makes the task input_required, with a form elicitation asking about it in
// inputRequests; tasks/update answers it; answers to keys that are not the
// task's waiting calls change nothing.
func TestTasksExtensionApproval(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.NewFakeRuntime(64), worker.DefaultConfig("w1"))
	d := &approvalsDouble{Frontend: testutil.Frontend(t, b, "fe1"), pending: map[string]map[string]jobs.Approval{}, decided: map[string][3]string{}}
	url := serveTasksWith(t, d)

	id := modernReq{token: "token-alpha", method: "tools/call", ext: true,
		params: map[string]any{"name": "run_python", "arguments": map[string]any{"code": "block"}}}.post(t, url).ok(t)["taskId"].(string)
	if got := pollTask(t, url, "token-alpha", id, "working"); got["inputRequests"] != nil {
		t.Fatalf("nothing parked yet: %v", got)
	}
	call := jobs.Approval{ID: "ap-1", JobID: id, Server: "ts", Tool: "add", Arguments: json.RawMessage(`{"a":1,"b":2}`), Rule: "ts/add", AskedAt: time.Now()}
	d.park("alpha", call)
	d.park("alpha", jobs.Approval{ID: "ap-other-job", JobID: "another-job", Server: "ts", Tool: "add", AskedAt: time.Now()})
	d.park("beta", jobs.Approval{ID: "ap-beta", JobID: id, Server: "ts", Tool: "add", AskedAt: time.Now()})

	got := pollTask(t, url, "token-alpha", id, "input_required")
	asks, _ := got["inputRequests"].(map[string]any)
	ask, _ := asks["ap-1"].(map[string]any)
	params, _ := ask["params"].(map[string]any)
	schema, _ := params["requestedSchema"].(map[string]any)
	props, _ := schema["properties"].(map[string]any)
	if len(asks) != 1 || ask["method"] != "elicitation/create" || params["mode"] != "form" || props["approve"] == nil ||
		!strings.Contains(params["message"].(string), `ts/add with {"a":1,"b":2}`) {
		t.Fatalf("input_required task %v", got)
	}

	update := func(token string, responses any) modernReply {
		return modernReq{token: token, method: "tasks/update", ext: true, params: map[string]any{"taskId": id, "inputResponses": responses}}.post(t, url)
	}
	// Beta cannot answer alpha's task; keys that are not this task's waiting
	// calls are ignored; a malformed answer to a waiting call is refused.
	update("token-beta", map[string]any{"ap-1": map[string]any{"action": "accept", "content": map[string]any{"approve": true}}}).wantError(t, 400, -32602, "not found")
	if ack := update("token-alpha", map[string]any{"ap-other-job": map[string]any{"action": "accept", "content": map[string]any{"approve": true}},
		"ap-beta": map[string]any{"action": "accept"}, "unknown": map[string]any{"ignored": true}}).ok(t); len(ack) != 1 || ack["resultType"] != "complete" {
		t.Fatalf("ack %v", ack)
	}
	update("token-alpha", map[string]any{"ap-1": "yes"}).wantError(t, 400, -32602, "not an elicitation result")
	update("token-alpha", map[string]any{"ap-1": map[string]any{"action": "cancel"}}).ok(t) // dismissed: still waits
	d.mu.Lock()
	if len(d.decided) != 0 {
		t.Fatalf("decided %v", d.decided)
	}
	d.mu.Unlock()

	update("token-alpha", map[string]any{"ap-1": map[string]any{"action": "accept", "content": map[string]any{"approve": true, "reason": "looks fine"}}}).ok(t)
	d.mu.Lock()
	if dec := d.decided["ap-1"]; dec != [3]string{"approve", mcpserver.TasksUpdatedBy, "looks fine"} || len(d.decided) != 1 {
		t.Fatalf("decided %v", d.decided)
	}
	d.mu.Unlock()
	if got := pollTask(t, url, "token-alpha", id, "working"); got["inputRequests"] != nil {
		t.Fatalf("after the answer %v", got)
	}
	// A second answer to the same key is ignored (it no longer waits).
	update("token-alpha", map[string]any{"ap-1": map[string]any{"action": "decline"}}).ok(t)
	d.mu.Lock()
	if d.decided["ap-1"][0] != "approve" {
		t.Fatalf("decided %v", d.decided)
	}
	d.mu.Unlock()
	modernReq{token: "token-alpha", method: "tasks/cancel", params: map[string]any{"taskId": id}, ext: true}.post(t, url).ok(t)
	pollTask(t, url, "token-alpha", id, "cancelled")
}
