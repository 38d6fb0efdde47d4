package app_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/app"
	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// Both implementations of the job service.
var (
	_ jobs.Service = (*frontend.Frontend)(nil)
	_ jobs.Service = (*app.Lazy)(nil)
)

// TestServiceConformance runs one suite of jobs.Service against the
// front-end's job client and against the lazily started front-end that
// forwards to it (an embedded broker, a worker on a fake runtime), each in
// its own namespace: what the jobs API, the MCP server and the console see
// does not depend on which of the two they were given.
func TestServiceConformance(t *testing.T) {
	cfg := lazyConfig(t, "svc", func(context.Context) (sandbox.Runtime, error) { return testutil.NewFakeRuntime(8), nil })
	cfg.Logger = testutil.Logger(t)
	l := app.StartLazily(cfg, nil)
	t.Cleanup(l.Close)
	testenv.Receive(t, l.Ready(), 2*time.Minute, "the lazily started stack")
	s, err := l.Stack()
	if err != nil {
		t.Fatal(err)
	}
	for name, svc := range map[string]jobs.Service{"frontend": s.Frontend, "lazy": l} {
		t.Run(name, func(t *testing.T) { exerciseService(t, svc, "ns-"+name) })
	}
}

// exerciseService checks each method of svc within namespace ns.
func exerciseService(t *testing.T, svc jobs.Service, ns string) {
	ctx := testenv.Context(t, 3*time.Minute)
	if got := svc.LimitsFor(ns); got != svc.Limits() {
		t.Errorf("LimitsFor of a namespace without a policy = %+v, want Limits %+v", got, svc.Limits())
	}

	rec, err := svc.Run(ctx, &jobs.Job{ID: "a", Namespace: ns, Code: "hello"}, nil)
	if err != nil || rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "hello" || rec.Job.ID != "a" {
		t.Fatalf("Run: %+v %v", rec, err)
	}

	rec, err = svc.Submit(ctx, &jobs.Job{ID: "b", Namespace: ns, Code: "block"})
	if err != nil || rec.Job.ID != "b" || rec.Status.Terminal() {
		t.Fatalf("Submit: %+v %v", rec, err)
	}
	stop, err := svc.WatchOutput(ns, "b", func(string, string) {})
	if err != nil {
		t.Fatalf("WatchOutput: %v", err)
	}
	stop()
	if got, err := svc.Get(ctx, ns, "b"); err != nil || got.Job.ID != "b" {
		t.Fatalf("Get: %+v %v", got, err)
	}
	if err := svc.Cancel(ctx, ns, "b", "the suite"); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if got, err := svc.Wait(ctx, ns, "b"); err != nil || got.Status != jobs.StatusCancelled {
		t.Fatalf("Wait after Cancel: %+v %v", got, err)
	}

	subs := svc.SubmitMany(ctx, []*jobs.Job{{ID: "c", Code: "x"}, {ID: "a", Code: "not hello"}}, ns)
	if len(subs) != 2 || subs[0].Err != nil || subs[0].Record.Job.ID != "c" || errs.KindOf(subs[1].Err) != errs.Conflict {
		t.Fatalf("SubmitMany: %+v", subs)
	}
	subs = svc.SubmitWorkflow(ctx, []*jobs.Job{{ID: "d", Code: "x"}, {ID: "e", Code: "x", After: []string{"nobody"}}}, ns)
	if len(subs) != 2 || errs.KindOf(subs[1].Err) != errs.Invalid {
		t.Fatalf("SubmitWorkflow with an unknown parent: %+v", subs)
	}
	if _, err := svc.Get(ctx, ns, "d"); errs.KindOf(err) != errs.NotFound {
		t.Fatalf("a job of a refused workflow was submitted: %v", err)
	}

	recs, _, err := svc.List(ctx, ns, jobs.Filter{})
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.Job.ID)
	}
	if err != nil || !slices.Equal(ids, []string{"a", "b", "c"}) {
		t.Fatalf("List: %v %v", ids, err)
	}
	if _, _, err := svc.List(ctx, ns, jobs.Filter{Limit: -1}); errs.KindOf(err) != errs.Invalid {
		t.Fatalf("List with a bad filter: %v", err)
	}
	if recs, _, err := svc.DeadLetters(ctx, ns, jobs.Filter{}); err != nil || len(recs) != 0 {
		t.Fatalf("DeadLetters: %v %v", recs, err)
	}

	// Follow from the oldest event kept: this namespace's, up to a's end.
	errSeen := errors.New("seen")
	var kinds []jobs.EventKind
	err = svc.Follow(ctx, ns, 0, true, func(ev jobs.EventView) error {
		if ev.Job != "a" {
			return nil
		}
		kinds = append(kinds, ev.Kind)
		if ev.Status.Terminal() {
			return errSeen
		}
		return nil
	})
	if !errors.Is(err, errSeen) || len(kinds) == 0 {
		t.Fatalf("Follow: %v, saw %v", err, kinds)
	}

	for what, err := range map[string]error{
		"Get":         get(svc.Get(ctx, ns, "nobody")),
		"Wait":        get(svc.Wait(ctx, ns, "nobody")),
		"Cancel":      svc.Cancel(ctx, ns, "nobody", ""),
		"File":        file(svc.File(ctx, ns, "a", "out.txt")),
		"Decide":      get(svc.DecideApproval(ctx, ns, "nobody", "approve", "the suite", "")),
		"Answer":      answer(svc.AnswerApproval(ctx, ns, "nobody", jobs.ApprovalAnswer{Decision: "approve"}, "the suite")),
		"RevokeGrant": svc.RevokeGrant(ctx, ns, "nobody"),
	} {
		if errs.KindOf(err) != errs.NotFound {
			t.Errorf("%s of nothing: %v, want a not_found error", what, err)
		}
	}
	if aps, err := svc.Approvals(ctx, ns); err != nil || len(aps) != 0 {
		t.Fatalf("Approvals: %v %v", aps, err)
	}
	if gs, err := svc.Grants(ctx, ns); err != nil || len(gs) != 0 {
		t.Fatalf("Grants: %v %v", gs, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := svc.FollowApprovals(cctx, ns, func(jobs.ApprovalEvent) error { return nil }); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("FollowApprovals with an ended context: %v", err)
	}
}

// TestLazyServiceNotReady: before its stack runs, every method of a Lazy
// front-end's job service answers ErrNotReady (Unavailable), with the
// cause, and none waits for a start that failed.
func TestLazyServiceNotReady(t *testing.T) {
	l := app.StartLazily(lazyConfig(t, "svc2", func(context.Context) (sandbox.Runtime, error) { return nil, errors.New("no runtime here") }), nil)
	t.Cleanup(l.Close)
	ctx := context.Background()
	_, err := l.Run(ctx, &jobs.Job{Code: "x"}, nil) // waits for the first start to fail
	var svc jobs.Service = l
	job := func() []*jobs.Job { return []*jobs.Job{{Code: "x"}} }
	for what, err := range map[string]error{
		"Run":             err,
		"Submit":          get(svc.Submit(ctx, &jobs.Job{Code: "x"})),
		"SubmitMany":      svc.SubmitMany(ctx, job(), "")[0].Err,
		"SubmitWorkflow":  svc.SubmitWorkflow(ctx, job(), "")[0].Err,
		"Get":             get(svc.Get(ctx, "", "a")),
		"Wait":            get(svc.Wait(ctx, "", "a")),
		"List":            list(svc.List(ctx, "", jobs.Filter{})),
		"DeadLetters":     list(svc.DeadLetters(ctx, "", jobs.Filter{})),
		"Cancel":          svc.Cancel(ctx, "", "a", ""),
		"Follow":          svc.Follow(ctx, "", 0, false, func(jobs.EventView) error { return nil }),
		"WatchOutput":     get(svc.WatchOutput("", "a", func(string, string) {})),
		"File":            file(svc.File(ctx, "", "a", "f")),
		"Approvals":       get(svc.Approvals(ctx, "")),
		"DecideApproval":  get(svc.DecideApproval(ctx, "", "a", "approve", "", "")),
		"AnswerApproval":  answer(svc.AnswerApproval(ctx, "", "a", jobs.ApprovalAnswer{Decision: "approve"}, "")),
		"Grants":          get(svc.Grants(ctx, "")),
		"RevokeGrant":     svc.RevokeGrant(ctx, "", "a"),
		"FollowApprovals": svc.FollowApprovals(ctx, "", func(jobs.ApprovalEvent) error { return nil }),
	} {
		if !app.IsNotReady(err) || errs.KindOf(err) != errs.Unavailable {
			t.Errorf("%s before the stack runs: %v, want ErrNotReady", what, err)
		}
	}
	if svc.LimitsFor("any") != jobs.DefaultLimits() {
		t.Errorf("LimitsFor before the stack runs: %+v", svc.LimitsFor("any"))
	}
}

// lazyConfig is the config of an embedded stack (front-end name-fe, worker
// name-w) whose runtime newRuntime opens.
func lazyConfig(t *testing.T, name string, newRuntime func(context.Context) (sandbox.Runtime, error)) app.FrontendConfig {
	t.Helper()
	cfg := app.FrontendConfig{
		DataDir:    t.TempDir(),
		Frontend:   frontend.Config{ID: name + "-fe", Limits: jobs.DefaultLimits()},
		Worker:     worker.DefaultConfig(name + "-w"),
		NewRuntime: newRuntime,
	}
	cfg.Worker.Queue = queue.DefaultConfig()
	return cfg
}

// get keeps the error of a two-valued call.
func get[T any](_ T, err error) error { return err }

// list keeps the error of a listing.
func list(_ []*jobs.Record, _ string, err error) error { return err }

// file keeps the error of File.
func file(_ jobs.FileInfo, _ []byte, err error) error { return err }

// answer keeps the error of AnswerApproval.
func answer(_ jobs.Approval, _ *jobs.Grant, err error) error { return err }
