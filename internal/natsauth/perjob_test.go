package natsauth_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/natsauth"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// logLines is a logger's output, for tests that wait for what a part said.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// waitCount returns once msg was logged n times, or fails.
func (l *logLines) waitCount(t *testing.T, msg string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		got := strings.Count(l.buf.String(), msg)
		l.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q logged %d times, want %d", msg, got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gatedJob is code that prints "ready", waits for a file to exist, then
// prints "done": the test decides when it ends.
func gatedJob(gate string) string {
	return fmt.Sprintf("import os, time\nprint('ready', flush=True)\nwhile not os.path.exists(%q):\n    time.sleep(0.02)\nprint('done')", gate)
}

// TestMalformedCancelStopsNothing attacks from a front-end identity, which
// may publish on every job's cancel subject: while another tenant's job runs
// it sends that subject what is not a cancel announcement of the job (the
// raw reason older front-ends sent, empty and null frames, another job's
// announcement, an oversized one, bytes that are not JSON). The worker
// refuses each, saying so, and the job runs to its end; a front-end's
// genuine cancel still stops the next job.
func TestMalformedCancelStopsNothing(t *testing.T) {
	t.Parallel()
	_, _, connect := fleetIn(t)
	s := jobs.Subjects{}
	logs := &logLines{}
	wnc, wr := connect(natsauth.RoleWorker)
	wcfg := worker.DefaultConfig("w1")
	wcfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	testutil.WorkerOn(t, wnc, testutil.ProcessRuntime(t), wcfg)
	fnc, fr := connect(natsauth.RoleFrontend)
	fe := testutil.FrontendOnWith(t, fnc, frontend.Config{ID: "fe1", Policy: frontend.DefaultPolicy()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := fe.Health(ctx); err != nil {
		t.Fatalf("health: %v", err)
	}
	// The job's process may run as another user: it must see the gate.
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	running := func(id, gate string) {
		t.Helper()
		ready := make(chan struct{})
		var once sync.Once
		stop, err := fe.WatchOutput("victim", id, func(_, data string) {
			if strings.Contains(data, "ready") {
				once.Do(func() { close(ready) })
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		if out := fe.SubmitMany(ctx, []*jobs.Job{{ID: id, Code: gatedJob(gate)}}, "victim"); out[0].Err != nil {
			t.Fatal(out[0].Err)
		}
		select {
		case <-ready:
		case <-ctx.Done():
			t.Fatalf("job %s never started (refusals: worker %v, front-end %v)", id, wr.errs, fr.errs)
		}
	}

	gate := filepath.Join(dir, "v1")
	running("v1", gate)
	id := jobs.ScopedID("victim", "v1")
	rogue, rr := connect(natsauth.RoleFrontend)
	other, err := queue.EncodeCancel(queue.Cancel{Job: jobs.ScopedID("victim", "v2")})
	if err != nil {
		t.Fatal(err)
	}
	frames := [][]byte{
		[]byte("cancelled through the jobs API"),
		nil,
		[]byte("null"),
		other,
		[]byte(`{"job":"` + id + `","reason":"` + strings.Repeat("x", queue.MaxCancelFrame) + `"}`),
		{0xff, 0xfe, 0x00},
	}
	for _, f := range frames {
		if err := rogue.Publish(s.Cancel(id), f); err != nil {
			t.Fatal(err)
		}
	}
	if err := rogue.Flush(); err != nil {
		t.Fatal(err)
	}
	logs.waitCount(t, "refusing a cancel announcement", len(frames))
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rec, err := fe.Wait(ctx, "victim", "v1")
	if err != nil || rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "ready\ndone\n" {
		t.Fatalf("the victim's job after malformed cancels: %+v %v", rec, err)
	}

	// A front-end's cancel, the same subject's genuine message, stops a job.
	running("v2", filepath.Join(dir, "never"))
	if err := fe.Cancel(ctx, "victim", "v2", "test"); err != nil {
		t.Fatal(err)
	}
	if rec, err := fe.Wait(ctx, "victim", "v2"); err != nil || rec.Status != jobs.StatusCancelled {
		t.Fatalf("a genuinely cancelled job: %+v %v", rec, err)
	}
	if len(wr.errs) > 0 || len(fr.errs) > 0 || len(rr.errs) > 0 {
		t.Fatalf("refusals on the way: worker %v, front-end %v, rogue %v", wr.errs, fr.errs, rr.errs)
	}
}

// TestMalformedSessionLookupsEndNothing attacks from a front-end identity,
// which may ask any worker about any session: it sends the worker holding a
// tenant's session look-ups that are not one (empty, the end prefix alone or
// twice, the key with trailing bytes, an oversized one, a wildcard). The
// worker answers each "gone" and ends nothing: the tenant's next job runs
// in the session with its globals, and a well-formed look-up is still
// answered "held".
func TestMalformedSessionLookupsEndNothing(t *testing.T) {
	t.Parallel()
	_, _, connect := fleetIn(t)
	s := jobs.Subjects{}
	fe, wr, fr := workerAndFrontend(t, connect)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if rec, err := fe.Run(ctx, &jobs.Job{Code: "secret = 'db-password'", Namespace: "victim", Session: "s1"}, nil); err != nil || rec.Status != jobs.StatusSuccess || rec.Worker != "w1" {
		t.Fatalf("warm-up job: %v %+v", err, rec)
	}
	key := queue.SessionKey("victim", "s1")
	rogue, rr := connect(natsauth.RoleFrontend)
	for _, req := range []string{
		"",
		queue.EndSessionRequest,
		queue.EndSessionRequest + queue.EndSessionRequest + key,
		queue.EndSessionRequest + key + "\x00",
		queue.EndSessionRequest + key + strings.Repeat(" ", queue.MaxSessionRequest),
		queue.EndSessionRequest + "victim.*",
		queue.EndSessionRequest + "victim.>",
	} {
		m, err := rogue.Request(s.WorkerSessions("w1"), []byte(req), 5*time.Second)
		if err != nil {
			t.Fatalf("look-up %q: %v", req[:min(len(req), 30)], err)
		}
		if a, err := queue.DecodeSessionAnswer(m.Data); err != nil || a != queue.SessionGone {
			t.Fatalf("look-up %q answered %q (%v), want gone", req[:min(len(req), 30)], m.Data, err)
		}
	}
	if !queue.HoldsSession(ctx, rogue, s, "w1", key) {
		t.Fatal("a well-formed look-up of the live session was not answered held")
	}
	rec, err := fe.Run(ctx, &jobs.Job{Code: "print(secret)", Namespace: "victim", Session: "s1"}, nil)
	if err != nil || rec.Status != jobs.StatusSuccess || rec.Worker != "w1" || rec.Result.Stdout != "db-password\n" {
		t.Fatalf("the victim's session after malformed look-ups: %v %+v", err, rec)
	}
	if len(wr.errs) > 0 || len(fr.errs) > 0 || len(rr.errs) > 0 {
		t.Fatalf("refusals on the way: worker %v, front-end %v, rogue %v", wr.errs, fr.errs, rr.errs)
	}
}
