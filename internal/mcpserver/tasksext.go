package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// The tasks extension (io.modelcontextprotocol/tasks, SEP-2663) is how
// 2026-07-28 clients run a tool as a task. Its wire differs from the
// 2025-11-25 experimental tasks, which stay as they were for the clients
// that negotiated them:
//
//   - creation is server-directed: a tools/call of a run tool whose request
//     declares the extension in its _meta client capabilities is answered
//     with a flat CreateTaskResult (resultType "task"); one that does not
//     declare it runs synchronously, as before (a run tool can always be
//     served without a task, so it never needs -32021);
//   - tasks/get answers the task with its outcome inlined: the tool's result
//     when completed, a JSON-RPC error when failed, and, while a call of its
//     job waits for a person's approval, status input_required with one form
//     elicitation per parked call in inputRequests;
//   - tasks/update carries the answers (inputResponses keyed as
//     inputRequests were) and tasks/cancel cancels the job; both answer an
//     empty acknowledgement;
//   - tasks/result and tasks/list are not methods of the extension (-32601);
//   - tasks/get, tasks/update, tasks/cancel, and a subscriptions/listen that
//     asks for task notifications, from a request that did not declare the
//     extension, get -32021 (MissingRequiredClientCapability).
//
// Status notifications on subscriptions/listen are optional in the
// extension: mcpexec sends none (its acknowledgement names no task ids), and
// clients poll tasks/get every pollIntervalMs.

// TasksExtension is the identifier of the MCP tasks extension.
const TasksExtension = "io.modelcontextprotocol/tasks"

// TasksUpdatedBy is who an approval answered through tasks/update was
// decided by.
const TasksUpdatedBy = "the MCP client of the task (tasks/update)"

// requestEra is what the task layer reads of a request's _meta.
type requestEra struct {
	version  string // io.modelcontextprotocol/protocolVersion, when declared
	modern   bool   // 2026-07-28 or later
	tasksExt bool   // its client capabilities declare the tasks extension
}

// eraOf reads the protocol era of a request from its params' _meta.
func eraOf(params json.RawMessage) requestEra {
	var p struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	if json.Unmarshal(params, &p) != nil {
		return requestEra{}
	}
	var e requestEra
	if json.Unmarshal(p.Meta[mcp.MetaKeyProtocolVersion], &e.version) != nil || !mcp.IsModernProtocol(e.version) {
		return requestEra{version: e.version}
	}
	e.modern = true
	var caps struct {
		Extensions map[string]json.RawMessage `json:"extensions"`
	}
	if json.Unmarshal(p.Meta[mcp.MetaKeyClientCapabilities], &caps) == nil {
		v, ok := caps.Extensions[TasksExtension]
		e.tasksExt = ok && string(v) != "null"
	}
	return e
}

// claimsModern reports whether the task layer answers req, a request of
// protocol version 2026-07-28 or later.
func (t *Tasks) claimsModern(req rpcRequest) bool {
	switch req.Method {
	case "tasks/get", "tasks/update", "tasks/cancel", "tasks/result", "tasks/list":
		return true
	case string(mcp.MethodSubscriptionsListen):
		return !req.era.tasksExt && listensToTasks(req.Params)
	case string(mcp.MethodToolsCall):
		var p struct {
			Name string `json:"name"`
		}
		if json.Unmarshal(req.Params, &p) != nil {
			return false
		}
		if t.h.opts.ClientNeeds.missingCapabilities(p.Name, req.Params) != nil {
			return true // refused here: mcp-go would run the tool
		}
		return req.era.tasksExt && t.offers(p.Name)
	}
	return false
}

// listensToTasks reports whether a subscriptions/listen asks for task
// status notifications.
func listensToTasks(params json.RawMessage) bool {
	var p struct {
		Notifications struct {
			TaskIDs json.RawMessage `json:"taskIds"`
		} `json:"notifications"`
	}
	return json.Unmarshal(params, &p) == nil && len(p.Notifications.TaskIDs) > 0 && string(p.Notifications.TaskIDs) != "null"
}

// needsTasksExtension is the -32021 error of a request that needs the tasks
// extension and did not declare it.
func needsTasksExtension(method string) *rpcError {
	return &rpcError{
		Code: mcp.MISSING_REQUIRED_CLIENT_CAPABILITY,
		Message: fmt.Sprintf("%s needs the client capability extensions[%q], which the request's _meta %s does not declare: declare it (if the client speaks the tasks extension) and retry",
			method, TasksExtension, mcp.MetaKeyClientCapabilities),
		Data: map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{TasksExtension: map[string]any{}}}},
	}
}

// completeAck is the empty acknowledgement of tasks/update and tasks/cancel.
var completeAck = map[string]any{"resultType": mcp.ResultTypeComplete}

// handleModern answers a request of 2026-07-28 or later that claimsModern
// claimed.
func (t *Tasks) handleModern(ctx context.Context, ns string, req rpcRequest) (any, *rpcError) {
	switch req.Method {
	case "tasks/result", "tasks/list":
		return nil, &rpcError{Code: mcp.METHOD_NOT_FOUND, Message: fmt.Sprintf("%s is not a method of the tasks extension (protocol %s): tasks/get returns a task's result once it is completed, and tasks are not listed", req.Method, req.era.version)}
	case string(mcp.MethodSubscriptionsListen):
		return nil, needsTasksExtension("subscriptions/listen with notifications.taskIds")
	case string(mcp.MethodToolsCall):
		var p struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(req.Params, &p) // claimsModern decoded it
		if missing := t.h.opts.ClientNeeds.missingCapabilities(p.Name, req.Params); missing != nil {
			return nil, missingCapabilityError(p.Name, missing)
		}
		rec, err := t.submit(ctx, ns, req.Params)
		if err != nil {
			return nil, err
		}
		out := t.taskV2(rec)
		out["resultType"] = "task"
		return out, nil
	}
	if !req.era.tasksExt {
		return nil, needsTasksExtension(req.Method)
	}
	switch req.Method {
	case "tasks/get":
		rec, err := t.lookup(ctx, ns, req.Params)
		if err != nil {
			return nil, err
		}
		out := t.detailed(ctx, ns, rec)
		out["resultType"] = mcp.ResultTypeComplete
		return out, nil
	case "tasks/update":
		return t.update(ctx, ns, req.Params)
	case "tasks/cancel":
		rec, err := t.lookup(ctx, ns, req.Params)
		if err != nil {
			return nil, err
		}
		if rec.Status.Terminal() {
			return completeAck, nil // cancelling an ended task is acknowledged, and changes nothing
		}
		if err := t.b.Cancel(ctx, ns, rec.Job.ID, "cancelled by tasks/cancel"); err != nil {
			return nil, t.backendError(rec.Job.ID, err)
		}
		return completeAck, nil
	}
	return nil, &rpcError{Code: mcp.METHOD_NOT_FOUND, Message: "unknown method " + req.Method}
}

// taskV2 is the tasks extension's Task of a job record: flat fields, the TTL
// and poll interval in integer milliseconds.
func (t *Tasks) taskV2(rec *jobs.Record) map[string]any {
	v1 := t.task(rec)
	out := map[string]any{"taskId": v1.TaskId, "status": v1.Status, "createdAt": v1.CreatedAt,
		"lastUpdatedAt": v1.LastUpdatedAt, "ttlMs": t.ttl.Milliseconds(), "pollIntervalMs": t.poll.Milliseconds()}
	if v1.StatusMessage != "" {
		out["statusMessage"] = v1.StatusMessage
	}
	return out
}

// detailed is the DetailedTask of a record: the Task with its result inlined
// when completed, its error when failed, and its input requests while a
// call of its job waits for approval.
func (t *Tasks) detailed(ctx context.Context, ns string, rec *jobs.Record) map[string]any {
	out := t.taskV2(rec)
	status, msg := taskStatus(rec)
	switch status {
	case mcp.TaskStatusCompleted:
		res := resultOf(rec, t.h.opts.OutputMode)
		t.h.attachFiles(ctx, ns, rec, res)
		res.ResultType = mcp.ResultTypeComplete
		out["result"] = res
	case mcp.TaskStatusFailed:
		out["error"] = rpcError{Code: mcp.INTERNAL_ERROR, Message: fmt.Sprintf("the job of task %s did not run to an end: %s", rec.Job.ID, msg)}
	case mcp.TaskStatusWorking:
		if pending := t.pending(ctx, ns, rec.Job.ID); len(pending) > 0 {
			out["status"] = mcp.TaskStatus("input_required")
			out["statusMessage"] = fmt.Sprintf("%d tool call(s) of the job wait for approval: answer inputRequests with tasks/update", len(pending))
			out["inputRequests"] = inputRequests(pending)
			out["lastUpdatedAt"] = latestAsk(out["lastUpdatedAt"].(string), pending)
		}
	}
	return out
}

// latestAsk is lastUpdatedAt of a task whose calls wait: the later of the
// record's and the last ask's time.
func latestAsk(updated string, pending map[string]jobs.Approval) string {
	last, err := time.Parse(time.RFC3339Nano, updated)
	if err != nil {
		return updated
	}
	for _, ap := range pending {
		if ap.AskedAt.After(last) {
			last = ap.AskedAt
		}
	}
	return last.UTC().Format(time.RFC3339Nano)
}

// pending returns the calls of job that wait for approval, by approval id,
// or nil when none waits (or they cannot be listed now: the
// task shows working, and the next poll may do better).
func (t *Tasks) pending(ctx context.Context, ns, job string) map[string]jobs.Approval {
	list, err := t.b.Approvals(ctx, ns)
	if err != nil {
		return nil
	}
	var out map[string]jobs.Approval
	for _, ap := range list {
		if ap.JobID != job {
			continue
		}
		if out == nil {
			out = map[string]jobs.Approval{}
		}
		out[ap.ID] = ap
	}
	return out
}

// inputRequests asks, as form elicitations keyed by approval id, about
// each pending call. An approval id is never reused, as the extension
// requires of a key.
func inputRequests(pending map[string]jobs.Approval) map[string]any {
	out := make(map[string]any, len(pending))
	for id, ap := range pending {
		msg, schema := approvalQuestion(ap)
		out[id] = map[string]any{"method": mcp.MethodElicitationCreate,
			"params": map[string]any{"mode": "form", "message": msg, "requestedSchema": schema}}
	}
	return out
}

// maxInputResponses bounds the answers one tasks/update may carry.
const maxInputResponses = 256

// update passes the answers of tasks/update to the parked calls they
// answer. Keys that are not a waiting call of this task (never asked,
// answered already, another task's) are ignored, as the extension asks; the
// first answer of a call wins, wherever it came from.
func (t *Tasks) update(ctx context.Context, ns string, params json.RawMessage) (any, *rpcError) {
	var p struct {
		TaskID         string                     `json:"taskId"`
		InputResponses map[string]json.RawMessage `json:"inputResponses"`
	}
	if err := json.Unmarshal(params, &p); err != nil || p.TaskID == "" {
		return nil, invalidParams("tasks/update needs taskId (a string) and inputResponses (an object keyed by the inputRequests keys tasks/get returned)")
	}
	if p.InputResponses == nil {
		return nil, invalidParams("tasks/update needs inputResponses: an object keyed by the inputRequests keys tasks/get returned")
	}
	if len(p.InputResponses) > maxInputResponses {
		return nil, invalidParams("tasks/update carries %d inputResponses: at most %d at once", len(p.InputResponses), maxInputResponses)
	}
	rec, err := t.b.Get(ctx, ns, p.TaskID)
	if rerr := t.backendError(p.TaskID, err); rerr != nil {
		return nil, rerr
	}
	if rec.Status.Terminal() {
		return completeAck, nil // nothing waits any more
	}
	pending := t.pending(ctx, ns, rec.Job.ID)
	type answer struct{ id, decision, reason string }
	var answers []answer
	for key, raw := range p.InputResponses {
		if _, ok := pending[key]; !ok {
			continue
		}
		var r struct {
			Action  string         `json:"action"`
			Content map[string]any `json:"content"`
		}
		if err := json.Unmarshal(raw, &r); err != nil || r.Action == "" {
			return nil, invalidParams("inputResponses[%q] is not an elicitation result: want {\"action\": \"accept\"|\"decline\"|\"cancel\", \"content\": {\"approve\": true|false, \"reason\": \"...\"}}", key)
		}
		if decision, reason, ok := approvalAnswer(r.Action, r.Content); ok {
			answers = append(answers, answer{key, decision, reason})
		}
	}
	for _, an := range answers {
		if _, err := t.b.DecideApproval(ctx, ns, an.id, an.decision, TasksUpdatedBy, an.reason); err != nil && errs.KindOf(err) != errs.Conflict && errs.KindOf(err) != errs.NotFound {
			return nil, &rpcError{Code: mcp.INTERNAL_ERROR, Message: fmt.Sprintf("pass on the answer to call %s: %v", an.id, err)}
		}
	}
	return completeAck, nil
}

// modernHeaders checks the Streamable HTTP headers of a 2026-07-28 request
// the task layer answers, as mcp-go checks those of the requests it does:
// Mcp-Protocol-Version equal to the _meta's, Mcp-Method (and Mcp-Name on a
// tools/call) matching the body, and Mcp-Name, when sent on a task method,
// equal to params.taskId (the extension's routing header).
func modernHeaders(h http.Header, req rpcRequest) *rpcError {
	mismatch := func(format string, args ...any) *rpcError {
		return &rpcError{Code: mcp.HEADER_MISMATCH, Message: fmt.Sprintf(format, args...)}
	}
	if v := h.Get(mcp.HeaderProtocolVersion); v != req.era.version {
		return mismatch("%s header %q does not match the request's _meta %s %q", mcp.HeaderProtocolVersion, v, mcp.MetaKeyProtocolVersion, req.era.version)
	}
	if err := mcp.ValidateStandardHeaders(h.Get, req.era.version, mcp.MCPMethod(req.Method), req.Params); err != nil {
		return mismatch("%v", err)
	}
	if !strings.HasPrefix(req.Method, "tasks/") {
		return nil
	}
	name := h.Get(mcp.HeaderName)
	if name == "" {
		return nil
	}
	var p struct {
		TaskID string `json:"taskId"`
	}
	_ = json.Unmarshal(req.Params, &p) // a bad taskId is told below or by the method
	if decoded, ok := mcp.DecodeHeaderValue(name); !ok || decoded != p.TaskID {
		return mismatch("%s header %q does not match params.taskId %q", mcp.HeaderName, name, p.TaskID)
	}
	return nil
}

// modernStatus is the HTTP status of a 2026-07-28 response with error code
// code, as the transport prescribes (and mcp-go answers its own).
func modernStatus(code int) int {
	switch code {
	case 0:
		return http.StatusOK
	case mcp.METHOD_NOT_FOUND:
		return http.StatusNotFound
	case mcp.HEADER_MISMATCH, mcp.MISSING_REQUIRED_CLIENT_CAPABILITY, mcp.UNSUPPORTED_PROTOCOL_VERSION,
		mcp.INVALID_REQUEST, mcp.INVALID_PARAMS, mcp.PARSE_ERROR:
		return http.StatusBadRequest
	}
	return http.StatusOK
}

// discoverTasksExtension makes a server/discover answer advertise the tasks
// extension in place of the 2025-11-25 tasks capability, which the
// extension replaces (initialize keeps the latter).
func discoverTasksExtension(_ context.Context, _ any, _ *mcp.DiscoverRequest, res *mcp.DiscoverResult) {
	if res == nil {
		return
	}
	res.Capabilities.Tasks = nil
	ext := maps.Clone(res.Capabilities.Extensions)
	if ext == nil {
		ext = map[string]any{}
	}
	ext[TasksExtension] = map[string]any{}
	res.Capabilities.Extensions = ext
}

// withoutLegacyTask returns msg without a 2025-11-25 `task` param when it
// is a 2026-07-28 tools/call of a run tool that mcp-go will answer (the
// request did not declare the extension): mcp-go would make it a task of its
// own store, and such a client must get the tool's result, never a task.
// Anything else is returned as it is.
func (t *Tasks) withoutLegacyTask(msg []byte) []byte {
	if !bytes.Contains(msg, []byte(`"task"`)) { // most messages: no decoding, no copy
		return msg
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(msg, &m) != nil {
		return msg
	}
	var method string
	if json.Unmarshal(m["method"], &method) != nil || method != string(mcp.MethodToolsCall) {
		return msg
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(m["params"], &params) != nil || params["task"] == nil {
		return msg
	}
	var name string
	_ = json.Unmarshal(params["name"], &name)
	if !t.offers(name) || !eraOf(m["params"]).modern {
		return msg
	}
	delete(params, "task")
	b, err := json.Marshal(params)
	if err != nil {
		return msg
	}
	m["params"] = b
	out, err := json.Marshal(m)
	if err != nil {
		return msg
	}
	if len(msg) > 0 && msg[len(msg)-1] == '\n' {
		out = append(out, '\n')
	}
	return out
}
