package jobs

import "context"

// Service is the job API a front-end offers its callers: run and submit
// jobs, read, wait for, list, cancel and follow them, watch their output,
// read their files, and answer the proxied calls that wait for a person's
// approval. The jobs API (jobsapi), the MCP server and its tasks
// (mcpserver) and the console take it; the front-end's job client
// (frontend.Frontend) and the front-end that starts in the background
// (app.Lazy) implement it.
//
// Namespaces are the caller's ("" is DefaultNamespace) and ids are the
// namespace's own: another namespace's job of the same id is another job,
// and reads of it answer NotFound. Errors carry an errs kind, which says
// what the caller can do; each method lists the kinds it returns besides
// ctx's own error. Every method may answer Unavailable: the broker or the
// state service is not reachable, or (app.Lazy) the front-end is not
// running yet.
type Service interface {
	// Limits returns the submission limits of namespaces without their
	// own. It never fails: app.Lazy knows them before it runs.
	Limits() Limits
	// LimitsFor returns namespace's submission limits: Limits with the
	// namespace's own maxima.
	LimitsFor(namespace string) Limits

	// Run validates and submits job for its namespace (job.Namespace), then
	// waits for its terminal record, which it returns; progress, if not
	// nil, sees each lifecycle event as it happens. When ctx ends first the
	// job is cancelled. The failure of the job's code is the record's
	// status, not an error. Errors: Invalid (an *InvalidError; the job
	// never reaches a worker), Conflict (the id names another job),
	// OverCap, QueueFull, ShuttingDown, Unavailable.
	Run(ctx context.Context, job *Job, progress func(Event)) (*Record, error)
	// Submit is Run without waiting: it returns the job's first record (or,
	// for an id submitted before with the same job, that job's). Errors:
	// those of Run; with QueueFull the record is the rejected one.
	Submit(ctx context.Context, job *Job) (*Record, error)
	// SubmitMany submits jobs for namespace without waiting; each job's
	// outcome, in order, is a Submitted whose Err is nil, Invalid,
	// Conflict, QueueFull or Unavailable. Jobs that fail validation are not
	// submitted; the others are.
	SubmitMany(ctx context.Context, js []*Job, namespace string) []Submitted
	// SubmitWorkflow is SubmitMany for jobs that belong together: unless
	// every job is valid (parents known, no cycle), none is submitted.
	SubmitWorkflow(ctx context.Context, js []*Job, namespace string) []Submitted

	// Get returns namespace's record of job id. Errors: NotFound,
	// Unavailable.
	Get(ctx context.Context, namespace, id string) (*Record, error)
	// Wait returns namespace's record of job id once it is terminal, or its
	// latest record with ctx's error when ctx ends first. Errors: NotFound,
	// Unavailable.
	Wait(ctx context.Context, namespace, id string) (*Record, error)
	// List returns namespace's records matching f (its Namespace is
	// ignored; Prefix and Cursor are the namespace's ids) and the cursor of
	// the next page ("" at the end). Errors: Invalid (the filter),
	// Unavailable.
	List(ctx context.Context, namespace string, f Filter) ([]*Record, string, error)
	// DeadLetters is List of namespace's dead letters.
	DeadLetters(ctx context.Context, namespace string, f Filter) ([]*Record, string, error)
	// Cancel cancels namespace's job id: a running job's sandbox is
	// stopped, a queued job never runs; a finished job stays as it is.
	// Errors: NotFound, Unavailable.
	Cancel(ctx context.Context, namespace, id, reason string) error
	// Follow calls fn with each job event of namespace, in the fleet's
	// order, until ctx ends (it returns nil) or fn fails (it returns fn's
	// error). With resume it starts after sequence after (0: the oldest
	// event kept); without, at the next new event. Errors: Unavailable.
	Follow(ctx context.Context, namespace string, after uint64, resume bool, fn func(EventView) error) error
	// WatchOutput calls fn with each chunk of live output of namespace's
	// job id (best effort) until stop is called; watch before submitting
	// so no chunk is missed. Errors: Unavailable.
	WatchOutput(namespace, id string, fn func(stream, data string)) (stop func(), err error)
	// File returns file name that namespace's job id wrote. Errors:
	// NotFound (no such job or file, or an id or name that cannot be one),
	// Unavailable.
	File(ctx context.Context, namespace, id, name string) (FileInfo, []byte, error)

	// Approvals lists namespace's proxied calls waiting for a person's
	// approval, wherever in the fleet they are parked. Errors:
	// Unavailable.
	Approvals(ctx context.Context, namespace string) ([]Approval, error)
	// DecideApproval answers namespace's approval id, "approve" or "deny";
	// by says who answered. Errors: NotFound, Invalid (the decision),
	// Conflict (it was answered, timed out or withdrawn), Unavailable.
	DecideApproval(ctx context.Context, namespace, id, decision, by, reason string) (Approval, error)
	// AnswerApproval is DecideApproval with an answer that may widen the
	// approval into a grant (returned when it does). Errors: those of
	// DecideApproval; Unavailable with the approval when the call is
	// approved but the grant could not be recorded.
	AnswerApproval(ctx context.Context, namespace, id string, ans ApprovalAnswer, by string) (Approval, *Grant, error)
	// Grants lists namespace's grants in force. Errors: Unavailable.
	Grants(ctx context.Context, namespace string) ([]Grant, error)
	// RevokeGrant ends namespace's grant id. Errors: NotFound, Unavailable.
	RevokeGrant(ctx context.Context, namespace, id string) error
	// FollowApprovals calls fn with each approval of namespace asked or
	// answered from now on, until ctx ends or fn fails (it returns fn's
	// error). Errors: Unavailable (also when the watch ends: follow again).
	FollowApprovals(ctx context.Context, namespace string, fn func(ApprovalEvent) error) error
}
