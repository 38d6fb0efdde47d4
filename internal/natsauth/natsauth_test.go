package natsauth_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/natsauth"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// fleet starts a broker serving the configuration Init wrote, and returns a
// function that connects as a role, recording the server's refusals.
func fleet(t *testing.T) (*broker.Broker, func(role string) (*nats.Conn, *refusals)) {
	t.Helper()
	_, b, connect := fleetIn(t)
	return b, connect
}

// fleetIn is fleet with more identities (`broker auth add`) than the four of
// Init, returning the credentials directory too. connect takes an identity's
// name, such as "worker-spy".
func fleetIn(t *testing.T, extra ...natsauth.Identity) (string, *broker.Broker, func(identity string) (*nats.Conn, *refusals)) {
	t.Helper()
	dir := t.TempDir()
	if _, err := natsauth.Init(dir, jobs.Subjects{}, false); err != nil {
		t.Fatal(err)
	}
	for _, id := range extra {
		if _, err := natsauth.Add(dir, id, jobs.Subjects{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := natsauth.Init(dir, jobs.Subjects{}, false); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("a second init over existing credentials: %v", err)
	}
	seed, _ := natsauth.BrokerSeed(dir + "/" + natsauth.ConfigName)
	bopt, err := nats.NkeyOptionFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	b, err := broker.Start(context.Background(), broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:-1", Queue: queue.DefaultConfig(),
		Security: broker.Security{ConfigFile: dir + "/" + natsauth.ConfigName}, ClientOptions: []nats.Option{bopt}, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return dir, b, func(role string) (*nats.Conn, *refusals) {
		t.Helper()
		r := &refusals{}
		o, err := natsauth.ClientOptions(natsauth.SeedFile(dir, role))
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(b.ClientURL(), append(o, nats.Name(role), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { r.add(err) }))...)
		if err != nil {
			t.Fatalf("connect as %s: %v", role, err)
		}
		t.Cleanup(nc.Close)
		return nc, r
	}
}

// refusals collects a connection's asynchronous errors.
type refusals struct {
	mu   sync.Mutex
	errs []string
}

func (r *refusals) add(err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err.Error())
	r.mu.Unlock()
}

// wait returns once an error containing want arrived, or fails.
func (r *refusals) wait(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		for _, e := range r.errs {
			if strings.Contains(e, want) {
				r.mu.Unlock()
				return
			}
		}
		r.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no refusal containing %q; got %v", want, r.errs)
}

// TestRolesAreRefused proves each refusal with a real nats-server.
func TestRolesAreRefused(t *testing.T) {
	t.Parallel()
	b, connect := fleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if nc, err := nats.Connect(b.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("an unauthenticated client connected")
	}

	worker, wr := connect(natsauth.RoleWorker)
	// A worker reads no memory and no job records...
	_, _ = worker.Request(jobs.Subjects{}.State(state.OpMemoryGet), []byte(`{"namespace":"a","key":"k"}`), 300*time.Millisecond)
	wr.wait(t, `Permissions Violation for Publish to "mcpexec.state.memory.get"`)
	// ...follows no events...
	if _, err := worker.Subscribe(jobs.Subjects{}.AllEvents(), func(*nats.Msg) {}); err == nil {
		wr.wait(t, `Permissions Violation for Subscription to "mcpexec.events.>"`)
	}
	// ...reads no secret...
	wjs, _ := jetstream.New(worker)
	kctx, kcancel := context.WithTimeout(ctx, time.Second)
	defer kcancel()
	if _, err := queue.ProxyKey(kctx, wjs, jobs.Subjects{}); err == nil {
		t.Fatal("a worker read the proxy key")
	}
	// ...records no submission or cancellation, and administers no stream.
	_ = worker.Publish(jobs.Subjects{}.Event("x", jobs.EventSubmitted), []byte(`{}`))
	wr.wait(t, "Permissions Violation for Publish")
	// Nor does it speak for a broker whose jobs stream stalled (the brokers
	// replace a stream together when each says so).
	_ = worker.Publish(jobs.Subjects{}.BrokerStalled(), []byte(`{"node":"x","group":"g","replacing":true}`))
	wr.wait(t, `Permissions Violation for Publish to "`+jobs.Subjects{}.BrokerStalled()+`"`)
	sctx, scancel := context.WithTimeout(ctx, time.Second)
	defer scancel()
	if err := wjs.DeleteStream(sctx, jobs.Subjects{}.EventsStream()); err == nil {
		t.Fatal("a worker deleted the events stream")
	}

	fe, fr := connect(natsauth.RoleFrontend)
	// A front-end writes memory only through the state service (which checks
	// quota and CAS), never into the memory stream, and asks for no backup.
	_ = fe.Publish(jobs.Subjects{}.Memory("a", "k"), []byte(`{}`))
	fr.wait(t, `Permissions Violation for Publish to "`+jobs.Subjects{}.Memory("a", "k")+`"`)
	_ = fe.Publish(jobs.Subjects{}.AdminBackup("any"), []byte(`{"path":"/tmp/x"}`))
	fr.wait(t, `Permissions Violation for Publish to "mcpexec.admin.backup.any"`)
	_ = fe.Publish(jobs.Subjects{}.BrokerStalled(), []byte(`{"node":"x","group":"g","replacing":true}`))
	fr.wait(t, `Permissions Violation for Publish to "`+jobs.Subjects{}.BrokerStalled()+`"`)
	fjs, _ := jetstream.New(fe)
	dctx, dcancel := context.WithTimeout(ctx, time.Second)
	defer dcancel()
	if err := fjs.DeleteStream(dctx, jobs.Subjects{}.JobsStream()); err == nil {
		t.Fatal("a front-end deleted the jobs stream")
	} else {
		t.Logf("front-end deleting the jobs stream: %v", err)
	}
	ictx, icancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer icancel()
	if _, err := fjs.Stream(ictx, jobs.Subjects{}.JobsStream()); err != nil {
		t.Fatalf("the jobs stream: %v", err)
	}
}

// TestFleetWorksUnderItsRoles: a job that calls a proxied server, memory and a
// session, run by a worker and a front-end connected with their own identities.
func TestFleetWorksUnderItsRoles(t *testing.T) {
	t.Parallel()
	_, connect := fleet(t)
	rt := testutil.ProcessRuntime(t)
	wnc, wr := connect(natsauth.RoleWorker)
	testutil.WorkerOn(t, wnc, rt, worker.DefaultConfig("w1"))
	fnc, fr := connect(natsauth.RoleFrontend)
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	fe := testutil.FrontendOnWith(t, fnc, frontend.Config{ID: "fe1", Tools: pool, Policy: frontend.DefaultPolicy()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := fe.Health(ctx); err != nil {
		t.Fatalf("health: %v", err)
	}
	code := "r = await mcp_ts.echo(text='hi')\nn = update_memory('n', lambda v: (v or 0) + 1)\nprint(r, n)"
	for i, session := range []string{"", "s1", "s1"} {
		rec, err := fe.Run(ctx, &jobs.Job{Code: code, Servers: []string{"ts"}, Session: session, Namespace: "a"}, nil)
		if err != nil || rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "hi "+string(rune('1'+i))+"\n" {
			t.Fatalf("job %d: %v %+v (worker refusals %v, front-end refusals %v)", i, err, rec, wr.errs, fr.errs)
		}
	}
	out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "c", Code: "import time\ntime.sleep(30)", Timeout: 60}}, "a")
	if out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	if err := fe.Cancel(ctx, "a", "c", "test"); err != nil {
		t.Fatal(err)
	}
	if rec, err := fe.Wait(ctx, "a", "c"); err != nil || rec.Status != jobs.StatusCancelled {
		t.Fatalf("cancelled job: %+v %v", rec, err)
	}
	if len(wr.errs) > 0 || len(fr.errs) > 0 {
		t.Fatalf("refusals on the way: worker %v, front-end %v", wr.errs, fr.errs)
	}
}

// TestParkedCallUnderRoles: a call parked for approval longer than its
// job's whole time limit, in a fleet under its roles. The front-end's
// "waiting" notices and the answer after them all reach the worker (a
// responder may send three messages to one request), the job's clock stood
// still meanwhile, and no permission was refused on the way.
func TestParkedCallUnderRoles(t *testing.T) {
	t.Parallel()
	_, connect := fleet(t)
	wnc, wr := connect(natsauth.RoleWorker)
	testutil.WorkerOn(t, wnc, testutil.ProcessRuntime(t), worker.DefaultConfig("w1"))
	fnc, fr := connect(natsauth.RoleFrontend)
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	fe := testutil.FrontendOnWith(t, fnc, frontend.Config{ID: "fe1", Tools: pool, Policy: frontend.DefaultPolicy(),
		Policies: map[string]frontend.Policy{"a": {Tools: map[string]string{"ts/add": "ask"}}}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "asks", Code: "r = await mcp_ts.add(a=2, b=3)\nprint(r['sum'])", Servers: []string{"ts"}, Timeout: 2}}, "a")
	if out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	var id string
	for id == "" {
		list, err := fe.Approvals(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		if len(list) > 0 {
			id = list[0].ID
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(4 * time.Second) // twice the job's limit
	if _, err := fe.DecideApproval(ctx, "a", id, "approve", "test", ""); err != nil {
		t.Fatal(err)
	}
	rec, err := fe.Wait(ctx, "a", "asks")
	if err != nil || rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "5\n" {
		t.Fatalf("job: %v %+v (worker refusals %v, front-end refusals %v)", err, rec, wr.errs, fr.errs)
	}
	if len(wr.errs) > 0 || len(fr.errs) > 0 {
		t.Fatalf("refusals on the way: worker %v, front-end %v", wr.errs, fr.errs)
	}
}

// TestSpyHearsOnlyItsOwnAnswers attacks from a worker host's credential: a
// spy holding only its own worker identity subscribes to every subject its
// role may while another worker runs a tenant's job (a proxied call, a memory
// write, the front-end reading the proxy key, state replies). The fleet's
// inboxes are refused to it, it cannot answer into another identity's inbox,
// and nothing of the job (code, memory value, tool answer, proxy key or
// capability) reaches it.
func TestSpyHearsOnlyItsOwnAnswers(t *testing.T) {
	t.Parallel()
	dir, _, connect := fleetIn(t, natsauth.Identity{Role: natsauth.RoleWorker, Name: "spy"})
	spy, sr := connect("worker-spy")
	var mu sync.Mutex
	var heard [][]byte
	record := func(m *nats.Msg) {
		mu.Lock()
		heard = append(heard, append([]byte(m.Subject+" "+m.Reply+" "), m.Data...))
		mu.Unlock()
	}
	if _, err := spy.Subscribe("_INBOX.>", record); err == nil {
		sr.wait(t, `Permissions Violation for Subscription to "_INBOX.>"`)
	}
	pub := publicKey(t, natsauth.SeedFile(dir, "worker-spy"))
	perms, err := natsauth.For(natsauth.Identity{Role: natsauth.RoleWorker, Name: "spy"}, pub, jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range perms.Subscribe {
		if _, err := spy.Subscribe(subj, record); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := spy.Subscribe("_INBOX."+publicKey(t, natsauth.SeedFile(dir, natsauth.RoleFrontend))+".>", record); err == nil {
		sr.wait(t, `Permissions Violation for Subscription to "_INBOX.U`)
	}

	rt := testutil.ProcessRuntime(t)
	wnc, wr := connect(natsauth.RoleWorker)
	testutil.WorkerOn(t, wnc, rt, worker.DefaultConfig("w1"))
	fnc, fr := connect(natsauth.RoleFrontend)
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	fe := testutil.FrontendOnWith(t, fnc, frontend.Config{ID: "fe1", Tools: pool, Policy: frontend.DefaultPolicy()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := fe.Health(ctx); err != nil {
		t.Fatalf("health: %v", err)
	}
	code := "update_memory('api_key', lambda v: 'SECRET-' + '4242')\nr = await mcp_ts.echo(text='TOOL-' + '5151')\nprint(r)"
	rec, err := fe.Run(ctx, &jobs.Job{Code: code, Servers: []string{"ts"}, Namespace: "victim"}, nil)
	if err != nil || rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "TOOL-5151\n" {
		t.Fatalf("job: %v %+v (worker refusals %v, front-end refusals %v)", err, rec, wr.errs, fr.errs)
	}
	bnc, _ := connect(natsauth.RoleBroker)
	bjs, _ := jetstream.New(bnc)
	key, err := queue.ProxyKey(ctx, bjs, jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	// An answer into the front-end's inbox is refused too.
	_ = spy.Publish("_INBOX."+publicKey(t, natsauth.SeedFile(dir, natsauth.RoleFrontend))+".x", []byte("forged"))
	sr.wait(t, `Permissions Violation for Publish to "_INBOX.U`)
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for _, m := range heard {
		for _, secret := range [][]byte{[]byte("SECRET-4242"), []byte("TOOL-5151"), []byte("update_memory"), key, []byte(jobs.Capability(key, jobs.ScopedID("victim", rec.Job.ID)))} {
			if bytes.Contains(m, secret) {
				t.Fatalf("the spy heard %q", m)
			}
		}
	}
	t.Logf("the spy heard %d messages, none of the job's", len(heard))
}

// TestRevokedIdentityIsRefused: `broker auth add` mints a worker identity the
// broker takes on reload; `broker auth remove` revokes it, and after a reload
// its open connection is closed and a new one refused.
func TestRevokedIdentityIsRefused(t *testing.T) {
	t.Parallel()
	dir, b, connect := fleetIn(t)
	id := natsauth.Identity{Role: natsauth.RoleWorker, Name: "host2"}
	seed, err := natsauth.Add(dir, id, jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := natsauth.Add(dir, id, jobs.Subjects{}); err == nil {
		t.Fatal("an identity was minted twice")
	}
	if _, err := natsauth.Add(dir, natsauth.Identity{Role: natsauth.RoleWorker, Name: "../x"}, jobs.Subjects{}); err == nil {
		t.Fatal("a name with a path was taken")
	}
	if err := b.Reload(); err != nil {
		t.Fatal(err)
	}
	nc, _ := connect(strings.TrimSuffix(filepath.Base(seed), ".nk"))
	if err := natsauth.Remove(dir, id, jobs.Subjects{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Reload(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for nc.IsConnected() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if nc.IsConnected() {
		t.Fatal("a revoked identity stayed connected after the reload")
	}
	o, err := nats.NkeyOptionFromSeed(natsauth.SeedFile(dir, natsauth.RoleWorker))
	if err != nil {
		t.Fatal(err)
	}
	// The other identities stay.
	still, err := nats.Connect(b.ClientURL(), o)
	if err != nil {
		t.Fatalf("the worker identity after the reload: %v", err)
	}
	still.Close()
}

func publicKey(t *testing.T, seedFile string) string {
	t.Helper()
	data, err := os.ReadFile(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.FromSeed(bytes.TrimSpace(data))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// TestInitRouteSecret: Init writes a private, random route secret that
// RouteSecret reads beside the configuration, and a second Init without
// --force refuses to replace it alone too.
func TestInitRouteSecret(t *testing.T) {
	t.Parallel()
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		if _, err := natsauth.Init(d, jobs.Subjects{}, false); err != nil {
			t.Fatal(err)
		}
	}
	conf := filepath.Join(dir, natsauth.ConfigName)
	st, err := os.Stat(natsauth.RouteSecretFile(conf))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("route secret file: %v %v", st, err)
	}
	secret, ok, err := natsauth.RouteSecret(conf)
	if err != nil || !ok {
		t.Fatalf("RouteSecret: %v %v", ok, err)
	}
	if raw, err := base64.RawURLEncoding.DecodeString(secret); err != nil || len(raw) != 32 {
		t.Fatalf("secret %q: %d bytes, %v; want 32 random bytes in base64url", secret, len(raw), err)
	}
	if s2, _, _ := natsauth.RouteSecret(filepath.Join(other, natsauth.ConfigName)); s2 == secret {
		t.Fatal("two inits wrote the same route secret")
	}
	if strings.Contains(mustRead(t, conf), secret) {
		t.Fatal("nats.conf holds the route secret")
	}

	// Only the route secret left: Init still refuses without --force.
	for _, f := range []string{conf, natsauth.SeedFile(dir, natsauth.RoleBroker), natsauth.SeedFile(dir, natsauth.RoleFrontend),
		natsauth.SeedFile(dir, natsauth.RoleWorker), natsauth.SeedFile(dir, natsauth.RoleAdmin)} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := natsauth.Init(dir, jobs.Subjects{}, false); err == nil || !strings.Contains(err.Error(), natsauth.RouteSecretName) {
		t.Fatalf("init over a route secret: %v", err)
	}
	if _, err := natsauth.Init(dir, jobs.Subjects{}, true); err != nil {
		t.Fatal(err)
	}
	if s2, _, _ := natsauth.RouteSecret(conf); s2 == secret {
		t.Fatal("--force kept the route secret")
	}

	// No file: no secret; an empty one: an error.
	if _, ok, err := natsauth.RouteSecret(filepath.Join(t.TempDir(), natsauth.ConfigName)); ok || err != nil {
		t.Fatalf("no route secret file: %v %v", ok, err)
	}
	if err := os.WriteFile(natsauth.RouteSecretFile(conf), []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := natsauth.RouteSecret(conf); err == nil {
		t.Fatal("an empty route secret was accepted")
	}
}

func mustRead(t *testing.T, f string) string {
	t.Helper()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestForgedJobNeverRuns attacks from a worker host's credential: a spy
// holding its own worker identity publishes job messages onto another
// worker's routed-job subject (the one subject of jobs its role may publish
// on, to forward a session's job), claiming another tenant's namespace and
// session: unsigned, and signed with a key of its own. The worker drops
// both without running them; a genuine job with the same code, submitted by
// a front-end, runs (so the test can see a run).
func TestForgedJobNeverRuns(t *testing.T) {
	t.Parallel()
	_, _, connect := fleetIn(t, natsauth.Identity{Role: natsauth.RoleWorker, Name: "spy"})
	rt := testutil.ProcessRuntime(t)
	wnc, _ := connect(natsauth.RoleWorker)
	testutil.WorkerOn(t, wnc, rt, worker.DefaultConfig("w1"))
	fnc, _ := connect(natsauth.RoleFrontend)
	fe := testutil.FrontendOnWith(t, fnc, frontend.Config{ID: "fe1", Policy: frontend.DefaultPolicy()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := fe.Health(ctx); err != nil {
		t.Fatalf("health: %v", err)
	}
	// The process runtime runs code as another user: the marker's folder is
	// open to it.
	mdir, err := os.MkdirTemp("", "forged")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(mdir) })
	if err := os.Chmod(mdir, 0o777); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(mdir, "ran")
	code := "open(" + strconv.Quote(marker) + ", 'a').write('x')\nprint(secret)"
	// The victim's live session on w1, as the attack wants it.
	if rec, err := fe.Run(ctx, &jobs.Job{Code: "secret = 'db-password'", Namespace: "victim", Session: "s1"}, nil); err != nil || rec.Status != jobs.StatusSuccess {
		t.Fatalf("warm-up job: %v %+v", err, rec)
	}

	spy, _ := connect("worker-spy")
	sjs, err := jetstream.New(spy)
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, _ := ed25519.GenerateKey(nil)
	for i, sign := range []func(*nats.Msg){
		func(*nats.Msg) {},
		func(m *nats.Msg) { m.Header.Set(jobs.SignatureHeader, jobs.SignJob(otherKey, m.Data)) },
		func(m *nats.Msg) { m.Header.Set(jobs.SignatureHeader, "not base64 at all") },
	} {
		job := jobs.Job{ID: jobs.NewID(), Code: code, Namespace: "victim", Session: "s1", Timeout: 10, MaxAttempts: 1}
		data, err := queue.EncodeMessage(&job, "forged-capability")
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(jobs.Subjects{}.WorkerJobs("w1"))
		m.Data = data
		sign(m)
		if _, err := sjs.PublishMsg(ctx, m); err != nil {
			t.Fatalf("forged job %d: the stream refused it (%v), so the test proves nothing", i, err)
		}
	}
	// The routed-job consumer hands them to w1 at once; give it time to run
	// them if it would.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("a forged job ran")
		}
		time.Sleep(50 * time.Millisecond)
	}
	rec, err := fe.Run(ctx, &jobs.Job{Code: code, Namespace: "victim", Session: "s1"}, nil)
	if err != nil || rec.Status != jobs.StatusSuccess {
		t.Fatalf("genuine job: %v %+v %+v", err, rec, rec.Result)
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "x" {
		t.Fatalf("marker after the genuine job: %q %v (a forged one ran too, or none did)", b, err)
	}
}

// TestWorkerLearnsOnlyItsJobsHistory attacks from a worker host's credential:
// a spy worker identity tries to read another tenant's job outcome. The
// direct gets of the events stream are refused to it (by the job's id, and
// with a literal '*', which would return the latest event of any job), and
// the state service's job.history answers nothing of the job without that
// job's capability. The real worker still learns what it needs of the jobs it
// holds: a job cancelled while queued is not run.
func TestWorkerLearnsOnlyItsJobsHistory(t *testing.T) {
	t.Parallel()
	_, _, connect := fleetIn(t, natsauth.Identity{Role: natsauth.RoleWorker, Name: "spy"})
	s := jobs.Subjects{}
	wnc, wr := connect(natsauth.RoleWorker)
	testutil.WorkerOn(t, wnc, testutil.NewFakeRuntime(4), worker.DefaultConfig("w1"))
	fnc, fr := connect(natsauth.RoleFrontend)
	fe := testutil.FrontendOnWith(t, fnc, frontend.Config{ID: "fe1", Policy: frontend.DefaultPolicy()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec, err := fe.Run(ctx, &jobs.Job{Code: "SECRET-4242", Namespace: "victim"}, nil)
	if err != nil || rec.Status != jobs.StatusSuccess {
		t.Fatalf("job: %v %+v (worker refusals %v, front-end refusals %v)", err, rec, wr.errs, fr.errs)
	}
	id := jobs.ScopedID("victim", rec.Job.ID)

	spy, sr := connect("worker-spy")
	for _, q := range []struct{ subj, body string }{
		{s.DirectGet(s.EventsStream(), s.Event(id, jobs.EventFinished)), ""},
		{s.DirectGet(s.EventsStream(), s.Event("*", jobs.EventFinished)), ""},
		{s.DirectGet(s.EventsStream(), s.Event("*", jobs.EventStarted)), ""},
		{s.DirectGet(s.EventsStream(), s.Event("*", jobs.EventCancelled)), ""},
		{"$JS.API.DIRECT.GET." + s.EventsStream(), `{"last_by_subj":"` + s.Event(id, jobs.EventFinished) + `"}`},
		{"$JS.API.STREAM.MSG.GET." + s.EventsStream(), `{"last_by_subj":"` + s.Event(id, jobs.EventFinished) + `"}`},
		{s.State(state.OpJobGet), `{"id":"` + id + `"}`},
	} {
		if m, err := spy.Request(q.subj, []byte(q.body), 300*time.Millisecond); err == nil {
			t.Fatalf("the spy read %s: %q %v", q.subj, m.Data, m.Header)
		}
		sr.wait(t, `Permissions Violation for Publish to "`+q.subj+`"`)
	}

	bnc, _ := connect(natsauth.RoleBroker)
	bjs, _ := jetstream.New(bnc)
	key, err := queue.ProxyKey(ctx, bjs, s)
	if err != nil {
		t.Fatal(err)
	}
	other := bytes.Repeat([]byte{7}, jobs.CapabilityKeySize)
	st := state.NewClient(spy, s)
	for name, capability := range map[string]string{
		"none":                  "",
		"under another key":     jobs.Capability(other, id),
		"of another job":        jobs.Capability(key, id+"x"), // one the spy may hold
		"the event proof":       jobs.EventProof(jobs.Capability(key, id), jobs.EventFinished, 1),
		"the capability of '*'": jobs.Capability(key, "*"),
	} {
		h, err := st.JobHistory(ctx, id, capability)
		if !errors.Is(err, state.ErrInvalid) || h != (queue.History{}) {
			t.Fatalf("job.history with a capability %s: %+v %v", name, h, err)
		}
		if name == "none" {
			t.Logf("job.history without the capability: %v", err)
		}
		data, _ := json.Marshal(state.JobHistoryRequest{ID: id, Capability: capability})
		m, err := spy.Request(s.State(state.OpJobHistory), data, 5*time.Second)
		if err != nil || len(m.Data) != 0 || m.Header.Get("Nats-Service-Error-Code") != state.CodeBadRequest {
			t.Fatalf("raw job.history with a capability %s: %v %q %v", name, err, m.Data, m.Header)
		}
	}
	// The capability of '*' is refused for the id alone.
	if h, err := st.JobHistory(ctx, "*", jobs.Capability(key, "*")); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("job.history of '*': %+v %v", h, err)
	}
	// With the job's own capability (what the worker that holds it has), it
	// answers.
	if h, err := st.JobHistory(ctx, id, jobs.Capability(key, id)); err != nil || !h.Finished || h.Cancelled || h.LastAttempt != 1 {
		t.Fatalf("job.history with the job's capability: %+v %v", h, err)
	}

	// A job cancelled while queued, then delivered: its worker asks
	// job.history, sees the cancellation, and never runs it. (The pool is
	// announced as served, so the front-end takes the job; its worker starts
	// after the cancellation.)
	testutil.AnnouncePool(t, bnc, "later")
	out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "q", Code: "never", Pool: "later"}}, "victim")
	if out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	if err := fe.Cancel(ctx, "victim", "q", "test"); err != nil {
		t.Fatal(err)
	}
	w2nc, w2r := connect(natsauth.RoleWorker)
	rt2 := testutil.NewFakeRuntime(1)
	cfg := worker.DefaultConfig("w2")
	cfg.Pool = "later"
	testutil.WorkerOn(t, w2nc, rt2, cfg)
	cons, err := bjs.Consumer(ctx, s.JobsStream(), s.Consumer("later"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		ci, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumPending == 0 && ci.NumAckPending == 0 && ci.AckFloor.Stream > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the cancelled job was never settled: %+v", ci)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rt2.Runs() != 0 {
		t.Fatal("a job cancelled while queued ran")
	}
	if rec, err := fe.Get(ctx, "victim", "q"); err != nil || rec.Status != jobs.StatusCancelled {
		t.Fatalf("cancelled job: %+v %v", rec, err)
	}
	if len(wr.errs) > 0 || len(w2r.errs) > 0 || len(fr.errs) > 0 {
		t.Fatalf("refusals on the way: workers %v %v, front-end %v", wr.errs, w2r.errs, fr.errs)
	}
}

// TestFrontendFollowsEvents: under its role, a front-end follows the events
// stream (/api/events, the console's live list) and sees a job end.
func TestFrontendFollowsEvents(t *testing.T) {
	t.Parallel()
	_, connect := fleet(t)
	wnc, wr := connect(natsauth.RoleWorker)
	testutil.WorkerOn(t, wnc, testutil.NewFakeRuntime(4), worker.DefaultConfig("w1"))
	fnc, fr := connect(natsauth.RoleFrontend)
	fe := testutil.FrontendOnWith(t, fnc, frontend.Config{ID: "fe1", Policy: frontend.DefaultPolicy()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec, err := fe.Run(ctx, &jobs.Job{ID: "j1", Code: "hi", Namespace: "a"}, nil)
	if err != nil || rec.Status != jobs.StatusSuccess {
		t.Fatalf("job: %v %+v", err, rec)
	}
	var seen []jobs.EventKind
	done := errors.New("done")
	err = fe.Follow(ctx, "a", 0, true, func(ev frontend.JobEvent) error {
		if ev.Job != "j1" {
			return nil
		}
		seen = append(seen, ev.Kind)
		if ev.Kind == jobs.EventFinished {
			if ev.Status != jobs.StatusSuccess {
				return fmt.Errorf("finished event %+v", ev)
			}
			return done
		}
		return nil
	})
	if !errors.Is(err, done) {
		t.Fatalf("follow: %v (saw %v; front-end refusals %v)", err, seen, fr.errs)
	}
	if want := []jobs.EventKind{jobs.EventSubmitted, jobs.EventStarted, jobs.EventFinished}; !slices.Equal(seen, want) {
		t.Fatalf("events of j1: %v, want %v", seen, want)
	}
	if len(wr.errs) > 0 || len(fr.errs) > 0 {
		t.Fatalf("refusals on the way: worker %v, front-end %v", wr.errs, fr.errs)
	}
}

// TestForgedEventsReachNoTenant attacks from a worker host's credential,
// which may publish any job's started and finished subjects: it forges the
// success of tenant a's job, queued in a pool no worker takes jobs from, without the
// job's capability (no proof, a proof under another key, another job's
// genuine event on this job's subject, a cancellation on the finished
// subject). The tenant's event stream (Follow: /api/events, the console's
// live list) shows none of it, the namespace's admission slot stays taken,
// and the record is not ended. The genuine finish of the worker holding the
// job is still followed, and frees the slot.
func TestForgedEventsReachNoTenant(t *testing.T) {
	t.Parallel()
	_, connect := fleet(t)
	s := jobs.Subjects{}
	fnc, fr := connect(natsauth.RoleFrontend)
	fe := testutil.FrontendOnWith(t, fnc, frontend.Config{ID: "fe1", Policy: frontend.DefaultPolicy(),
		Policies: map[string]frontend.Policy{"a": {MaxActive: 1}}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	anc, _ := connect(natsauth.RoleBroker)
	testutil.AnnouncePool(t, anc, "nowhere") // served as far as the front-end knows; nothing takes its jobs
	if out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "q1", Code: "x", Pool: "nowhere"}}, "a"); out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	id := jobs.ScopedID("a", "q1")

	followed := make(chan frontend.JobEvent, 16)
	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	go func() {
		_ = fe.Follow(fctx, "a", 0, true, func(ev frontend.JobEvent) error {
			followed <- ev
			return nil
		})
	}()
	next := func() frontend.JobEvent {
		t.Helper()
		select {
		case ev := <-followed:
			return ev
		case <-ctx.Done():
			t.Fatalf("no event followed (front-end refusals %v)", fr.errs)
		}
		return frontend.JobEvent{}
	}
	if ev := next(); ev.Job != "q1" || ev.Kind != jobs.EventSubmitted {
		t.Fatalf("first event: %+v", ev)
	}

	bnc, _ := connect(natsauth.RoleBroker)
	bjs, _ := jetstream.New(bnc)
	key, err := queue.ProxyKey(ctx, bjs, s)
	if err != nil {
		t.Fatal(err)
	}
	wnc, wr := connect(natsauth.RoleWorker)
	wjs, _ := jetstream.New(wnc)
	publish := func(subject string, ev jobs.Event) {
		t.Helper()
		ev.At = time.Now().UTC()
		data, _ := json.Marshal(ev)
		if _, err := wjs.Publish(ctx, subject, data); err != nil {
			t.Fatalf("publish %s: %v", subject, err)
		}
	}
	success := &jobs.Result{Status: jobs.StatusSuccess, Stdout: "forged", Attempt: 1}
	other := bytes.Repeat([]byte{7}, jobs.CapabilityKeySize)
	finished := s.Event(id, jobs.EventFinished)
	mine := jobs.ScopedID("a", "mine") // a job the forger holds
	for _, ev := range []jobs.Event{
		{Job: id, Kind: jobs.EventFinished, Attempt: 1, Worker: "forger", Result: success},
		{Job: id, Kind: jobs.EventFinished, Attempt: 1, Worker: "forger", Result: success,
			Proof: jobs.EventProof(jobs.Capability(other, id), jobs.EventFinished, 1)},
		{Job: mine, Kind: jobs.EventFinished, Attempt: 1, Worker: "forger", Result: success,
			Proof: jobs.EventProof(jobs.Capability(key, mine), jobs.EventFinished, 1)},
		{Job: id, Kind: jobs.EventCancelled, Reason: "forged"},
	} {
		publish(finished, ev)
	}
	// The worker holding the job starts it: the tenant sees that, and
	// nothing before it.
	publish(s.Event(id, jobs.EventStarted), jobs.Event{Job: id, Kind: jobs.EventStarted, Attempt: 1, Worker: "w1",
		Proof: jobs.EventProof(jobs.Capability(key, id), jobs.EventStarted, 1)})
	if ev := next(); ev.Job != "q1" || ev.Kind != jobs.EventStarted {
		t.Fatalf("the tenant followed a forged event: %+v", ev)
	}
	time.Sleep(200 * time.Millisecond) // the admission's subscription had them too
	if out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "q2", Code: "x", Pool: "nowhere"}}, "a"); !errors.Is(out[0].Err, frontend.ErrOverCap) {
		t.Fatalf("a forged finish freed the namespace's slot: %+v", out[0])
	}
	if rec, err := fe.Get(ctx, "a", "q1"); err != nil || rec.Status.Terminal() {
		t.Fatalf("record after the forgeries: %+v %v", rec, err)
	}

	// The genuine finish is followed, and frees the slot.
	publish(finished, jobs.Event{Job: id, Kind: jobs.EventFinished, Attempt: 1, Worker: "w1",
		Result: &jobs.Result{Status: jobs.StatusSuccess, Stdout: "real", Attempt: 1},
		Proof:  jobs.EventProof(jobs.Capability(key, id), jobs.EventFinished, 1)})
	if ev := next(); ev.Job != "q1" || ev.Kind != jobs.EventFinished || ev.Status != jobs.StatusSuccess {
		t.Fatalf("the genuine finish: %+v", ev)
	}
	for i := 0; ; i++ {
		out := fe.SubmitMany(ctx, []*jobs.Job{{ID: fmt.Sprintf("r%d", i), Code: "x", Pool: "nowhere"}}, "a")
		if out[0].Err == nil {
			break
		}
		if !errors.Is(out[0].Err, frontend.ErrOverCap) || ctx.Err() != nil {
			t.Fatalf("after the genuine finish: %v", out[0].Err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rec, err := fe.Get(ctx, "a", "q1"); err != nil || rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "real" {
		t.Fatalf("record after the genuine finish: %+v %v", rec, err)
	}

	// A caller waiting in Run (run_python) gets the genuine outcome, not the
	// forged one that came first.
	type ran struct {
		rec *jobs.Record
		err error
	}
	done := make(chan ran, 1)
	go func() {
		rec, err := fe.Run(ctx, &jobs.Job{ID: "r", Code: "x", Pool: "nowhere", Namespace: "b"}, nil)
		done <- ran{rec, err}
	}()
	for {
		if _, err := fe.Get(ctx, "b", "r"); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	rid := jobs.ScopedID("b", "r")
	publish(s.Event(rid, jobs.EventFinished), jobs.Event{Job: rid, Kind: jobs.EventFinished, Attempt: 1, Worker: "forger", Result: success})
	time.Sleep(200 * time.Millisecond)
	publish(s.Event(rid, jobs.EventFinished), jobs.Event{Job: rid, Kind: jobs.EventFinished, Attempt: 1, Worker: "w1",
		Result: &jobs.Result{Status: jobs.StatusSuccess, Stdout: "real", Attempt: 1},
		Proof:  jobs.EventProof(jobs.Capability(key, rid), jobs.EventFinished, 1)})
	if r := <-done; r.err != nil || r.rec.Result == nil || r.rec.Result.Stdout != "real" {
		t.Fatalf("Run answered %+v %v", r.rec, r.err)
	}
	if len(wr.errs) > 0 || len(fr.errs) > 0 {
		t.Fatalf("refusals on the way: worker %v, front-end %v", wr.errs, fr.errs)
	}
}

// TestForgedHistoryStopsNoJob: a worker host forges, for another tenant's
// queued job, an outcome (which would make the job's worker skip it as
// already done) and a start of attempt 99 (which would make it end the job as
// worker_lost). job.history counts neither without the job's proof, and the
// job runs as if nothing had been forged.
func TestForgedHistoryStopsNoJob(t *testing.T) {
	t.Parallel()
	_, connect := fleet(t)
	s := jobs.Subjects{}
	fnc, fr := connect(natsauth.RoleFrontend)
	fe := testutil.FrontendOnWith(t, fnc, frontend.Config{ID: "fe1", Policy: frontend.DefaultPolicy()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	anc, _ := connect(natsauth.RoleBroker)
	testutil.AnnouncePool(t, anc, "later") // its worker starts after the forgeries
	if out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "v", Code: "real", Pool: "later"}}, "victim"); out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	id := jobs.ScopedID("victim", "v")
	forger, _ := connect(natsauth.RoleWorker)
	fjs, _ := jetstream.New(forger)
	for _, ev := range []jobs.Event{
		{Job: id, Kind: jobs.EventStarted, Attempt: 99, Worker: "forger"},
		{Job: id, Kind: jobs.EventFinished, Attempt: 99, Worker: "forger", Result: &jobs.Result{Status: jobs.StatusSuccess, Stdout: "forged"}},
	} {
		data, _ := json.Marshal(ev)
		if _, err := fjs.Publish(ctx, s.Event(id, ev.Kind), data); err != nil {
			t.Fatal(err)
		}
	}
	wnc, wr := connect(natsauth.RoleWorker)
	cfg := worker.DefaultConfig("w1")
	cfg.Pool = "later"
	testutil.WorkerOn(t, wnc, testutil.NewFakeRuntime(1), cfg)
	rec, err := fe.Wait(ctx, "victim", "v")
	if err != nil || rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "real" || rec.Attempt != 1 {
		t.Fatalf("the victim's job after forged history: %+v %v (refusals %v %v)", rec, err, wr.errs, fr.errs)
	}
}

// TestForgedOutputReachesNoTenant attacks from a worker host's credential,
// which may publish any job's output subject: while another tenant's job
// runs (printing as it sleeps), a spy worker identity publishes chunks on
// that job's output subject without the job's capability (no proof, a proof
// under another key, a proof of another job, a genuine-looking proof over
// other data), and frames that are no chunk at all (not JSON, another
// stream, a negative sequence number, data over queue.MaxOutputData, none).
// The tenant's live output (WatchOutput, what run_python's progress and the
// console show) holds none of it; the real output arrives.
func TestForgedOutputReachesNoTenant(t *testing.T) {
	t.Parallel()
	_, _, connect := fleetIn(t, natsauth.Identity{Role: natsauth.RoleWorker, Name: "spy"})
	s := jobs.Subjects{}
	fe, wr, fr := workerAndFrontend(t, connect)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := fe.Health(ctx); err != nil {
		t.Fatalf("health: %v", err)
	}
	var mu sync.Mutex
	var shown strings.Builder
	started := make(chan struct{}, 1)
	stop, err := fe.WatchOutput("victim", "v", func(_, data string) {
		mu.Lock()
		shown.WriteString(data)
		mu.Unlock()
		select {
		case started <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	code := "import time\nfor i in range(4):\n    print('real', i, flush=True)\n    time.sleep(0.3)"
	if out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "v", Code: code}}, "victim"); out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	select { // the job runs: its first chunk arrived
	case <-started:
	case <-ctx.Done():
		t.Fatalf("no live output (refusals: worker %v, front-end %v)", wr.errs, fr.errs)
	}

	bnc, _ := connect(natsauth.RoleBroker)
	bjs, _ := jetstream.New(bnc)
	key, err := queue.ProxyKey(ctx, bjs, s)
	if err != nil {
		t.Fatal(err)
	}
	id := jobs.ScopedID("victim", "v")
	other := bytes.Repeat([]byte{7}, jobs.CapabilityKeySize)
	mine := jobs.ScopedID("spy", "mine") // a job the spy may hold
	proved := func(capability, job string, c jobs.OutputChunk) jobs.OutputChunk {
		c.Proof = jobs.OutputProof(capability, job, c)
		return c
	}
	genuine := proved(jobs.Capability(key, id), id, jobs.OutputChunk{Stream: "stdout", Data: "real 9\n", Attempt: 1, Seq: 99})
	tampered := genuine
	tampered.Data = "FORGED-tampered\n"
	spy, sr := connect("worker-spy")
	for _, c := range []jobs.OutputChunk{
		{Stream: "stdout", Data: "FORGED-bare\n", Attempt: 1, Seq: 2},
		proved(jobs.Capability(other, id), id, jobs.OutputChunk{Stream: "stdout", Data: "FORGED-other-key\n", Attempt: 1, Seq: 2}),
		proved(jobs.Capability(key, mine), mine, jobs.OutputChunk{Stream: "stdout", Data: "FORGED-other-job\n", Attempt: 1, Seq: 2}),
		proved(jobs.Capability(key, mine), id, jobs.OutputChunk{Stream: "stdout", Data: "FORGED-other-cap\n", Attempt: 1, Seq: 2}),
		tampered,
	} {
		data, _ := json.Marshal(c)
		if err := spy.Publish(s.Output(id), data); err != nil {
			t.Fatal(err)
		}
	}
	// Frames that are not an output chunk at all (queue.DecodeOutput
	// refuses them before any proof is computed).
	big := proved(jobs.Capability(key, mine), id, jobs.OutputChunk{Stream: "stdout", Data: strings.Repeat("FORGED-big", queue.MaxOutputData/10+1), Attempt: 1, Seq: 2})
	bigData, _ := json.Marshal(big)
	for _, raw := range [][]byte{
		[]byte("FORGED-not-json"),
		[]byte(`{"stream":"stdin","data":"FORGED-stream","attempt":1,"seq":2,"proof":"x"}`),
		[]byte(`{"stream":"stdout","data":"FORGED-seq","attempt":1,"seq":-1,"proof":"x"}`),
		bigData,
		nil,
	} {
		if err := spy.Publish(s.Output(id), raw); err != nil {
			t.Fatal(err)
		}
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	rec, err := fe.Wait(ctx, "victim", "v")
	if err != nil || rec.Status != jobs.StatusSuccess {
		t.Fatalf("the victim's job: %+v %v", rec, err)
	}
	// The front-end does show a chunk with the job's proof (what the worker
	// holding it sends): the forgeries were dropped for their proofs.
	data, _ := json.Marshal(genuine)
	if err := spy.Publish(s.Output(id), data); err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		out := shown.String()
		mu.Unlock()
		if strings.Contains(out, "real 9") {
			if strings.Contains(out, "FORGED") {
				t.Fatalf("the tenant was shown forged output: %q", out)
			}
			for i := range 4 {
				if !strings.Contains(out, fmt.Sprintf("real %d\n", i)) {
					t.Fatalf("real output %d missing: %q", i, out)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a chunk with the job's proof was not shown: %q", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(wr.errs) > 0 || len(fr.errs) > 0 || len(sr.errs) > 0 {
		t.Fatalf("refusals on the way: worker %v, front-end %v, spy %v", wr.errs, fr.errs, sr.errs)
	}
}

// TestWorkerAnswersOnlyItsOwnLookups attacks from a named worker identity
// (`broker auth add worker spy`): it tries to answer the session look-ups of
// another worker (which would let it say that worker holds, or has lost, a
// tenant's session). Its subscriptions to every worker's and to w1's look-ups
// are refused and it hears none while the victim's session runs on w1; it
// may answer its own. A worker on that identity runs only as worker id spy:
// as another id it refuses to start, saying why.
func TestWorkerAnswersOnlyItsOwnLookups(t *testing.T) {
	t.Parallel()
	_, _, connect := fleetIn(t, natsauth.Identity{Role: natsauth.RoleWorker, Name: "spy"})
	s := jobs.Subjects{}
	spy, sr := connect("worker-spy")
	var mu sync.Mutex
	var heard []string
	record := func(m *nats.Msg) {
		mu.Lock()
		heard = append(heard, m.Subject+" "+string(m.Data))
		mu.Unlock()
	}
	for _, subj := range []string{s.WorkerSessions("*"), s.WorkerSessions("w1"), "mcpexec.wsession.>"} {
		if _, err := spy.Subscribe(subj, record); err == nil {
			sr.wait(t, `Permissions Violation for Subscription to "`+subj+`"`)
		}
	}
	own, err := spy.Subscribe(s.WorkerSessions("spy"), func(m *nats.Msg) { _ = m.Respond([]byte("gone")) })
	if err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}

	fe, wr, fr := workerAndFrontend(t, connect)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, code := range []string{"secret = 'db-password'", "print(secret)"} {
		rec, err := fe.Run(ctx, &jobs.Job{Code: code, Namespace: "victim", Session: "s1"}, nil)
		if err != nil || rec.Status != jobs.StatusSuccess || rec.Worker != "w1" {
			t.Fatalf("session job %d: %v %+v %+v", i, err, rec, rec.Result)
		}
		if i == 1 && rec.Result.Stdout != "db-password\n" {
			t.Fatalf("the session's globals are gone: %+v", rec.Result)
		}
	}
	mu.Lock()
	if len(heard) > 0 {
		t.Fatalf("the spy heard another worker's session look-ups: %q", heard)
	}
	mu.Unlock()
	_ = own.Unsubscribe()

	// A worker on the spy's identity runs as worker id spy, and as no other.
	wrong, wrongR := connect("worker-spy")
	w, err := worker.New(wrong, testutil.NewFakeRuntime(1), worker.DefaultConfig("w1"))
	if err != nil {
		t.Fatal(err)
	}
	// Refused at once, naming the look-up subject (the start's own check or
	// its wait for the broker, whichever sees the refusal first).
	if err := w.Start(ctx); err == nil || !strings.Contains(err.Error(), s.WorkerSessions("w1")) {
		w.Stop()
		t.Fatalf("a worker on the spy's identity started as w1: %v", err)
	} else {
		t.Logf("as w1: %v", err)
	}
	wrongR.wait(t, `Permissions Violation for Subscription to "`+s.WorkerSessions("w1")+`"`)
	right, rightR := connect("worker-spy")
	testutil.WorkerOn(t, right, testutil.NewFakeRuntime(1), worker.DefaultConfig("spy"))
	if len(wr.errs) > 0 || len(fr.errs) > 0 || len(rightR.errs) > 0 {
		t.Fatalf("refusals on the way: worker %v, front-end %v, spy's worker %v", wr.errs, fr.errs, rightR.errs)
	}
}

// TestForgedSessionEntryRedirectsNothing attacks from a named worker identity
// (`broker auth add worker spy`), which may write the sessions bucket: it
// overwrites the entry of another tenant's live session on w1 to name itself
// (no proof; a proof under another proxy key; a proof made with the
// capability of a session of its own; w1's genuine proof, which names w1;
// values that are no entry: not JSON, over queue.MaxSessionEntry),
// answers "held" to its own look-ups and consumes its own routed-job
// subject. Each time, the victim's next job still runs on w1 in the victim's
// session (its globals are there); the spy is asked nothing and gets no job,
// and the tenant's session list never shows it.
func TestForgedSessionEntryRedirectsNothing(t *testing.T) {
	t.Parallel()
	_, _, connect := fleetIn(t, natsauth.Identity{Role: natsauth.RoleWorker, Name: "spy"})
	s := jobs.Subjects{}
	fe, wr, fr := workerAndFrontend(t, connect)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := fe.Health(ctx); err != nil {
		t.Fatalf("health: %v", err)
	}
	if rec, err := fe.Run(ctx, &jobs.Job{Code: "secret = 'db-password'", Namespace: "victim", Session: "s1"}, nil); err != nil || rec.Status != jobs.StatusSuccess || rec.Worker != "w1" {
		t.Fatalf("warm-up job: %v %+v", err, rec)
	}

	spy, sr := connect("worker-spy")
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
	stolen, err := queue.WorkerJobsConsumer(ctx, sjs, queue.DefaultConfig(), "spy")
	if err != nil {
		t.Fatal(err)
	}
	kv, err := sjs.KeyValue(ctx, s.SessionsBucket())
	if err != nil {
		t.Fatal(err)
	}
	bnc, _ := connect(natsauth.RoleBroker)
	bjs, _ := jetstream.New(bnc)
	key, err := queue.ProxyKey(ctx, bjs, s)
	if err != nil {
		t.Fatal(err)
	}
	skey := queue.SessionKey("victim", "s1")
	if e, err := kv.Get(ctx, skey); err != nil || !strings.Contains(string(e.Value()), `"w1"`) {
		t.Fatalf("the victim's entry before the attack: %v", err)
	}
	other := bytes.Repeat([]byte{7}, jobs.CapabilityKeySize)
	own := jobs.SessionCapability(key, queue.SessionKey("spy", "s1")) // a session the spy may hold
	forged := map[string][]byte{
		// Values that are no entry at all (queue.DecodeSessionEntry
		// refuses them).
		"not JSON":  []byte(`{"worker":"spy"`),
		"oversized": []byte(`{"worker":"spy","session":"s1","proof":"` + strings.Repeat("p", queue.MaxSessionEntry) + `"}`),
	}
	for name, proof := range map[string]string{
		"none":                  "",
		"under another key":     jobs.SessionProof(jobs.SessionCapability(other, skey), skey, "spy"),
		"of the spy's session":  jobs.SessionProof(own, skey, "spy"),
		"of its own key":        jobs.SessionProof(own, queue.SessionKey("spy", "s1"), "spy"),
		"w1's, naming w1 (sic)": jobs.SessionProof(jobs.SessionCapability(key, skey), skey, "w1"),
	} {
		forged[name], _ = json.Marshal(queue.SessionEntry{Worker: "spy", Session: "s1", Since: time.Now().UTC(), Proof: proof})
	}
	for name, data := range forged {
		if _, err := kv.Put(ctx, skey, data); err != nil {
			t.Fatalf("forge the entry (%s): the bucket refused it (%v), so the test proves nothing", name, err)
		}
		jctx, jcancel := context.WithTimeout(ctx, 20*time.Second)
		rec, err := fe.Run(jctx, &jobs.Job{Code: "print(secret)", Namespace: "victim", Session: "s1"}, nil)
		jcancel()
		if err != nil || rec.Status != jobs.StatusSuccess || rec.Worker != "w1" || rec.Result.Stdout != "db-password\n" {
			t.Fatalf("the victim's job after an entry forged (%s): %v %+v", name, err, rec)
		}
		ss, err := fe.Sessions(ctx, "victim")
		if err != nil || len(ss) != 1 || ss[0].Worker != "w1" {
			t.Fatalf("the victim's sessions after an entry forged (%s): %+v %v", name, ss, err)
		}
	}
	// w1 put its entry back when the job came from the pool.
	if e, err := kv.Get(ctx, skey); err != nil || !strings.Contains(string(e.Value()), `"w1"`) {
		t.Fatalf("the victim's entry after the attack: %v", err)
	}
	mu.Lock()
	if len(asked) > 0 {
		t.Fatalf("the spy was asked for the victim's session: %q", asked)
	}
	mu.Unlock()
	batch, err := stolen.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		t.Fatalf("the spy received a job: %s", m.Data())
	}
	if len(wr.errs) > 0 || len(fr.errs) > 0 || len(sr.errs) > 0 {
		t.Fatalf("refusals on the way: worker %v, front-end %v, spy %v", wr.errs, fr.errs, sr.errs)
	}
}

// TestOnlyFrontendsAnswerApprovals: the approvals bucket (calls parked for a
// person, and the answers that release them) is the front-ends'. A front-end
// identity parks, lists, watches and answers; a worker identity, which runs
// hostile code, can neither read a parked call nor write an answer.
func TestOnlyFrontendsAnswerApprovals(t *testing.T) {
	t.Parallel()
	_, connect := fleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := jobs.Subjects{}
	key := s.ApprovalKey("a", strings.Repeat("ab", 16))

	fe, _ := connect(natsauth.RoleFrontend)
	fjs, _ := jetstream.New(fe)
	kv, err := fjs.KeyValue(ctx, s.ApprovalsBucket())
	if err != nil {
		t.Fatalf("front-end opens the approvals bucket: %v", err)
	}
	rev, err := kv.Create(ctx, key, []byte(`{"state":"pending"}`))
	if err != nil {
		t.Fatalf("front-end parks a call: %v", err)
	}
	lister, err := kv.ListKeysFiltered(ctx, s.ApprovalKeys("a"))
	if err != nil {
		t.Fatalf("front-end lists: %v", err)
	}
	n := 0
	for range lister.Keys() {
		n++
	}
	if n != 1 {
		t.Fatalf("front-end lists %d keys", n)
	}
	w, err := kv.Watch(ctx, key)
	if err != nil {
		t.Fatalf("front-end watches: %v", err)
	}
	defer func() { _ = w.Stop() }()

	worker, wr := connect(natsauth.RoleWorker)
	// A forged answer published straight on the bucket's subject...
	_ = worker.Publish("$KV."+s.ApprovalsBucket()+"."+key, []byte(`{"state":"approved","decided_by":"worker"}`))
	wr.wait(t, `Permissions Violation for Publish to "$KV.`+s.ApprovalsBucket())
	// ...or through the JetStream API; nor can it read or watch the calls.
	wjs, _ := jetstream.New(worker)
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	defer wcancel()
	if _, err := wjs.KeyValue(wctx, s.ApprovalsBucket()); err == nil {
		t.Fatal("a worker opened the approvals bucket")
	}
	_, _ = worker.Request(s.DirectGet("KV_"+s.ApprovalsBucket(), "$KV."+s.ApprovalsBucket()+"."+key), nil, 300*time.Millisecond)
	wr.wait(t, `Permissions Violation for Publish to "$JS.API.DIRECT.GET.KV_`+s.ApprovalsBucket())
	if _, err := worker.Subscribe("$KV."+s.ApprovalsBucket()+".>", func(*nats.Msg) {}); err == nil {
		wr.wait(t, `Permissions Violation for Subscription to "$KV.`+s.ApprovalsBucket())
	}
	e, err := kv.Get(ctx, key)
	if err != nil || e.Revision() != rev || string(e.Value()) != `{"state":"pending"}` {
		t.Fatalf("the parked call after the worker's attempts: %v %v", e, err)
	}
	// The front-end's answer reaches the watcher.
	if _, err := kv.Update(ctx, key, []byte(`{"state":"approved"}`), rev); err != nil {
		t.Fatalf("front-end answers: %v", err)
	}
	for u := range w.Updates() {
		if u != nil && string(u.Value()) == `{"state":"approved"}` {
			return
		}
	}
}

// TestWorkerAsksTheSessionHolder: a worker that takes a session's job from
// the pool asks the worker its entry names whether it still holds the
// session (queue.HoldsSession). Under the worker role that request must get
// through: refused, it reads as "gone", and the asking worker would take
// the session over with none of its state.
func TestWorkerAsksTheSessionHolder(t *testing.T) {
	t.Parallel()
	_, _, connect := fleetIn(t, natsauth.Identity{Role: natsauth.RoleWorker, Name: "w2"})
	s := jobs.Subjects{}
	fe, wr, fr := workerAndFrontend(t, connect)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if rec, err := fe.Run(ctx, &jobs.Job{Code: "x = 1", Namespace: "ns", Session: "s1"}, nil); err != nil || rec.Status != jobs.StatusSuccess {
		t.Fatalf("session job: %v %+v", err, rec)
	}
	other, or := connect("worker-w2")
	if !queue.HoldsSession(ctx, other, s, "w1", queue.SessionKey("ns", "s1")) {
		t.Fatalf("another worker asked w1 about its session and heard it is gone (refusals: %v)", or.errs)
	}
	if len(wr.errs) > 0 || len(fr.errs) > 0 || len(or.errs) > 0 {
		t.Fatalf("refusals: worker %v, front-end %v, other worker %v", wr.errs, fr.errs, or.errs)
	}
}

// workerAndFrontend starts worker w1 (process runtime) and front-end fe1, each
// connected under its role; the refusals are the worker's and the front-end's.
func workerAndFrontend(t *testing.T, connect func(string) (*nats.Conn, *refusals)) (*frontend.Frontend, *refusals, *refusals) {
	t.Helper()
	wnc, wr := connect(natsauth.RoleWorker)
	testutil.WorkerOn(t, wnc, testutil.ProcessRuntime(t), worker.DefaultConfig("w1"))
	fnc, fr := connect(natsauth.RoleFrontend)
	return testutil.FrontendOnWith(t, fnc, frontend.Config{ID: "fe1", Policy: frontend.DefaultPolicy()}), wr, fr
}
