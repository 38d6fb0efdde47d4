package tracing

import (
	"strings"

	"go.opentelemetry.io/otel/attribute"
)

// Span names. docs/design.md ("Traces") has the tree they form.
const (
	// SpanSubmit is the front-end's submission of a job (a run_python call,
	// an /api/jobs submission, a task); for run_python it lasts until the
	// result is back.
	SpanSubmit = "mcpexec.submit"
	// SpanQueueWait runs on the worker from the job's submitted_at to the
	// moment a worker took it from the queue.
	SpanQueueWait = "mcpexec.queue.wait"
	// SpanAcquire is the worker getting a sandbox (a warm one, or a container
	// started) up to the moment the code is sent.
	SpanAcquire = "mcpexec.sandbox.acquire"
	// SpanRun is the code's execution in the sandbox.
	SpanRun = "mcpexec.job.run"
	// SpanProxyCall is one proxy call of the sandbox, sent by the worker.
	SpanProxyCall = "mcpexec.proxy.call"
	// SpanProxyHandle is a front-end answering a proxy call.
	SpanProxyHandle = "mcpexec.proxy.handle"
	// SpanStateApply is a state replica applying a job event.
	SpanStateApply = "mcpexec.state.apply"
	// SpanMemoryWrite is the state service writing memory (put or delete).
	SpanMemoryWrite = "mcpexec.state.memory_write"
)

// Attribute keys.
const (
	AttrJobID        = attribute.Key("mcpexec.job.id")
	AttrAttempt      = attribute.Key("mcpexec.job.attempt")
	AttrLanguage     = attribute.Key("mcpexec.job.language")
	AttrStatus       = attribute.Key("mcpexec.job.status")
	AttrExitCode     = attribute.Key("mcpexec.job.exit_code")
	AttrVia          = attribute.Key("mcpexec.submit.via") // run_python, run_javascript, api, task
	AttrDelivery     = attribute.Key("mcpexec.delivery")
	AttrWorker       = attribute.Key("mcpexec.worker.id")
	AttrSandbox      = attribute.Key("mcpexec.sandbox.id") // the container's short id
	AttrFrontend     = attribute.Key("mcpexec.frontend.id")
	AttrNode         = attribute.Key("mcpexec.state.node")
	AttrEventKind    = attribute.Key("mcpexec.event.kind")
	AttrApplied      = attribute.Key("mcpexec.state.changed")
	AttrMemoryOp     = attribute.Key("mcpexec.memory.op")
	AttrMethod       = attribute.Key("mcpexec.proxy.method")
	AttrServer       = attribute.Key("mcpexec.proxy.server")
	AttrTool         = attribute.Key("mcpexec.proxy.tool")
	AttrOutcome      = attribute.Key("mcpexec.proxy.outcome") // ok, error
	AttrDurationMS   = attribute.Key("mcpexec.proxy.duration_ms")
	AttrAdmitted     = attribute.Key("mcpexec.proxy.admitted")   // the call carried its job's capability
	AttrDecision     = attribute.Key("mcpexec.proxy.decision")   // a tool call's: allow, deny
	AttrDecidedBy    = attribute.Key("mcpexec.proxy.decided_by") // policy, or who answered
	AttrQueueOutcome = attribute.Key("mcpexec.queue.outcome")
)

// Clean makes a name a sandbox or a client chose fit for an attribute:
// valid UTF-8, at most n bytes.
func Clean(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8Start(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }
