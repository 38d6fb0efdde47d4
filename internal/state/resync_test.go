package state_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	tu "github.com/mcpexec/mcpexec/internal/testutil"
)

// logBuffer is a slog destination the test reads back.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if testing.Verbose() {
		_, _ = os.Stderr.Write(p) // a copy for the reader of -v
	}
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// resyncPhase is one life of the broker on dir: a front-end and a worker on
// their own connections, stopped before the broker.
type resyncPhase struct {
	b    *broker.Broker
	fe   *frontend.Frontend
	logs *logBuffer
	m    *metrics.Metrics
	stop func()
}

func startPhase(t *testing.T, dir, listen string) *resyncPhase {
	t.Helper()
	q := queue.DefaultConfig()
	p := &resyncPhase{logs: &logBuffer{}, m: metrics.New("broker")}
	p.b = tu.Broker(t, dir, q, func(cfg *broker.Config) {
		cfg.Listen = listen
		cfg.Logger = slog.New(slog.NewTextHandler(p.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		cfg.Metrics = p.m
	})
	fnc, wnc := tu.Connect(t, p.b, "fe"), tu.Connect(t, p.b, "w")
	p.fe = tu.FrontendOn(t, fnc, "fe")
	w := tu.WorkerOn(t, wnc, &tu.FakeRuntime{}, tu.QuickWorker("w", q))
	p.stop = func() {
		w.Stop()
		p.fe.Stop()
		wnc.Close()
		fnc.Close()
		_ = p.b.Close() // Close always returns nil
	}
	return p
}

// finish submits a job and waits, through the state service as a user
// would, for its record to say it succeeded.
func finish(t *testing.T, fe *frontend.Frontend, id string) {
	t.Helper()
	tu.MustSubmit(t, fe, &jobs.Job{ID: id, Code: "x"})
	waitStatus(t, fe, id, jobs.StatusSuccess)
}

func waitStatus(t *testing.T, fe *frontend.Frontend, id string, want jobs.Status) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rec, err := fe.Get(ctx, "", id)
		cancel()
		if err == nil && rec.Status == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: want status %s, got %+v (err %v)", id, want, rec, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func putValue(t *testing.T, c *state.Client, key, value string, ifVersion *uint64) *state.Memory {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: key, Value: json.RawMessage(value)}, ifVersion)
	if err != nil {
		t.Fatalf("put %s=%s: %v", key, value, err)
	}
	return m
}

func getValue(t *testing.T, c *state.Client, key string) (*state.Memory, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return c.MemoryGet(ctx, "ns", key)
}

// waitValue waits until memory key holds value: the replica folds the memory
// stream apart from the events stream, so a write may land after an event
// published later.
func waitValue(t *testing.T, c *state.Client, key, value string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := getValue(t, c, key)
		if err == nil && string(got.Value) == value {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("memory %q: %+v %v, want %s", key, got, err, value)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// regrownWrites is how many events and memory writes regrow publishes: more
// than the streams lost in TestReplicaAheadOfStreams.
const regrownWrites = 5

// regrow starts the broker on dir without its state replica and publishes
// submissions and memory writes, which take the sequences the streams lost.
func regrow(t *testing.T, dir, listen string) {
	t.Helper()
	b := tu.Broker(t, dir, queue.DefaultConfig(), func(cfg *broker.Config) {
		cfg.Listen, cfg.NoState = listen, true
	})
	defer func() { _ = b.Close() }() // Close always returns nil
	nc := tu.Connect(t, b, "regrow")
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	publishRegrown(t, js)
}

// publishRegrown publishes regrownWrites submissions (regrown-N, queued) and
// memory writes (rN=N).
func publishRegrown(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub, now := jobs.Subjects{}, time.Now().UTC()
	for i := range regrownWrites {
		id := jobs.ScopedID("", fmt.Sprintf("regrown-%d", i))
		ev, _ := json.Marshal(jobs.Event{Job: id, Kind: jobs.EventSubmitted, At: now,
			Spec: &jobs.Job{ID: id, Namespace: jobs.DefaultNamespace, Code: "x", SubmittedAt: now}})
		if _, err := js.Publish(ctx, sub.Event(id, jobs.EventSubmitted), ev); err != nil {
			t.Fatal(err)
		}
		op, _ := json.Marshal(state.MemoryOp{Op: state.MemoryPutOp, Namespace: "ns", Key: fmt.Sprintf("r%d", i), Value: json.RawMessage(fmt.Sprint(i)), CreatedAt: now, At: now})
		if _, err := js.Publish(ctx, sub.Memory("ns", fmt.Sprintf("r%d", i)), op); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReplicaAheadOfStreams loses the streams' last writes while the broker is
// down (as a power cut does to writes JetStream had not synced, while the
// state file, which fsyncs, kept them): the restarted replica has applied more
// than the streams hold. It must say so and resynchronise: the records it
// holds stay answered, new jobs are recorded, memory is what the memory stream
// holds, and new writes and compare-and-set work, also for a client that saw
// the lost sequences before the restart.
func TestReplicaAheadOfStreams(t *testing.T) {
	t.Parallel()
	// tail: the streams lost their last writes; all: every write;
	// regrown: their last writes, and new writes took the lost sequences
	// before the replica came back.
	for _, lost := range []string{"tail", "all", "regrown"} {
		t.Run("lost="+lost, func(t *testing.T) {
			t.Parallel()
			dir, listen := t.TempDir(), fmt.Sprintf("127.0.0.1:%d", tu.FreePorts(t, 1)[0])
			js, kept := filepath.Join(dir, "jetstream"), filepath.Join(dir, "jetstream.kept")

			p := startPhase(t, dir, listen)
			// A client that lives through the restarts (reconnecting), and
			// remembers the sequences it saw.
			surv := state.NewClient(tu.Connect(t, p.b, "survivor"), jobs.Subjects{})
			finish(t, p.fe, "old-1")
			v1 := putValue(t, surv, "k", `1`, u64(0))
			putValue(t, surv, "keep", `"kept"`, nil)
			if lost != "all" {
				// What the streams will still hold: up to here.
				p.stop()
				if err := os.CopyFS(kept, os.DirFS(js)); err != nil {
					t.Fatal(err)
				}
				p = startPhase(t, dir, listen)
			}
			finish(t, p.fe, "lost-1")
			v2 := putValue(t, surv, "k", `2`, u64(v1.Version))
			putValue(t, surv, "gone", `"lost"`, nil)
			if _, err := surv.Job(context.Background(), jobs.ScopedID("", "lost-1")); err != nil {
				t.Fatal(err) // the survivor has seen the lost events' sequences
			}
			p.stop()
			if err := os.RemoveAll(js); err != nil {
				t.Fatal(err)
			}
			if lost != "all" {
				if err := os.Rename(kept, js); err != nil {
					t.Fatal(err)
				}
			}
			if lost == "regrown" {
				regrow(t, dir, listen)
			}

			p = startPhase(t, dir, listen)
			defer p.stop()
			logs := p.logs.String()
			rec := httptest.NewRecorder()
			p.m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
			scraped, _ := io.ReadAll(rec.Body)
			for _, stream := range []string{jobs.Subjects{}.EventsStream(), jobs.Subjects{}.MemoryStream()} {
				if !strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, "stream="+stream) || !strings.Contains(logs, "no longer holds") {
					t.Errorf("the log does not say that the replica was ahead of %s:\n%s", stream, logs)
				}
				if want := `mcpexec_state_replica_resyncs_total{component="broker",stream="` + stream + `"} 1`; !strings.Contains(string(scraped), want) {
					t.Errorf("the metrics lack %s", want)
				}
			}
			// The survivor saw sequences the streams lost: it is answered at
			// once all the same, before new writes take those sequences.
			start := time.Now()
			if rec, err := surv.Job(context.Background(), jobs.ScopedID("", "lost-1")); err != nil || rec.Status != jobs.StatusSuccess {
				t.Fatalf("the survivor reads a record the stream lost: %+v %v", rec, err)
			}
			if _, err := getValue(t, surv, "keep"); (err != nil) != (lost == "all") {
				t.Fatalf("the survivor reads memory: %v", err)
			}
			// (Waiting for a resync would take the request's 20 s deadline;
			// the bound leaves room for a loaded machine.)
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the survivor's reads took %s", d)
			}
			// The records the streams lost are still answered.
			waitStatus(t, p.fe, "lost-1", jobs.StatusSuccess)
			waitStatus(t, p.fe, "old-1", jobs.StatusSuccess)
			// New jobs are recorded, and reach their end.
			for i := range 3 {
				finish(t, p.fe, fmt.Sprintf("new-%d", i))
			}
			// Memory is what the memory stream holds.
			want := map[string]string{"k": `1`, "keep": `"kept"`}
			switch lost {
			case "all":
				want = map[string]string{}
			case "regrown":
				for i := range regrownWrites {
					want[fmt.Sprintf("r%d", i)] = fmt.Sprint(i)
				}
				// The events published while the replica was away, which
				// took the sequences it had applied, are applied.
				for i := range regrownWrites {
					if rec, err := surv.Job(context.Background(), jobs.ScopedID("", fmt.Sprintf("regrown-%d", i))); err != nil || rec.Status != jobs.StatusQueued {
						t.Errorf("a job submitted while the replica was away: %+v %v", rec, err)
					}
				}
			}
			reader := state.NewClient(tu.Connect(t, p.b, "reader"), jobs.Subjects{})
			for _, key := range []string{"k", "keep", "gone", "r0", "r1", "r2", "r3", "r4"} {
				if w, ok := want[key]; ok {
					waitValue(t, reader, key, w) // the memory stream is folded apart from the events
					continue
				}
				m, err := getValue(t, reader, key)
				switch {
				case !errors.Is(err, state.ErrNotFound):
					t.Errorf("memory %s, which the stream lost, after the restart: %+v %v, want not found", key, m, err)
				}
			}
			if !strings.Contains(logs, "keys_changed=") {
				t.Errorf("the log does not say how many memory keys changed:\n%s", logs)
			}
			// New writes, and compare-and-set, for a new client and for the
			// survivor.
			for _, c := range []*state.Client{state.NewClient(tu.Connect(t, p.b, "new-client"), jobs.Subjects{}), surv} {
				cur, err := getValue(t, c, "k")
				var base *uint64
				switch {
				case lost == "all" && errors.Is(err, state.ErrNotFound):
					base = u64(0)
				case err != nil:
					t.Fatalf("read k: %v", err)
				default:
					base = u64(cur.Version)
				}
				// (A new write may have taken the lost version's sequence.)
				if *base != v2.Version {
					if _, err := c.MemoryPut(context.Background(), state.Memory{Namespace: "ns", Key: "k", Value: json.RawMessage(`"stale"`)}, u64(v2.Version)); !errors.Is(err, state.ErrConflict) {
						t.Errorf("compare-and-set at the lost version %d: %v, want a conflict", v2.Version, err)
					}
				}
				next := putValue(t, c, "k", `"next"`, base)
				if got, err := getValue(t, c, "k"); err != nil || string(got.Value) != `"next"` || got.Version != next.Version {
					t.Fatalf("read after compare-and-set: %+v %v, want version %d", got, err, next.Version)
				}
				putValue(t, c, "fresh", `"new"`, nil)
				if got, err := getValue(t, c, "fresh"); err != nil || string(got.Value) != `"new"` {
					t.Fatalf("read a new key: %+v %v", got, err)
				}
			}
			// The survivor reads new records too.
			if rec, err := surv.Job(context.Background(), jobs.ScopedID("", "new-2")); err != nil || rec.Status != jobs.StatusSuccess {
				t.Fatalf("the survivor reads a new record: %+v %v", rec, err)
			}
			// The followers, which check their streams as they go, found
			// nothing more.
			if n := strings.Count(p.logs.String(), "no longer holds"); n != 2 {
				t.Errorf("the replica resynchronised %d times, want 2:\n%s", n, p.logs.String())
			}
		})
	}
}

// TestReplicaNoticesLostStreamsWhileRunning deletes the events and memory
// streams under a running replica and creates them again (empty, as a node
// whose stream files were lost starts them): the followers notice that the
// streams hold less than they applied, and resynchronise, so that new jobs
// are recorded and new memory writes applied.
func TestReplicaNoticesLostStreamsWhileRunning(t *testing.T) {
	t.Parallel()
	p := startPhase(t, t.TempDir(), "127.0.0.1:-1")
	defer p.stop()
	c := state.NewClient(tu.Connect(t, p.b, "client"), jobs.Subjects{})
	finish(t, p.fe, "before")
	v := putValue(t, c, "k", `1`, u64(0))
	putValue(t, c, "k", `2`, u64(v.Version))

	nc := tu.Connect(t, p.b, "admin")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub := jobs.Subjects{}
	for _, stream := range []string{sub.EventsStream(), sub.MemoryStream()} {
		if err := js.DeleteStream(ctx, stream); err != nil {
			t.Fatal(err)
		}
	}
	if err := queue.Setup(ctx, js, queue.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	// New writes take the lost sequences, likely before the replica checks.
	publishRegrown(t, js)
	finish(t, p.fe, "after")
	for i := range regrownWrites {
		waitStatus(t, p.fe, fmt.Sprintf("regrown-%d", i), jobs.StatusQueued)
		waitValue(t, c, fmt.Sprintf("r%d", i), fmt.Sprint(i))
	}
	waitStatus(t, p.fe, "before", jobs.StatusSuccess) // kept
	// The replica may not have checked the memory stream yet.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := getValue(t, c, "k")
		if errors.Is(err, state.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("memory the stream lost: %v, want not found", err)
		}
	}
	m := putValue(t, c, "k", `"new"`, u64(0))
	putValue(t, c, "k", `"next"`, u64(m.Version))
	if got, err := getValue(t, c, "k"); err != nil || string(got.Value) != `"next"` {
		t.Fatalf("memory after a compare-and-set: %+v %v", got, err)
	}
	logs := p.logs.String()
	for _, want := range []string{"stream=" + sub.EventsStream(), "stream=" + sub.MemoryStream(), "keys_changed="} {
		if !strings.Contains(logs, want) || !strings.Contains(logs, "no longer holds") {
			t.Errorf("the log lacks %q:\n%s", want, logs)
		}
	}
}

// TestCheckTail: a follower takes its stream for one that lost its tail when
// it holds less than the follower applied, or when the message at the last
// sequence applied is another one (new writes took the lost sequences); not
// when that message was deleted since, nor when it is the one applied.
func TestCheckTail(t *testing.T) {
	t.Parallel()
	b := tu.Broker(t, "", queue.DefaultConfig())
	nc := tu.Connect(t, b, "check")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TAIL", Subjects: []string{"tail.>"}, AllowDirect: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, fmt.Sprintf("tail.%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	third, err := st.GetMsg(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := state.NewService(nc, nil, jobs.Subjects{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		applied   uint64
		published time.Time
		notAfter  time.Time
		lost      bool
	}{
		{"the stream holds what was applied", 3, third.Time, time.Time{}, false},
		{"the stream holds more", 2, time.Time{}, time.Time{}, false},
		{"the stream holds less", 4, time.Time{}, time.Time{}, true},
		{"another message at the sequence applied", 3, third.Time.Add(-time.Second), time.Time{}, true},
		{"published before the replica's commit", 3, time.Time{}, third.Time.Add(time.Millisecond), false},
		{"published after the replica's commit", 3, time.Time{}, third.Time.Add(-time.Second), true},
	} {
		why, err := svc.CheckTail(ctx, "TAIL", c.applied, c.published, c.notAfter)
		if err != nil || (why != "") != c.lost {
			t.Errorf("%s: lost %q %v, want lost %v", c.name, why, err, c.lost)
		}
	}
	if err := st.DeleteMsg(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if why, err := svc.CheckTail(ctx, "TAIL", 3, third.Time.Add(-time.Second), time.Time{}); err != nil || why != "" {
		t.Errorf("a message deleted since: lost %q %v", why, err)
	}
}
