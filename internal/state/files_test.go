package state_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestFilesThroughService puts and reads jobs' files through the state
// service, and attacks it as a worker identity and as another namespace
// would: a put without the job's capability, inputs added after the
// submission, files over the job's limits or its namespace's quota, files
// after the job ended, another namespace's read, bytes changed in the store.
func TestFilesThroughService(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	nc := testutil.Connect(t, b, "files")
	qc, err := queue.NewClient(nc, jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	key, err := queue.ProxyKey(ctx, qc.JetStream(), jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	sc := state.NewClient(nc, jobs.Subjects{})
	sc.EventsFloor = qc.EventsSeq
	id := jobs.ScopedID("a", "j1")
	capa := jobs.Capability(key, id)

	in, err := sc.PutFile(ctx, state.FilePut{Job: id, Capability: capa, Name: "in.csv", Namespace: "a"}, []byte("x,y\n1,2\n"))
	if err != nil || in.Size != 8 || in.MimeType != "text/csv" || len(in.SHA256) != 64 {
		t.Fatalf("put input: %+v %v", in, err)
	}
	if _, err := sc.PutFile(ctx, state.FilePut{Job: id, Capability: jobs.Capability([]byte("not the fleet's key, 32 bytes!!!"), id), Name: "x", Namespace: "a"}, []byte("x")); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("put without the capability: %v", err)
	}
	if _, err := sc.PutFile(ctx, state.FilePut{Job: id, Capability: capa, Name: "../x", Namespace: "a"}, []byte("x")); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("put of a bad name: %v", err)
	}
	job := &jobs.Job{ID: id, Code: "print(1)", Namespace: "a", Timeout: 10, MaxAttempts: 1, Files: []jobs.FileInfo{in},
		FileLimits: &jobs.FileLimits{MaxFiles: 2, MaxFileBytes: 64, MaxJobBytes: 100, QuotaBytes: 60}}
	if err := job.Normalize(jobs.DefaultLimits(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := qc.Submit(ctx, job); err != nil {
		t.Fatal(err)
	}
	if got, err := sc.InputFile(ctx, id, capa, "in.csv"); err != nil || string(got) != "x,y\n1,2\n" {
		t.Fatalf("input: %q %v", got, err)
	}
	if _, err := sc.InputFile(ctx, id, "forged", "in.csv"); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("input without the capability: %v", err)
	}
	if _, err := sc.PutFile(ctx, state.FilePut{Job: id, Capability: capa, Name: "more.csv", Namespace: "a"}, []byte("x")); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("an input added after the submission: %v", err)
	}

	out, err := sc.PutFile(ctx, state.FilePut{Job: id, Capability: capa, Attempt: 1, Name: "out/../x"}, []byte("x"))
	if !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("bad output name: %+v %v", out, err)
	}
	if _, err := sc.PutFile(ctx, state.FilePut{Job: id, Capability: capa, Attempt: 2, Name: "a.txt"}, []byte("x")); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("an attempt the job does not have: %v", err)
	}
	if _, err := sc.PutFile(ctx, state.FilePut{Job: id, Capability: capa, Attempt: 1, Name: "big"}, make([]byte, 65)); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("over the per-file limit: %v", err)
	}
	out, err = sc.PutFile(ctx, state.FilePut{Job: id, Capability: capa, Attempt: 1, Name: "sum.csv"}, []byte("total,3\n"))
	if err != nil {
		t.Fatalf("put output: %v", err)
	}
	// The quota (60 bytes) counts the inputs once recorded (8) and this job's puts.
	if _, err := sc.PutFile(ctx, state.FilePut{Job: id, Capability: capa, Attempt: 1, Name: "q.bin"}, make([]byte, 50)); err == nil || !strings.Contains(err.Error(), "quota") {
		t.Fatalf("over the namespace's quota: %v", err)
	}
	if _, err := sc.PutFile(ctx, state.FilePut{Job: id, Capability: capa, Attempt: 1, Name: "b.txt"}, []byte("b")); err != nil {
		t.Fatalf("second file: %v", err)
	}
	if _, err := sc.PutFile(ctx, state.FilePut{Job: id, Capability: capa, Attempt: 1, Name: "c.txt"}, []byte("c")); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("a third file over max_files 2: %v", err)
	}
	res := jobs.Result{Status: jobs.StatusSuccess, Attempt: 1, Files: []jobs.FileInfo{out}}
	if err := qc.PublishEvent(ctx, jobs.Event{Job: id, Kind: jobs.EventFinished, Attempt: 1, Result: &res, Proof: jobs.EventProof(capa, jobs.EventFinished, 1)}); err != nil {
		t.Fatal(err)
	}
	sc.SawEvents(qc.EventsSeq())
	info, data, err := sc.File(ctx, "a", id, "sum.csv")
	if err != nil || string(data) != "total,3\n" || info.Size != 8 || info.SHA256 != out.SHA256 {
		t.Fatalf("get: %+v %q %v", info, data, err)
	}
	for _, c := range []struct{ ns, name string }{{"b", "sum.csv"}, {"", "sum.csv"}, {"a", "b.txt"}, {"a", "in.csv"}} {
		if _, _, err := sc.File(ctx, c.ns, id, c.name); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("get %s as %q: %v, want ErrNotFound", c.name, c.ns, err)
		}
	}
	if _, err := sc.PutFile(ctx, state.FilePut{Job: id, Capability: capa, Attempt: 1, Name: "sum.csv"}, []byte("forged")); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("a put after the job ended: %v", err)
	}
	// Bytes changed in the store behind the service's back are not served.
	obs, err := qc.JetStream().ObjectStore(ctx, jobs.Subjects{}.FilesBucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(ctx, jobs.FileObject(id, 1, "sum.csv"), []byte("total,9\n")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := sc.File(ctx, "a", id, "sum.csv"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("tampered file: %v", err)
	}
	// The bucket is replicated and kept like the events.
	st, err := obs.Status(ctx)
	if err != nil || st.TTL() != queue.DefaultConfig().EventsMaxAge || st.Replicas() != 1 {
		t.Fatalf("bucket status %+v %v", st, err)
	}
	var _ jetstream.ObjectStore = obs
}
