package frontend_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestResubmitEnqueuesClaimedJob: a submission whose claim (the submitted
// event) landed but whose job message did not (the jobs stream's leader
// died in between; the caller was answered 503 or gave up) is submitted
// again with the same id, as the API invites: the answer acknowledges the
// job, so the job must be enqueued and run, not left queued for ever. The
// fault suite found this (internal/faults, kill -9 of the jobs leader).
func TestResubmitEnqueuesClaimedJob(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.NewFakeRuntime(0), worker.DefaultConfig("w1"))
	fe := testutil.Frontend(t, b, "fe1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The claim of a first submission, without its enqueue.
	spec := &jobs.Job{ID: "half", Code: "print(1)"}
	if err := spec.Normalize(jobs.DefaultLimits(), time.Now()); err != nil {
		t.Fatal(err)
	}
	spec.Namespace, spec.Frontend, spec.ID = "ns", "fe-dead", jobs.ScopedID("ns", "half")
	data, err := json.Marshal(jobs.Event{Job: spec.ID, Kind: jobs.EventSubmitted, Spec: spec, At: spec.SubmittedAt})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(testutil.Connect(t, b, "first-submitter"))
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(jobs.Subjects{}.Event(spec.ID, jobs.EventSubmitted))
	m.Data = data
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	for {
		if rec, err := fe.Get(ctx, "ns", "half"); err == nil && rec.Status == jobs.StatusQueued {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the claimed job was never recorded")
		}
		time.Sleep(20 * time.Millisecond)
	}

	out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "half", Code: "print(1)"}}, "ns")
	if out[0].Err != nil {
		t.Fatalf("resubmit: %v", out[0].Err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
	defer wcancel()
	rec, err := fe.Wait(wctx, "ns", "half")
	if err != nil || rec.Status != jobs.StatusSuccess {
		t.Fatalf("the acknowledged resubmission never ran: %v %v", rec, err)
	}
}
