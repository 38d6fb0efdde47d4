package worker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestJobWaitsForAWorkerOfItsLanguage: a JavaScript job is not taken by a
// worker whose sandboxes run Python only; it waits, queued, and the first
// worker that runs JavaScript takes it. Python jobs go on meanwhile.
func TestJobWaitsForAWorkerOfItsLanguage(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	ran := func(worker string) func(context.Context, sandbox.Job) (sandbox.Result, error) {
		return func(_ context.Context, job sandbox.Job) (sandbox.Result, error) {
			return sandbox.Result{Status: sandbox.StatusSuccess, Stdout: worker + " ran " + job.Language}, nil
		}
	}
	py := &testutil.FakeRuntime{Func: ran("py")}
	testutil.Worker(t, b, py, testutil.QuickWorker("py", q))

	testutil.MustSubmit(t, fe, &jobs.Job{ID: "js-1", Code: "console.log(1)", Language: jobs.LangJavaScript})
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "py-1", Code: "print(1)", Language: jobs.LangPython})
	if rec := testutil.WaitRecord(t, b, "py-1", jobs.StatusSuccess); rec.Result.Stdout != "py ran " {
		t.Fatalf("python job: %+v", rec.Result)
	}
	// Several of the python-only worker's fetch rounds later, the
	// JavaScript job is still queued.
	time.Sleep(5 * testutil.QuickWorker("", q).FetchWait)
	if rec := testutil.WaitRecord(t, b, "js-1", jobs.StatusQueued); rec.Attempt != 0 {
		t.Fatalf("the javascript job was attempted by a python-only worker: %+v", rec)
	}
	if py.Runs() != 1 {
		t.Fatalf("the python-only worker ran %d jobs, want 1", py.Runs())
	}

	both := &testutil.FakeRuntime{Func: ran("both"), Langs: []string{sandbox.Python, sandbox.JavaScript}}
	testutil.Worker(t, b, both, testutil.QuickWorker("both", q))
	rec := testutil.WaitRecord(t, b, "js-1", jobs.StatusSuccess)
	if rec.Result.Stdout != "both ran javascript" || rec.Result.Worker != "both" {
		t.Fatalf("javascript job: %+v", rec.Result)
	}
	// The worker of both languages takes Python jobs too.
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "py-2", Code: "print(2)"})
	testutil.WaitRecord(t, b, "py-2", jobs.StatusSuccess)
}

// TestUnknownLanguageIsRefused: a job in a language the sandbox does not run
// is refused at submission, saying which languages there are.
func TestUnknownLanguageIsRefused(t *testing.T) {
	t.Parallel()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	fe := testutil.Frontend(t, b, "fe")
	s := testutil.Submit(t, fe, &jobs.Job{ID: "rb", Code: "puts 1", Language: "ruby"})[0]
	var inv *jobs.InvalidError
	if !errors.As(s.Err, &inv) || inv.Field != "language" || !strings.Contains(inv.Message, "python, javascript") {
		t.Fatalf("ruby job: %v", s.Err)
	}
	t.Log(s.Err)
}
