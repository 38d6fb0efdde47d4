package natsauth_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/natsauth"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
)

// TestFilesOnlyThroughTheStateService attacks jobs' files from a worker
// identity that holds no job of the tenant: the file store is out of its
// reach (no read, no write, no object store API), it cannot ask for a
// namespace's files, and the state service refuses its puts and input
// reads without the job's capability. A front-end reaches files only
// through the state service too.
func TestFilesOnlyThroughTheStateService(t *testing.T) {
	t.Parallel()
	_, connect := fleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := jobs.Subjects{}

	fe, fr := connect(natsauth.RoleFrontend)
	fjs, _ := jetstream.New(fe)
	key, err := queue.ProxyKey(ctx, fjs, sub)
	if err != nil {
		t.Fatal(err)
	}
	id := jobs.ScopedID("tenant", "secret-job")
	fsc := state.NewClient(fe, sub)
	if _, err := fsc.PutFile(ctx, state.FilePut{Job: id, Capability: jobs.Capability(key, id), Name: "data.csv", Namespace: "tenant"}, []byte("secret,1\n")); err != nil {
		t.Fatalf("a front-end puts an input: %v", err)
	}
	octx, ocancel := context.WithTimeout(ctx, 2*time.Second)
	defer ocancel()
	if obs, err := fjs.ObjectStore(octx, sub.FilesBucket()); err == nil {
		if _, err := obs.GetBytes(octx, jobs.FileObject(id, 0, "data.csv")); err == nil {
			t.Fatal("a front-end read the file store directly")
		}
	}
	_ = fr // a front-end's refusals are not asserted: it may be refused at the API or the stream

	spy, sr := connect(natsauth.RoleWorker)
	sjs, _ := jetstream.New(spy)
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
	defer wcancel()
	if obs, err := sjs.ObjectStore(wctx, sub.FilesBucket()); err == nil {
		if data, err := obs.GetBytes(wctx, jobs.FileObject(id, 0, "data.csv")); err == nil {
			t.Fatalf("a worker read the file store directly: %q", data)
		}
	}
	_ = spy.Publish("$O."+sub.FilesBucket()+".C.x", []byte("forged chunk"))
	sr.wait(t, `Permissions Violation for Publish to "$O.`+sub.FilesBucket()+`.C.x"`)
	_, _ = spy.Request(sub.State(state.OpFileGet), nil, 300*time.Millisecond)
	sr.wait(t, `Permissions Violation for Publish to "`+sub.State(state.OpFileGet)+`"`)

	ssc := state.NewClient(spy, sub)
	ssc.Patience = time.Second
	forged := jobs.Capability([]byte("a key the spy made up, 32 bytes!"), id)
	if got, err := ssc.InputFile(ctx, id, forged, "data.csv"); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("a worker read another job's input: %q %v", got, err)
	}
	if _, err := ssc.PutFile(ctx, state.FilePut{Job: id, Capability: forged, Attempt: 1, Name: "out.csv"}, []byte("forged")); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("a worker put a file of a job it does not hold: %v", err)
	}
	if _, err := ssc.PutFile(ctx, state.FilePut{Job: id, Capability: forged, Name: "data.csv", Namespace: "tenant"}, []byte("replaced")); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("a worker replaced another job's input: %v", err)
	}
}
