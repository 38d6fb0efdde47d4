package mcpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

type rpcReply struct {
	ID     int             `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

type task struct {
	TaskID        string `json:"taskId"`
	Status        string `json:"status"`
	StatusMessage string `json:"statusMessage"`
	TTL           int64  `json:"ttl"`
	PollInterval  int64  `json:"pollInterval"`
}

func request(id int, method string, params any) []byte {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	return b
}

// httpRPC posts one JSON-RPC request to url/mcp with token.
func httpRPC(t *testing.T, url, token string, method string, params any) rpcReply {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/mcp", bytes.NewReader(request(1, method, params)))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read or abandoned: nothing to report
	body, _ := io.ReadAll(resp.Body)
	var r rpcReply
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("%s: HTTP %d %s: %v", method, resp.StatusCode, body, err)
	}
	return r
}

func decode[T any](t *testing.T, r rpcReply) T {
	t.Helper()
	var v T
	if r.Error != nil {
		t.Fatalf("error %d: %s", r.Error.Code, r.Error.Message)
	}
	if err := json.Unmarshal(r.Result, &v); err != nil {
		t.Fatalf("result %s: %v", r.Result, err)
	}
	return v
}

func wantError(t *testing.T, r rpcReply, code int, contains string) {
	t.Helper()
	if r.Error == nil || r.Error.Code != code || !strings.Contains(r.Error.Message, contains) {
		t.Fatalf("want error %d containing %q, got %+v (result %s)", code, contains, r.Error, r.Result)
	}
}

// serveTasks serves fe's MCP server with its task layer over HTTP, with two
// namespaces' tokens.
func serveTasks(t *testing.T, fe *frontend.Frontend) string {
	t.Helper()
	opts := mcpserver.Options{Namespace: httpauth.Namespace}
	srv := mcpserver.New(fe, opts)
	tasks := mcpserver.NewTasks(srv, fe, opts, 0)
	t.Cleanup(tasks.Close)
	hs := httptest.NewServer(mcpserver.Handler(srv, mcpserver.HTTPOptions{Tasks: tasks, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"token-alpha": "alpha", "token-beta": "beta"}})}))
	t.Cleanup(hs.Close)
	return hs.URL
}

// TestTasksAnyFrontend: a task started on one front-end is followed,
// listed and cancelled on another, per namespace, from the state service;
// bad requests get errors that say what to do.
func TestTasksAnyFrontend(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.NewFakeRuntime(64), worker.DefaultConfig("w1"))
	url1 := serveTasks(t, testutil.Frontend(t, b, "fe1"))
	url2 := serveTasks(t, testutil.Frontend(t, b, "fe2"))

	created := decode[struct{ Task task }](t, httpRPC(t, url1, "token-alpha", "tools/call",
		map[string]any{"name": "run_python", "arguments": map[string]any{"code": "sleep 300ms"}, "task": map[string]any{}}))
	tk := created.Task
	if tk.TaskID == "" || tk.Status != "working" || tk.TTL != (7*24*time.Hour).Milliseconds() || tk.PollInterval <= 0 {
		t.Fatalf("created %+v", tk)
	}
	res := decode[struct {
		Content []struct{ Text string }
		IsError bool
		Meta    map[string]any `json:"_meta"`
	}](t, httpRPC(t, url2, "token-alpha", "tasks/result", map[string]any{"taskId": tk.TaskID}))
	if res.IsError || len(res.Content) == 0 || res.Content[0].Text != "sleep 300ms" || res.Meta["io.modelcontextprotocol/related-task"] == nil {
		t.Fatalf("result from fe2: %+v", res)
	}
	if got := decode[task](t, httpRPC(t, url2, "token-alpha", "tasks/get", map[string]any{"taskId": tk.TaskID})); got.Status != "completed" {
		t.Fatalf("get %+v", got)
	}
	list := decode[struct{ Tasks []task }](t, httpRPC(t, url2, "token-alpha", "tasks/list", nil))
	if len(list.Tasks) != 1 || list.Tasks[0].TaskID != tk.TaskID {
		t.Fatalf("alpha's list %+v", list)
	}

	// Another namespace neither sees nor touches alpha's task.
	wantError(t, httpRPC(t, url2, "token-beta", "tasks/get", map[string]any{"taskId": tk.TaskID}), -32602, "not found")
	wantError(t, httpRPC(t, url2, "token-beta", "tasks/cancel", map[string]any{"taskId": tk.TaskID}), -32602, "not found")
	wantError(t, httpRPC(t, url2, "token-beta", "tasks/result", map[string]any{"taskId": tk.TaskID}), -32602, "not found")
	if list := decode[struct{ Tasks []task }](t, httpRPC(t, url1, "token-beta", "tasks/list", map[string]any{})); len(list.Tasks) != 0 {
		t.Fatalf("beta sees %+v", list)
	}

	// Cancel from the other front-end.
	blocked := decode[struct{ Task task }](t, httpRPC(t, url1, "token-alpha", "tools/call",
		map[string]any{"name": "run_python", "arguments": map[string]any{"code": "block"}, "task": map[string]any{"ttl": 1000}})).Task
	if c := decode[task](t, httpRPC(t, url2, "token-alpha", "tasks/cancel", map[string]any{"taskId": blocked.TaskID})); c.Status != "cancelled" {
		t.Fatalf("cancel %+v", c)
	}
	if got := decode[task](t, httpRPC(t, url1, "token-alpha", "tasks/get", map[string]any{"taskId": blocked.TaskID})); got.Status != "cancelled" {
		t.Fatalf("after cancel %+v", got)
	}
	wantError(t, httpRPC(t, url2, "token-alpha", "tasks/cancel", map[string]any{"taskId": blocked.TaskID}), -32602, "already ended")

	// Hostile or mistaken requests.
	for _, c := range []struct {
		method   string
		params   any
		contains string
	}{
		{"tasks/get", map[string]any{}, "taskId is required"},
		{"tasks/get", map[string]any{"taskId": 7}, "taskId is required"},
		{"tasks/get", map[string]any{"taskId": "../../etc/passwd"}, "not found"},
		{"tasks/get", map[string]any{"taskId": strings.Repeat("x", 5000)}, "not found"},
		{"tasks/list", map[string]any{"cursor": "a b"}, "cursor"},
		{"tasks/list", []int{1}, "tasks/list params"},
		{"tools/call", map[string]any{"name": "run_python", "arguments": map[string]any{}, "task": map[string]any{}}, "code is required"},
		{"tools/call", map[string]any{"name": "run_python", "arguments": map[string]any{"code": "x", "servers": []string{"nope"}}, "task": map[string]any{}}, `"nope" is not a proxied MCP server`},
		{"tools/call", map[string]any{"name": "run_python", "arguments": map[string]any{"code": "x", "timeout": 99999}, "task": map[string]any{}}, "timeout"},
		{"tools/call", map[string]any{"name": "run_python", "arguments": "code", "task": map[string]any{}}, "arguments"},
	} {
		wantError(t, httpRPC(t, url1, "token-alpha", c.method, c.params), -32602, c.contains)
	}
	// Everything else still reaches mcp-go.
	if r := httpRPC(t, url1, "token-alpha", "initialize", map[string]any{"protocolVersion": "2025-11-25",
		"clientInfo": map[string]any{"name": "t", "version": "0"}, "capabilities": map[string]any{}}); r.Error != nil || !strings.Contains(string(r.Result), `"tasks"`) {
		t.Fatalf("initialize through the task layer: %+v %s", r.Error, r.Result)
	}
}

// TestTasksOverStdio: on stdio the task layer answers task methods beside
// mcp-go's own, and tells the client when its task ends.
func TestTasksOverStdio(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.NewFakeRuntime(64), worker.DefaultConfig("w1"))
	fe := testutil.Frontend(t, b, "fe1")
	opts := mcpserver.Options{}
	srv := mcpserver.New(fe, opts)
	tasks := mcpserver.NewTasks(srv, fe, opts, 0)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	in, out := tasks.Stdio(inR, outW)
	stdio := server.NewStdioServer(srv)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = stdio.Listen(t.Context(), in, out)
	}()
	replies := make(chan rpcReply, 16)
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(outR)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var r rpcReply
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				replies <- r
			}
		}
	}()
	t.Cleanup(func() {
		_ = inW.Close() // a pipe: closing only ends the other side's reads
		tasks.Close()
		_ = outW.Close() // a pipe: closing only ends the other side's reads
		wg.Wait()
	})
	send := func(id int, method string, params any) {
		if _, err := fmt.Fprintf(inW, "%s\n", request(id, method, params)); err != nil {
			t.Fatal(err)
		}
	}
	next := func() rpcReply {
		select {
		case r := <-replies:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no reply")
		}
		return rpcReply{}
	}
	send(1, "initialize", map[string]any{"protocolVersion": "2025-11-25", "clientInfo": map[string]any{"name": "t", "version": "0"}, "capabilities": map[string]any{}})
	if r := next(); r.ID != 1 || r.Error != nil {
		t.Fatalf("initialize %+v", r)
	}
	send(2, "tools/call", map[string]any{"name": "run_python", "arguments": map[string]any{"code": "sleep 200ms"}, "task": map[string]any{}})
	created := decode[struct{ Task task }](t, next())
	send(3, "tasks/result", map[string]any{"taskId": created.Task.TaskID})
	var gotResult, gotNote bool
	for !gotResult || !gotNote {
		r := next()
		switch {
		case r.ID == 3:
			res := decode[struct{ Content []struct{ Text string } }](t, r)
			gotResult = len(res.Content) == 1 && res.Content[0].Text == "sleep 200ms"
			if !gotResult {
				t.Fatalf("result %s", r.Result)
			}
		case r.Method == "notifications/tasks/status":
			var n task
			_ = json.Unmarshal(r.Params, &n)
			if n.TaskID != created.Task.TaskID || n.Status != "completed" {
				t.Fatalf("notification %s", r.Params)
			}
			gotNote = true
		default:
			t.Fatalf("unexpected %+v", r)
		}
	}

	// The same stdio serves 2026-07-28 requests, the tasks extension's
	// among them: a task when the request declares it, the tool's result
	// (a legacy task param stripped) when it does not.
	meta := func(ext bool) map[string]any {
		caps := map[string]any{}
		if ext {
			caps["extensions"] = map[string]any{mcpserver.TasksExtension: map[string]any{}}
		}
		return map[string]any{"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": caps,
			"io.modelcontextprotocol/clientInfo": map[string]any{"name": "t", "version": "0"}}
	}
	send(4, "tools/call", map[string]any{"name": "run_python", "arguments": map[string]any{"code": "sleep 100ms"}, "_meta": meta(true)})
	v2 := decode[map[string]any](t, next())
	id, _ := v2["taskId"].(string)
	if v2["resultType"] != "task" || id == "" {
		t.Fatalf("modern task %v", v2)
	}
	send(5, "tools/call", map[string]any{"name": "run_python", "arguments": map[string]any{"code": "sleep 10ms"}, "task": map[string]any{"ttl": -1}, "_meta": meta(false)})
	if r := decode[map[string]any](t, next()); r["taskId"] != nil || r["task"] != nil || r["content"] == nil {
		t.Fatalf("modern call without the extension %v", r)
	}
	for n, waited := 6, time.Now(); ; n++ {
		send(n, "tasks/get", map[string]any{"taskId": id, "_meta": meta(true)})
		got := decode[map[string]any](t, next())
		if s := got["status"]; s == "failed" || s == "cancelled" || time.Since(waited) > time.Minute {
			t.Fatalf("task %s: %v", id, got)
		}
		if got["status"] == "completed" {
			if res, _ := got["result"].(map[string]any); res == nil || res["content"] == nil {
				t.Fatalf("completed %v", got)
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	send(99, "tasks/get", map[string]any{"taskId": id, "_meta": meta(false)})
	if r := next(); r.Error == nil || r.Error.Code != -32021 {
		t.Fatalf("tasks/get without the extension %+v", r)
	}
}

// BenchmarkTasks measures, through HTTP and a real broker (fake runtime),
// how long a task-augmented run_python takes to answer with its task, and
// how long tasks/get takes on another front-end.
func BenchmarkTasks(b *testing.B) {
	br := testutil.Broker(b, "", queue.DefaultConfig())
	testutil.Worker(b, br, testutil.NewFakeRuntime(b.N+16), worker.DefaultConfig("w1"))
	url1 := serveTasksB(b, testutil.Frontend(b, br, "fe1"))
	url2 := serveTasksB(b, testutil.Frontend(b, br, "fe2"))
	post := func(url, method string, params any) rpcReply {
		resp, err := http.Post(url+"/mcp", "application/json", bytes.NewReader(request(1, method, params)))
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }() // read or abandoned: nothing to report
		var r rpcReply
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.Error != nil {
			b.Fatalf("%s: %v %+v", method, err, r.Error)
		}
		return r
	}
	var create, get []time.Duration
	ids := make([]string, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		r := post(url1, "tools/call", map[string]any{"name": "run_python", "arguments": map[string]any{"code": "print(1)"}, "task": map[string]any{}})
		create = append(create, time.Since(t0))
		var c struct{ Task task }
		_ = json.Unmarshal(r.Result, &c)
		ids = append(ids, c.Task.TaskID)
	}
	// tasks/get as a polling client sees it: of tasks submitted a while ago.
	for _, id := range ids {
		t0 := time.Now()
		post(url2, "tasks/get", map[string]any{"taskId": id})
		get = append(get, time.Since(t0))
	}
	b.StopTimer()
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	b.ReportMetric(p50(create), "create-p50-ms")
	b.ReportMetric(p50(get), "get-p50-ms")
}

func serveTasksB(b *testing.B, fe *frontend.Frontend) string {
	srv := mcpserver.New(fe, mcpserver.Options{})
	tasks := mcpserver.NewTasks(srv, fe, mcpserver.Options{}, 0)
	b.Cleanup(tasks.Close)
	hs := httptest.NewServer(mcpserver.Handler(srv, mcpserver.HTTPOptions{Tasks: tasks}))
	b.Cleanup(hs.Close)
	return hs.URL
}

// TestJavaScriptTask: run_javascript is a task like run_python where it is
// offered, and its job is a JavaScript job.
func TestJavaScriptTask(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	rt := &testutil.FakeRuntime{Langs: []string{sandbox.Python, sandbox.JavaScript}}
	testutil.Worker(t, b, rt, worker.DefaultConfig("w1"))
	fe := testutil.Frontend(t, b, "fe1")
	serve := func(langs []string) string {
		opts := mcpserver.Options{Namespace: httpauth.Namespace, Languages: langs}
		srv := mcpserver.New(fe, opts)
		tasks := mcpserver.NewTasks(srv, fe, opts, 0)
		t.Cleanup(tasks.Close)
		hs := httptest.NewServer(mcpserver.Handler(srv, mcpserver.HTTPOptions{Tasks: tasks, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"token-alpha": "alpha"}})}))
		t.Cleanup(hs.Close)
		return hs.URL
	}
	call := map[string]any{"name": "run_javascript", "arguments": map[string]any{"code": "console.log(1)"}, "task": map[string]any{}}
	tk := decode[struct{ Task task }](t, httpRPC(t, serve(jobs.Languages), "token-alpha", "tools/call", call)).Task
	rec, err := fe.Get(context.Background(), "alpha", tk.TaskID)
	if err != nil || rec.Job.Lang() != jobs.LangJavaScript {
		t.Fatalf("the task's job: %+v %v", rec, err)
	}
}
