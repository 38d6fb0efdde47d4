package jobsapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/mcpexec/mcpexec/internal/jobsapi"
)

// TestOpenAPIDescribesRealResponses loads GET /api/openapi.json with
// kin-openapi, checks it is a valid OpenAPI 3 document, and validates real
// requests and responses of every route (successes and errors) against it.
func TestOpenAPIDescribesRealResponses(t *testing.T) {
	e := workflowEnv(t)
	code, raw := e.call(t, "tok-a", "GET", "/api/openapi.json", nil)
	if code != http.StatusOK || !bytes.Equal(raw, jobsapi.OpenAPI) {
		t.Fatalf("openapi.json: %d", code)
	}
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("not a valid OpenAPI document: %v", err)
	}
	doc.Servers = openapi3.Servers{{URL: e.url}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	covered := map[string]bool{}
	check := func(method, path, token string, body any, want int) []byte {
		t.Helper()
		var rd io.Reader
		var data []byte
		if body != nil {
			if s, ok := body.(string); ok {
				data = []byte(s)
			} else {
				data, _ = json.Marshal(body)
			}
			rd = bytes.NewReader(data)
		}
		req, _ := http.NewRequest(method, e.url+path, rd)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		route, params, err := router.FindRoute(req)
		if err != nil {
			t.Fatalf("%s %s is not in the document: %v", method, path, err)
		}
		covered[method+" "+route.Path] = true
		in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
		if want < 400 {
			if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
				t.Fatalf("%s %s: the request does not match the document: %v", method, path, err)
			}
			if data != nil {
				req.Body = io.NopCloser(bytes.NewReader(data))
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close() // read or abandoned: nothing to report
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, got, want)
		}
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
			Body: io.NopCloser(bytes.NewReader(got)), Options: &openapi3filter.Options{IncludeResponseStatus: true}}
		if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
			t.Fatalf("%s %s → %d: the response does not match the document: %v\n%s", method, path, resp.StatusCode, err, got)
		}
		return got
	}
	check("POST", "/api/jobs", "tok-a", jobsapi.JobRequest{ID: "one", Code: "ok", Labels: map[string]string{"k": "v"}}, 201)
	check("POST", "/api/jobs", "tok-a", jobsapi.JobRequest{ID: "one", Code: "ok", Labels: map[string]string{"k": "v"}}, 200)
	check("POST", "/api/jobs", "tok-a", jobsapi.JobRequest{ID: "one", Code: "other"}, 409)
	check("POST", "/api/jobs", "tok-a", []jobsapi.JobRequest{{ID: "two", Code: "ok"}, {ID: "bad", Code: "x", After: []string{"nope"}}}, 200)
	check("POST", "/api/jobs", "tok-a", `{"code": 1}`, 400)
	check("POST", "/api/jobs", "", jobsapi.JobRequest{Code: "ok"}, 401)
	check("GET", "/api/jobs/one/wait?timeout=10s", "tok-a", nil, 200)
	check("GET", "/api/jobs/one", "tok-a", nil, 200)
	check("GET", "/api/jobs/missing", "tok-a", nil, 404)
	check("GET", "/api/jobs/one/files/none.csv", "tok-a", nil, 404)
	check("GET", "/api/jobs?status=success&label=k=v&limit=10", "tok-a", nil, 200)
	check("GET", "/api/jobs?limit=0", "tok-a", nil, 400)
	check("POST", "/api/jobs/one/cancel", "tok-a", nil, 409)
	check("POST", "/api/jobs", "tok-a", jobsapi.JobRequest{ID: "blocked", Code: "block"}, 201)
	check("POST", "/api/jobs/blocked/cancel", "tok-a", nil, 200)
	check("POST", "/api/jobs/one/retry", "tok-a", map[string]string{"id": "one-again"}, 201)
	check("POST", "/api/jobs/blocked/retry", "tok-a", nil, 201)
	check("GET", "/api/deadletters", "tok-a", nil, 200)
	check("GET", "/api/audit?server=ts&limit=10", "tok-a", nil, 200)
	check("GET", "/api/audit?limit=0", "tok-a", nil, 400)
	wf := jobsapi.WorkflowRequest{ID: "wf", Labels: map[string]string{"team": "x"}, Jobs: []jobsapi.JobRequest{{ID: "p", Code: "ok"}, {ID: "c", Code: "sleep x", After: []string{"p"}}, {ID: "s", Code: "ok", After: []string{"c"}}}}
	check("POST", "/api/workflows", "tok-a", wf, 201)
	check("POST", "/api/workflows", "tok-a", wf, 200)
	check("POST", "/api/workflows", "tok-a", jobsapi.WorkflowRequest{Jobs: []jobsapi.JobRequest{{ID: "x", Code: "1", After: []string{"y"}}, {ID: "y", Code: "1", After: []string{"x"}}}}, 400)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var got jobsapi.Workflow
		_ = json.Unmarshal(check("GET", "/api/workflows/wf", "tok-a", nil, 200), &got)
		if got.Status == "failed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workflow %+v", got)
		}
	}
	check("GET", "/api/workflows/none", "tok-a", nil, 404)
	// The event stream's status and content type (its body never ends).
	s := openEvents(t, e, "tok-a", "?after=0&workflow=wf", "")
	if _, ev := s.next(t); ev.Job != "p" {
		t.Fatalf("first event %+v", ev)
	}
	covered["GET /api/events"] = true
	// Approvals: none waits here (the jobs call no tool), so an id is unknown.
	check("GET", "/api/approvals", "tok-a", nil, 200)
	check("POST", "/api/approvals/"+strings.Repeat("ab", 16), "tok-a", map[string]string{"decision": "approve"}, 404)
	check("POST", "/api/approvals/"+strings.Repeat("ab", 16), "tok-a", map[string]any{"decision": "approve", "scope": "namespace", "minutes": 30}, 404)
	check("POST", "/api/approvals/"+strings.Repeat("ab", 16), "tok-a", map[string]any{"decision": "deny", "scope": "job"}, 400)
	check("GET", "/api/approvals/grants", "tok-a", nil, 200)
	check("DELETE", "/api/approvals/grants/"+strings.Repeat("cd", 16), "tok-a", nil, 404)
	actx, acancel := context.WithCancel(ctx)
	areq, _ := http.NewRequestWithContext(actx, "GET", e.url+"/api/approvals/events", nil)
	areq.Header.Set("Authorization", "Bearer tok-a")
	aresp, err := http.DefaultClient.Do(areq)
	if err != nil || aresp.StatusCode != http.StatusOK || aresp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("approval events: %v %v", aresp, err)
	}
	acancel()
	_ = aresp.Body.Close() // the stream never ends by itself
	covered["GET /api/approvals/events"] = true
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if !covered[method+" "+path] && path != "/mcp" && path != "/metrics" && path != "/healthz" && path != "/api/openapi.json" {
				t.Errorf("%s %s is described but not exercised", method, path)
			}
		}
	}
}
