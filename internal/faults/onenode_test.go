package faults_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/broker"
)

// TestOneNodePowerCut is the embedded default's shape (issue 27): one
// broker under sync always, which it keeps with group sync barriers
// (JetStream acknowledges at once; every writer waits for a sync of the
// store before it reports success), a steady load of update_memory
// increments through the jobs API, and two power cuts of the node (its
// unsynced writes dropped) in the middle of it. Nothing acknowledged is
// lost, nothing is recorded twice, the counter is exact, and the node runs
// and records new jobs at once after each restart.
func TestOneNodePowerCut(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite")
	}
	f := startFleet(t, fleetOptions{single: true})
	if b := f.nodes[0].broker(); b == nil || !b.GroupSync() {
		t.Fatal("the one broker does not keep sync always with group sync barriers")
	}
	v, dropped, stuck := cutOneNode(t, f, 3, 60*time.Second)
	t.Logf("results (%d unsynced writes dropped: a barrier syncs within a millisecond or so of each write):\n%s", dropped, v.table())
	for _, p := range append(v.problems, stuck...) {
		t.Error(p)
	}
	if len(v.lost) > 0 {
		f.diagnose(t, v.lost)
	}
	probe(t, f)
}

// TestOneNodeSyncOffLosesWrites is the negative control of
// TestOneNodePowerCut: with JetStream syncing only every minute, a power cut
// of the one node loses acknowledged writes (or leaves the node unable to
// record new jobs), and the checker says so.
func TestOneNodeSyncOffLosesWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite")
	}
	f := startFleet(t, fleetOptions{single: true, sync: broker.SyncPolicy{Interval: time.Minute}})
	v, dropped, stuck := cutOneNode(t, f, 1, 20*time.Second)
	t.Logf("results (%d unsynced writes dropped):\n%s", dropped, v.table())
	for _, p := range append(v.problems, stuck...) {
		t.Logf("detected: %s", p)
	}
	if len(v.problems) == 0 && len(stuck) == 0 {
		if err := tryProbe(f, 30*time.Second); err != nil {
			t.Logf("detected: %v", err)
			return
		}
		t.Fatalf("a power cut of the one node with sync interval:1m lost nothing the checker sees (%d writes dropped): the harness cannot fail", dropped)
	}
}

// cutOneNode runs a worker, a front-end and four clients on f (one node),
// cuts the node's power cuts times while they run, each at a moment when
// its file system holds unsynced writes (what JetStream acknowledged and no
// barrier has synced yet, as often as not), starts it again after each,
// and checks the history. It waits patience for a new job to run after a
// cut, and for the acknowledged jobs' records. It returns the verdict, the
// unsynced writes the cuts dropped, and what said the node did not run new
// jobs after a cut.
func cutOneNode(t *testing.T, f *fleet, cuts int, patience time.Duration) (v *verdict, dropped int, stuck []string) {
	t.Helper()
	f.addWorker(t)
	f.addFrontend(t)
	h := newHistory()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Go(func() { client(ctx, h, fmt.Sprint("c", c), f.apiURLs, 45*time.Second) })
	}
	waitAcked(h, 6, 60*time.Second)
	for i := range cuts {
		name := fmt.Sprintf("power cut %d of the node", i+1)
		h.open(name)
		waitUnsynced(f.nodes[0], 10*time.Second)
		start := time.Now()
		n := f.down(0, cutPower)
		dropped += n
		time.Sleep(time.Second)
		f.up(t, 0)
		up := time.Now()
		if err := tryProbe(f, patience); err != nil {
			stuck = append(stuck, fmt.Sprintf("after %s: %v", name, err))
		}
		t.Logf("%s: %d unsynced writes dropped; back in %s, new jobs run %s after", name, n, up.Sub(start).Round(time.Millisecond), time.Since(up).Round(time.Millisecond))
		time.Sleep(2 * time.Second)
	}
	h.open("after the cuts")
	time.Sleep(2 * time.Second)
	cancel()
	wg.Wait()
	recs := readAll(h, f.apiURLs(), patience+patience/2)
	counter, err := readCounter(f)
	return check(h, recs, counter, err), dropped, stuck
}

// waitUnsynced waits up to limit until n's file system holds unsynced
// writes.
func waitUnsynced(n *node, limit time.Duration) {
	n.mu.Lock()
	fs := n.fs
	n.mu.Unlock()
	for deadline := time.Now().Add(limit); fs != nil && fs.Unsynced() == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Microsecond)
	}
}
