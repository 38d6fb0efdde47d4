package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// echoRunner finishes every job successfully without running it. It has
// no live output; the rest of jobs.Service it leaves out (a call panics).
type echoRunner struct {
	jobs.Service
	got *jobs.Job
}

func (e *echoRunner) Run(_ context.Context, job *jobs.Job, _ func(jobs.Event)) (*jobs.Record, error) {
	if err := job.Normalize(jobs.DefaultLimits(), time.Now()); err != nil {
		return nil, err
	}
	e.got = job
	return &jobs.Record{Job: *job, Status: jobs.StatusSuccess,
		Result: &jobs.Result{Status: jobs.StatusSuccess, Stdout: "ok\n"}}, nil
}

func (e *echoRunner) Limits() jobs.Limits { return jobs.DefaultLimits() }

func (e *echoRunner) WatchOutput(string, string, func(stream, data string)) (func(), error) {
	return func() {}, nil
}

// TestCallLogsJobID checks that each run_python call is logged with its job id
// and trace id, so a call can be followed into the fleet's logs.
func TestCallLogsJobID(t *testing.T) {
	var buf bytes.Buffer
	r := &echoRunner{}
	c := inProcess(t, r, Options{Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	ctx := context.Background()
	req := mcp.CallToolRequest{}
	req.Params.Name = ToolName
	req.Params.Arguments = map[string]any{"code": "print(1)"}
	res, err := c.CallTool(ctx, req)
	if err != nil || res.IsError {
		t.Fatalf("call: %v %+v", err, res)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want an accepted and a finished line, got %q", buf.String())
	}
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatal(err)
		}
		if rec["job"] != r.got.ID || rec["trace_id"] != jobs.TraceID(jobs.TraceParent(jobs.ScopedID(r.got.Namespace, r.got.ID))) {
			t.Fatalf("log line %s lacks job %s and its trace id", l, r.got.ID)
		}
	}
}

// TestProgressOutputIsBounded: live output that never ends a line, and floods
// of it, cost the front-end a bounded amount of memory and notifications.
func TestProgressOutputIsBounded(t *testing.T) {
	p := &progress{max: 500, partial: map[string]string{}}
	big := strings.Repeat("x", 8<<20)
	for range 8 {
		p.output("stdout", big)
	}
	p.output("bogus", big)
	if len(p.partial["stdout"]) > maxPartialLine || p.seen > maxProgressBytes || len(p.partial) != 1 {
		t.Fatalf("partial line %d bytes, seen %d, streams %d", len(p.partial["stdout"]), p.seen, len(p.partial))
	}
}
