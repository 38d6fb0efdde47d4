package worker_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestWorkerForwardsOnlyToProvenHolders: jobs of two sessions, delivered from
// the pool, meet entries naming another worker ("spy", which says it holds
// every session). The worker forwards only the job whose entry carries its
// proof under the session's capability; the other entry, forged, it does not
// even ask about: it takes that session itself and runs the job.
func TestWorkerForwardsOnlyToProvenHolders(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := jobs.Subjects{}
	spy := testutil.Connect(t, b, "spy")
	var mu sync.Mutex
	var asked []string
	if _, err := spy.Subscribe(s.WorkerSessions("spy"), func(m *nats.Msg) {
		mu.Lock()
		asked = append(asked, string(m.Data))
		mu.Unlock()
		_ = m.Respond([]byte(queue.SessionHeld))
	}); err != nil {
		t.Fatal(err)
	}
	sjs, _ := jetstream.New(spy)
	routed, err := queue.WorkerJobsConsumer(ctx, sjs, q, "spy")
	if err != nil {
		t.Fatal(err)
	}
	// No worker takes pool "later" until the entries are written; a front-end
	// accepts jobs only for a pool some worker serves, so one is announced.
	testutil.AnnouncePool(t, spy, "later")
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "forged", Code: "print('ran')", Session: "s1", Pool: "later"})
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "proven", Code: "print('ran')", Session: "s2", Pool: "later"})
	key, err := queue.ProxyKey(ctx, sjs, s)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := sjs.KeyValue(ctx, s.SessionsBucket())
	if err != nil {
		t.Fatal(err)
	}
	ns := jobs.NamespaceOf("")
	k1, k2 := queue.SessionKey(ns, "s1"), queue.SessionKey(ns, "s2")
	for k, proof := range map[string]string{
		k1: jobs.SessionProof(jobs.SessionCapability(key, k2), k1, "spy"), // another session's
		k2: jobs.SessionProof(jobs.SessionCapability(key, k2), k2, "spy"),
	} {
		data, _ := json.Marshal(queue.SessionEntry{Worker: "spy", Session: k[len(k)-2:], Since: time.Now().UTC(), Proof: proof})
		if _, err := kv.Put(ctx, k, data); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testutil.QuickWorker("w1", q)
	cfg.Pool = "later"
	testutil.Worker(t, b, testutil.ProcessRuntime(t), cfg)

	rec, err := fe.Wait(ctx, "", "forged")
	if err != nil || rec.Status != jobs.StatusSuccess || rec.Worker != "w1" || rec.Result.Stdout != "ran\n" {
		t.Fatalf("the job of the session with a forged entry: %+v %v", rec, err)
	}
	msg, err := routed.Next(jetstream.FetchMaxWait(30 * time.Second))
	if err != nil {
		t.Fatalf("the job of the session with a proven entry was not forwarded: %v", err)
	}
	if m, err := queue.DecodeMessage(msg.Data()); err != nil || m.ID != jobs.ScopedID(ns, "proven") {
		t.Fatalf("forwarded: %+v %v", m, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 || asked[0] != k2 {
		t.Fatalf("the worker asked the spy about %q, want only %q", asked, k2)
	}
}
