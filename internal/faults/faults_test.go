package faults_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/state"
)

// TestMain fails the package's tests when goroutines outlive them, but for
// two of nats-server's that a clustered node's shutdown can leave behind
// when it races a stream store being created (see internal/e2e).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"))
}

// scheduleEnv selects the long schedule (`make faults`).
const scheduleEnv = "MCPEXEC_FAULTS"

// fault is one step of a schedule: inject breaks something, hold is how
// long it stays broken while the clients go on, heal repairs it.
type fault struct {
	name   string
	hold   time.Duration
	inject func(t *testing.T, f *fleet) (heal func(t *testing.T))
}

// powerCut cuts the power of the nodes that pick chooses, and restarts them.
func powerCut(name string, hold time.Duration, pick func(f *fleet) []int) fault {
	return fault{name: name, hold: hold, inject: func(t *testing.T, f *fleet) func(*testing.T) {
		idx := pick(f)
		var wg sync.WaitGroup
		dropped := make([]int, len(idx))
		for k, i := range idx {
			wg.Go(func() { dropped[k] = f.down(i, cutPower) })
		}
		wg.Wait()
		t.Logf("%s: power cut of nodes %v, unsynced writes dropped: %v", name, idx, dropped)
		return func(t *testing.T) { f.up(t, idx...) }
	}}
}

// stallJobs makes the jobs stream no replica will lead (docs/design.md, "A
// stream no replica will lead") under load, rather than waiting for a power
// cut to: every node stopped cleanly (each snapshots the jobs stream), each
// node's store of that stream removed, every node started again. That is
// what such a cut leaves: each replica behind its snapshot. The brokers
// must replace the stream, make again the workers' consumers (which keep
// their positions in the old stream) and requeue its jobs, losing none.
func stallJobs(hold time.Duration) fault {
	return fault{name: "jobs stream stalled", hold: hold, inject: func(t *testing.T, f *fleet) func(*testing.T) {
		// The snapshot must list queued messages for the replicas to be
		// behind it: five for a pool no worker serves (not jobs of the
		// history; no worker would take them anyway).
		nc := f.connect(t, "staller", 0)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for k := range 5 {
			if _, err := js.Publish(ctx, f.q.Subjects.Job("parked"), []byte(fmt.Sprint("parked ", k))); err != nil {
				t.Fatalf("park a message in the jobs stream: %v", err)
			}
		}
		nc.Close()
		var wg sync.WaitGroup
		for i := range f.nodes {
			wg.Go(func() { f.down(i, clean) })
		}
		wg.Wait()
		for i := range f.nodes {
			msgs := f.msgsDir(i, f.q.Subjects.JobsStream())
			if err := os.RemoveAll(msgs); err != nil {
				t.Fatalf("remove %s: %v", msgs, err)
			}
		}
		t.Logf("jobs stream stalled: every node stopped, its store of the jobs stream removed")
		return func(t *testing.T) { f.up(t, 0, 1, 2) }
	}}
}

// killLeader kill -9s the leader of the jobs stream, and restarts it.
func killLeader(hold time.Duration) fault {
	return fault{name: "kill -9 jobs leader", hold: hold, inject: func(t *testing.T, f *fleet) func(*testing.T) {
		i := leaderOrAny(f, f.q.Subjects.JobsStream())
		f.down(i, kill)
		t.Logf("killed node %d", i)
		return func(t *testing.T) { f.up(t, i) }
	}}
}

// killConsumers kill -9s the node leading the most consumers, and restarts it.
func killConsumers(hold time.Duration) fault {
	return fault{name: "kill -9 most consumers", hold: hold, inject: func(t *testing.T, f *fleet) func(*testing.T) {
		i := f.mostConsumers()
		if i < 0 {
			i = 0
		}
		f.down(i, kill)
		t.Logf("killed node %d", i)
		return func(t *testing.T) { f.up(t, i) }
	}}
}

// partition isolates the jobs stream's leader from the two other nodes.
func partition(hold time.Duration) fault {
	return fault{name: "partition jobs leader", hold: hold, inject: func(t *testing.T, f *fleet) func(*testing.T) {
		i := leaderOrAny(f, f.q.Subjects.JobsStream())
		f.isolate(i, true)
		t.Logf("isolated node %d", i)
		return func(*testing.T) { f.isolate(i, false) }
	}}
}

// pause holds every byte to and from the jobs stream's leader.
func pause(hold time.Duration) fault {
	return fault{name: fmt.Sprintf("pause jobs leader %s", hold), hold: hold, inject: func(t *testing.T, f *fleet) func(*testing.T) {
		i := leaderOrAny(f, f.q.Subjects.JobsStream())
		f.pause(i, true)
		t.Logf("paused node %d", i)
		return func(*testing.T) { f.pause(i, false) }
	}}
}

// workerAndFrontend kills a worker and a front-end in the same window and
// starts new ones.
func workerAndFrontend(hold time.Duration) fault {
	return fault{name: "kill worker + front-end", hold: hold, inject: func(t *testing.T, f *fleet) func(*testing.T) {
		w, fe := f.killWorker(), f.killFrontend()
		t.Logf("killed %s and %s", w, fe)
		return func(t *testing.T) {
			f.addWorker(t)
			f.addFrontend(t)
		}
	}}
}

func leaderOrAny(f *fleet, stream string) int {
	if i := f.leader(stream); i >= 0 {
		return i
	}
	return 0
}

func nodes(idx ...int) func(*fleet) []int { return func(*fleet) []int { return idx } }

// shortSchedule runs in `make test`: a power cut of every node and a kill
// of the leader. The partition of the leader is in the long schedule only:
// in one short run of several it lost an acknowledged job (its submitted
// event recorded, the job never enqueued), a bug issue 27 still has open;
// `make test` must not fail on a known bug at random.
func shortSchedule() []fault {
	return []fault{
		powerCut("power cut all three", 2*time.Second, nodes(0, 1, 2)),
		killLeader(3 * time.Second),
	}
}

// longSchedule is `make faults`: every fault of issue 27, some twice.
func longSchedule() []fault {
	return []fault{
		powerCut("power cut one node", 4*time.Second, nodes(1)),
		killLeader(4 * time.Second),
		powerCut("power cut two nodes", 4*time.Second, nodes(0, 2)),
		partition(10 * time.Second),
		pause(10 * time.Second),
		workerAndFrontend(4 * time.Second),
		killConsumers(4 * time.Second),
		powerCut("power cut all three", 3*time.Second, nodes(0, 1, 2)),
		killLeader(2 * time.Second),
		partition(10 * time.Second),
		powerCut("power cut all three", 1*time.Second, nodes(0, 1, 2)),
		stallJobs(time.Second),
	}
}

// stallSchedule (MCPEXEC_FAULTS=stall) makes the jobs stream stall twice.
func stallSchedule() []fault {
	return []fault{stallJobs(time.Second), killLeader(2 * time.Second), stallJobs(2 * time.Second)}
}

// partitionSchedule (MCPEXEC_FAULTS=partition) repeats the fault that once
// lost an acknowledged job, to check its fix many times over.
func partitionSchedule() []fault {
	return []fault{partition(10 * time.Second), partition(5 * time.Second), partition(10 * time.Second)}
}

// cutsSchedule (MCPEXEC_FAULTS=cuts) repeats the power cut of every node,
// the fault after which the fleet once did not come back.
func cutsSchedule() []fault {
	var s []fault
	for _, hold := range []time.Duration{3 * time.Second, time.Second, 3 * time.Second, time.Second, 2 * time.Second, time.Second} {
		s = append(s, powerCut("power cut all three", hold, nodes(0, 1, 2)))
	}
	return s
}

// TestFaults runs a schedule of faults under a steady load of jobs through
// the jobs API, each an update_memory increment run by a real Python
// runner, and checks the history: nothing acknowledged lost (every fault
// here leaves a majority its data: JetStream syncs before it
// acknowledges), nothing recorded twice, the counter exact, the replicas
// identical, and a new job recorded at once after the last fault.
func TestFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite")
	}
	schedule := shortSchedule()
	switch os.Getenv(scheduleEnv) {
	case "long":
		schedule = longSchedule()
	case "partition":
		schedule = partitionSchedule()
	case "cuts":
		schedule = cutsSchedule()
	case "stall":
		schedule = stallSchedule()
	}
	// One worker on Podman, one on the process runtime: the suite holds on
	// both.
	f := startFleet(t, fleetOptions{podman: true})
	v := runSchedule(t, f, schedule)
	t.Logf("results (%s schedule):\n%s", scheduleName(), v.table())
	for _, p := range v.problems {
		t.Error(p)
	}
	if v.byWorker[f.podmanWorker] == 0 {
		t.Errorf("the worker on Podman, %s, recorded no job's outcome: the suite did not run on Podman", f.podmanWorker)
	}
	if len(v.problems) > 0 {
		f.diagnose(t, v.lost)
	}
	if err := f.sameReplicas(30 * time.Second); err != nil {
		t.Error(err)
	}
	probe(t, f)
}

func scheduleName() string {
	return cmp.Or(os.Getenv(scheduleEnv), "short")
}

// TestSyncOffLosesWrites is the negative control: with JetStream syncing
// only every minute, a power cut of all three nodes loses acknowledged
// writes (the counter goes back, jobs vanish) or leaves the fleet unable to
// record new ones, and the checker says so. It shows the harness can fail.
func TestSyncOffLosesWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite")
	}
	f := startFleet(t, fleetOptions{sync: broker.SyncPolicy{Interval: time.Minute}})
	f.addWorker(t)
	f.addFrontend(t)
	h := newHistory()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { client(ctx, h, "c0", f.apiURLs, 20*time.Second) })
	waitAcked(h, 10, 60*time.Second)
	cancel()
	wg.Wait()
	// Every acknowledged job ran: its increment is acknowledged too.
	readAll(h, f.apiURLs(), 60*time.Second)

	h.open("power cut all three (sync interval:1m)")
	dropped := 0
	for i := range f.nodes {
		dropped += f.down(i, cutPower)
	}
	t.Logf("power cut: %d unsynced writes dropped", dropped)
	f.isolate(0, false)
	for _, n := range f.nodes {
		n.client.partition(nil)
	}
	if err := f.tryStart(60*time.Second, 0, 1, 2); err != nil {
		t.Logf("the fleet did not come back (detected): %v", err)
		return
	}
	recs := readAll(h, f.apiURLs(), 10*time.Second)
	counter, err := readCounter(f)
	v := check(h, recs, counter, err)
	t.Logf("results:\n%s", v.table())
	for _, p := range v.problems {
		t.Logf("detected: %s", p)
	}
	if len(v.problems) == 0 {
		if perr := tryProbe(f, 30*time.Second); perr != nil {
			t.Logf("detected: %v", perr)
			return
		}
		t.Fatalf("a power cut of all three nodes with sync interval:1m lost nothing the checker sees (%d writes dropped): the harness cannot fail", dropped)
	}
}

// waitAcked waits until n submissions of h were acknowledged.
func waitAcked(h *history, n int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		h.mu.Lock()
		acked := 0
		for _, o := range h.ops {
			if o.acked {
				acked++
			}
		}
		h.mu.Unlock()
		if acked >= n {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runSchedule starts two workers, two front-ends and two clients, runs the
// schedule's faults one after another, lets the fleet settle, and checks
// the history.
func runSchedule(t *testing.T, f *fleet, schedule []fault) *verdict {
	t.Helper()
	for range 2 {
		f.addWorker(t)
		f.addFrontend(t)
	}
	h := newHistory()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for c := range 3 {
		wg.Go(func() { client(ctx, h, fmt.Sprint("c", c), f.apiURLs, 45*time.Second) })
	}
	time.Sleep(2 * time.Second)
	for _, ft := range schedule {
		start := time.Now()
		h.open(ft.name)
		heal := ft.inject(t, f)
		time.Sleep(ft.hold)
		heal(t)
		healed := time.Now()
		// Settle: the next fault starts once the fleet runs new jobs again.
		if err := tryProbe(f, 60*time.Second); err != nil {
			t.Errorf("after %s: %v", ft.name, err)
		}
		t.Logf("%s: injected for %s, healed in %s, new jobs run %s after", ft.name, ft.hold, healed.Sub(start).Round(time.Millisecond),
			time.Since(healed).Round(time.Millisecond))
		time.Sleep(time.Second)
	}
	h.open("after the faults")
	time.Sleep(2 * time.Second)
	cancel()
	wg.Wait()
	recs := readAll(h, f.apiURLs(), 90*time.Second)
	counter, err := readCounter(f)
	return check(h, recs, counter, err)
}

// readCounter reads the shared counter from the state service.
func readCounter(f *fleet) (int, error) {
	for _, n := range f.nodes {
		b := n.broker()
		if b == nil {
			continue
		}
		nc, err := b.Connect("faults-counter")
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		m, err := state.NewClient(nc, jobs.Subjects{}).MemoryGet(ctx, ns, "counter")
		cancel()
		nc.Close()
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(strings.TrimSpace(string(m.Value)))
	}
	return 0, fmt.Errorf("no node runs")
}

var probes int

// tryProbe submits a job that prints and waits for its record to end
// success: the fleet records and runs new jobs.
func tryProbe(f *fleet, limit time.Duration) error {
	probes++
	id := fmt.Sprintf("probe-%d", probes)
	deadline := time.Now().Add(limit)
	var last string
	for time.Now().Before(deadline) {
		for _, u := range f.apiURLs() {
			status, body := apiDo("POST", u+"/api/jobs", map[string]any{"id": id, "code": "print('probe')"}, 10*time.Second)
			if status/100 != 2 {
				last = fmt.Sprintf("submit: %d %s", status, body)
				continue
			}
			status, body = apiDo("GET", u+"/api/jobs/"+id+"/wait?timeout=5s", nil, 10*time.Second)
			if status == 200 && strings.Contains(string(body), `"status":"success"`) {
				return nil
			}
			last = fmt.Sprintf("wait: %d %.200s", status, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("a new job was not run and recorded within %s: %s", limit, last)
}

func probe(t *testing.T, f *fleet) {
	t.Helper()
	if err := tryProbe(f, 30*time.Second); err != nil {
		t.Error(err)
	}
}
