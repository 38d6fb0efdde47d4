package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/slots"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// Tasks answers the MCP task methods (tasks/get, tasks/result, tasks/list,
// tasks/cancel) and task-augmented run_python calls in front of mcp-go, whose
// own task store lives in one process's memory and would lose every task with
// it. A task is a job: its id is the job id, its state is the job's record.
type Tasks struct {
	b    jobs.Service
	h    *handler
	srv  *server.MCPServer
	ttl  time.Duration
	poll time.Duration

	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup // status watchers and stdio answers
	watchers *slots.Keyed   // bounds status watchers, per namespace
}

// Task bounds.
const (
	// DefaultTaskTTL is how long a task's record is kept: the state service's
	// default retention of finished jobs.
	DefaultTaskTTL      = 7 * 24 * time.Hour
	taskPollInterval    = 250 * time.Millisecond
	maxStatusWatchers   = 256       // tasks whose status change a front-end notifies at once
	maxNSWatchers       = 32        // of those, one namespace's
	maxWatch            = time.Hour // a watcher gives up then: the client polls tasks/get
	maxTaskListPage     = 100
	maxStdioMessageSize = 16 << 20
)

// NewTasks returns the task layer of srv (made by New with the same r and
// opts): tasks are found, waited for, listed and cancelled by id from the
// state service, so any front-end answers for any task of the caller's
// namespace. ttl is how long the state service keeps finished jobs (zero:
// DefaultTaskTTL). Close it after the transport has stopped.
func NewTasks(srv *server.MCPServer, r jobs.Service, opts Options, ttl time.Duration) *Tasks {
	if ttl <= 0 {
		ttl = DefaultTaskTTL
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Tasks{b: r, h: &handler{r: r, opts: opts}, srv: srv, ttl: ttl, poll: taskPollInterval,
		ctx: ctx, cancel: cancel, watchers: &slots.Keyed{Max: maxNSWatchers, Total: maxStatusWatchers}}
}

// Close stops status watchers and waits for every goroutine t started.
func (t *Tasks) Close() {
	if t == nil {
		return
	}
	t.cancel()
	t.wg.Wait()
}

// rpcRequest is the part of a JSON-RPC request the task layer reads.
type rpcRequest struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`

	era requestEra // read from Params' _meta
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

type rpcResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *rpcError       `json:"error,omitempty"`
}

// offers reports whether tool is one of the run tools this server offers,
// or one of its TaskTools.
func (t *Tasks) offers(tool string) bool {
	if _, ok := t.h.opts.TaskTools[tool]; ok {
		return true
	}
	lang, ok := toolLanguage[tool]
	return ok && slices.Contains(t.h.languages(), lang)
}

// claims reports whether msg is a request the task layer answers, and decodes it.
func (t *Tasks) claims(msg []byte) (rpcRequest, bool) {
	var req rpcRequest
	trimmed := bytes.TrimSpace(msg)
	if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(trimmed, &req) != nil || len(req.ID) == 0 {
		return req, false
	}
	if req.era = eraOf(req.Params); req.era.modern {
		return req, t.claimsModern(req)
	}
	switch mcp.MCPMethod(req.Method) {
	case mcp.MethodTasksGet, mcp.MethodTasksResult, mcp.MethodTasksList, mcp.MethodTasksCancel:
		return req, true
	case mcp.MethodToolsCall:
		var p struct {
			Name string           `json:"name"`
			Task *json.RawMessage `json:"task"`
		}
		if json.Unmarshal(req.Params, &p) != nil {
			return req, false
		}
		if t.h.opts.ClientNeeds.missingCapabilities(p.Name, req.Params) != nil {
			return req, true // refused here: mcp-go would run the tool
		}
		return req, p.Task != nil && t.offers(p.Name)
	}
	return req, false
}

// handle answers a claimed request, and returns the answer's error code (0:
// none). session is the caller's MCP session id ("" when unknown): status
// notifications of the 2025-11-25 tasks it starts go there.
func (t *Tasks) handle(ctx context.Context, session string, req rpcRequest) ([]byte, int) {
	if m := t.h.opts.Metrics; m != nil {
		m.MCPRequest(req.Method)
	}
	ns := t.h.namespace(ctx)
	var result any
	var err *rpcError
	if req.era.modern {
		result, err = t.handleModern(ctx, ns, req)
		return t.answer(req, result, err)
	}
	switch mcp.MCPMethod(req.Method) {
	case mcp.MethodToolsCall:
		var p struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(req.Params, &p) // claims decoded it
		if missing := t.h.opts.ClientNeeds.missingCapabilities(p.Name, req.Params); missing != nil {
			err = missingCapabilityError(p.Name, missing)
			break
		}
		result, err = t.create(ctx, ns, session, req.Params)
	case mcp.MethodTasksGet:
		result, err = t.get(ctx, ns, req.Params)
	case mcp.MethodTasksResult:
		result, err = t.result(ctx, ns, req.Params)
	case mcp.MethodTasksList:
		result, err = t.list(ctx, ns, req.Params)
	case mcp.MethodTasksCancel:
		result, err = t.cancelTask(ctx, ns, req.Params)
	}
	return t.answer(req, result, err)
}

// answer is the JSON-RPC response to req, and its error code (0: none).
func (t *Tasks) answer(req rpcRequest, result any, err *rpcError) ([]byte, int) {
	out, merr := json.Marshal(rpcResponse{JSONRPC: mcp.JSONRPC_VERSION, ID: req.ID, Result: result, Error: err})
	if merr != nil {
		err = &rpcError{Code: mcp.INTERNAL_ERROR, Message: merr.Error()}
		out, _ = json.Marshal(rpcResponse{JSONRPC: mcp.JSONRPC_VERSION, ID: req.ID, Error: err})
	}
	if err != nil {
		return out, err.Code
	}
	return out, 0
}

func invalidParams(format string, args ...any) *rpcError {
	return &rpcError{Code: mcp.INVALID_PARAMS, Message: fmt.Sprintf(format, args...)}
}

// create starts run_python as a 2025-11-25 task and answers at once with the task.
func (t *Tasks) create(ctx context.Context, ns, session string, params json.RawMessage) (any, *rpcError) {
	rec, err := t.submit(ctx, ns, params)
	if err != nil {
		return nil, err
	}
	if session != "" && !rec.Status.Terminal() {
		t.watch(ns, session, rec.Job.ID)
	}
	return mcp.CreateTaskResult{Task: t.task(rec)}, nil
}

// submit starts the job of a run tool's tools/call (params) without waiting
// for it: the task's record, once the state service has it, so that any
// front-end's tasks/get finds it.
func (t *Tasks) submit(ctx context.Context, ns string, params json.RawMessage) (*jobs.Record, *rpcError) {
	var p struct {
		Name      string `json:"name"`
		Arguments any    `json:"arguments"`
		Meta      struct {
			TraceParent any `json:"traceparent"`
		} `json:"_meta"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, invalidParams("tools/call params: %v", err)
	}
	ctx = tracing.WithVia(ctx, "task")
	if tp, ok := p.Meta.TraceParent.(string); ok {
		ctx = tracing.WithParent(ctx, tp) // _meta.traceparent, when valid, over the HTTP header
	}
	parse := func(args any) (*jobs.Job, error) { return parseArgs(p.Name, args) }
	if fn, ok := t.h.opts.TaskTools[p.Name]; ok {
		parse = fn
	}
	job, err := parse(p.Arguments)
	if err == nil {
		err = t.h.checkServers(ctx, ns, job.Servers)
	}
	if err != nil {
		return nil, invalidParams("%v", err)
	}
	job.Namespace = ns
	job.ID = jobs.NewID()
	rec, err := t.b.Submit(ctx, job)
	if rec == nil {
		if errs.KindOf(err) == errs.Invalid {
			return nil, invalidParams("%v", err)
		}
		return nil, &rpcError{Code: mcp.INTERNAL_ERROR, Message: fmt.Sprintf("the task could not be started: %v", err)}
	}
	t.h.logger(ctx, ns, rec.Job.ID).Info("run_python task accepted", "namespace", ns, "servers", job.Servers, "session", job.Session, "status", rec.Status)
	return rec, nil
}

// watch sends the task's terminal status to session when the job ends, if
// the front-end is not already watching too many.
func (t *Tasks) watch(ns, session, id string) {
	release, ok := t.watchers.Take(ns)
	if !ok {
		return // notifications are optional: the client polls tasks/get
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		defer release()
		ctx, cancel := context.WithTimeout(t.ctx, maxWatch)
		defer cancel()
		rec, err := t.b.Wait(ctx, ns, id)
		if err != nil || rec == nil || !rec.Status.Terminal() {
			return
		}
		task := t.task(rec)
		params := map[string]any{"taskId": task.TaskId, "status": task.Status, "createdAt": task.CreatedAt,
			"lastUpdatedAt": task.LastUpdatedAt, "ttl": task.TTL}
		if task.StatusMessage != "" {
			params["statusMessage"] = task.StatusMessage
		}
		// The session may be gone (the client closed it): nothing to tell.
		_ = t.srv.SendNotificationToSpecificClient(session, mcp.MethodNotificationTasksStatus, params)
	}()
}

func taskID(params json.RawMessage) (string, *rpcError) {
	var p struct {
		TaskID string `json:"taskId"`
	}
	if err := json.Unmarshal(params, &p); err != nil || p.TaskID == "" {
		return "", invalidParams("taskId is required: pass the id that tools/call returned in task.taskId")
	}
	return p.TaskID, nil
}

// lookup returns the namespace's record of task id, or the error to answer.
func (t *Tasks) lookup(ctx context.Context, ns string, params json.RawMessage) (*jobs.Record, *rpcError) {
	id, rerr := taskID(params)
	if rerr != nil {
		return nil, rerr
	}
	rec, err := t.b.Get(ctx, ns, id)
	return rec, t.backendError(id, err)
}

// backendError is the one mapping of the backend's errors to JSON-RPC
// errors, by kind.
func (t *Tasks) backendError(id string, err error) *rpcError {
	if err == nil {
		return nil
	}
	switch errs.KindOf(err) {
	case errs.NotFound:
		return invalidParams("task %q not found: it is not a task of this namespace, or it ended more than %s ago and was deleted", id, t.ttl)
	case errs.Invalid:
		return invalidParams("%v", err)
	}
	return &rpcError{Code: mcp.INTERNAL_ERROR, Message: fmt.Sprintf("task %s: %v", id, err)}
}

func (t *Tasks) get(ctx context.Context, ns string, params json.RawMessage) (any, *rpcError) {
	rec, err := t.lookup(ctx, ns, params)
	if err != nil {
		return nil, err
	}
	return mcp.NewGetTaskResult(t.task(rec)), nil
}

// result waits for the task's end and answers what the tools/call would have.
func (t *Tasks) result(ctx context.Context, ns string, params json.RawMessage) (any, *rpcError) {
	id, rerr := taskID(params)
	if rerr != nil {
		return nil, rerr
	}
	rec, err := t.b.Wait(ctx, ns, id)
	if rerr := t.backendError(id, err); rerr != nil {
		if ctx.Err() != nil {
			return nil, &rpcError{Code: mcp.REQUEST_INTERRUPTED, Message: "tasks/result was interrupted before the task ended: call it again"}
		}
		return nil, rerr
	}
	if st, msg := taskStatus(rec); st == mcp.TaskStatusFailed {
		return nil, &rpcError{Code: mcp.INTERNAL_ERROR, Message: fmt.Sprintf("task %s failed: %s", id, msg)}
	}
	res := resultOf(rec, t.h.opts.OutputMode)
	t.h.attachFiles(ctx, ns, rec, res)
	res.Meta = mcp.WithRelatedTask(id)
	return res, nil
}

func (t *Tasks) list(ctx context.Context, ns string, params json.RawMessage) (any, *rpcError) {
	var p struct {
		Cursor string `json:"cursor"`
	}
	if len(params) > 0 && string(params) != "null" {
		if err := json.Unmarshal(params, &p); err != nil {
			return nil, invalidParams("tasks/list params: %v", err)
		}
	}
	if p.Cursor != "" && !jobs.ValidUserID(p.Cursor) {
		return nil, invalidParams("cursor %q is not one tasks/list returned", p.Cursor)
	}
	recs, next, err := t.b.List(ctx, ns, jobs.Filter{Cursor: p.Cursor, Limit: maxTaskListPage})
	if err != nil {
		return nil, &rpcError{Code: mcp.INTERNAL_ERROR, Message: fmt.Sprintf("list tasks: %v", err)}
	}
	out := mcp.ListTasksResult{Tasks: make([]mcp.Task, 0, len(recs))}
	for _, r := range recs {
		out.Tasks = append(out.Tasks, t.task(r))
	}
	out.NextCursor = mcp.Cursor(next)
	return out, nil
}

func (t *Tasks) cancelTask(ctx context.Context, ns string, params json.RawMessage) (any, *rpcError) {
	rec, rerr := t.lookup(ctx, ns, params)
	if rerr != nil {
		return nil, rerr
	}
	if rec.Status.Terminal() {
		return nil, invalidParams("task %s already ended (%s): only a working task can be cancelled", rec.Job.ID, rec.Status)
	}
	if err := t.b.Cancel(ctx, ns, rec.Job.ID, "cancelled by tasks/cancel"); err != nil {
		return nil, t.backendError(rec.Job.ID, err)
	}
	task := t.task(rec)
	if got, err := t.b.Get(ctx, ns, rec.Job.ID); err == nil {
		task = t.task(got)
	}
	if !task.Status.IsTerminal() { // recorded, not yet applied
		task.Status, task.StatusMessage = mcp.TaskStatusCancelled, "cancelled by tasks/cancel"
		task.LastUpdatedAt = time.Now().UTC().Format(time.RFC3339Nano)
	}
	return mcp.CancelTaskResult{Task: task}, nil
}

// task is the MCP view of a job record.
func (t *Tasks) task(rec *jobs.Record) mcp.Task {
	status, msg := taskStatus(rec)
	created := rec.Job.SubmittedAt
	if created.IsZero() {
		created = rec.CreatedAt
	}
	updated := created
	for _, at := range []*time.Time{rec.StartedAt, rec.FinishedAt} {
		if at != nil && at.After(updated) {
			updated = *at
		}
	}
	ttl, poll := t.ttl.Milliseconds(), t.poll.Milliseconds()
	return mcp.Task{TaskId: rec.Job.ID, Status: status, StatusMessage: msg,
		CreatedAt: created.UTC().Format(time.RFC3339Nano), LastUpdatedAt: updated.UTC().Format(time.RFC3339Nano),
		TTL: &ttl, PollInterval: &poll}
}

// taskStatus maps a job's status to a task's. A run of the code that ended,
// whatever its outcome, is a completed tools/call (its result says
// isError); a job that never ran its code to an end failed.
func taskStatus(rec *jobs.Record) (mcp.TaskStatus, string) {
	msg := string(rec.Status)
	if rec.Result != nil && rec.Result.Error != "" {
		msg += ": " + rec.Result.Error
	}
	switch {
	case rec.Status == jobs.StatusSuccess || rec.Status == jobs.StatusError || rec.Status == jobs.StatusTimeout:
		return mcp.TaskStatusCompleted, msg
	case rec.Status == jobs.StatusCancelled:
		return mcp.TaskStatusCancelled, msg
	case rec.Status.Terminal():
		return mcp.TaskStatusFailed, msg
	}
	return mcp.TaskStatusWorking, msg
}
