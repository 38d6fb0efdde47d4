package broker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestLeaderless: a replicated stream whose Raft group knows no leader is
// listed, with its store and the Raft logs of it and its consumers; one
// with a leader, and one not replicated, are not.
func TestLeaderless(t *testing.T) {
	peer := []*server.PeerInfo{{Name: "node1"}}
	info := &server.JSInfo{AccountDetails: []*server.AccountDetail{{Name: "$G", Streams: []server.StreamDetail{
		{Name: "MCPEXEC_JOBS", Cluster: &server.ClusterInfo{Replicas: peer}, RaftGroup: "S-R3F-jobs",
			ConsumerRaftGroups: []*server.RaftGroupDetail{{Name: "workers-default", RaftGroup: "C-R3F-w"}}},
		{Name: "MCPEXEC_EVENTS", Cluster: &server.ClusterInfo{Leader: "node0", Replicas: peer}},
		{Name: "SINGLE", Cluster: &server.ClusterInfo{Leader: "node0"}},
		{Name: "LOCAL"},
	}}, {Name: "$G", Streams: []server.StreamDetail{{Name: "AUDIT", Cluster: &server.ClusterInfo{Replicas: peer}}}}}}
	want := []broker.Stalled{
		{Name: "AUDIT", Account: "$G", Peers: []string{"node1"}, Files: []string{"/js/$G/streams/AUDIT"}},
		{Name: "MCPEXEC_JOBS", Account: "$G", Group: "S-R3F-jobs", Peers: []string{"node1"}, Files: []string{"/js/$G/streams/MCPEXEC_JOBS", "/js/$SYS/_js_/S-R3F-jobs", "/js/$SYS/_js_/C-R3F-w"}},
	}
	if got := broker.Leaderless(info, "/js"); !reflect.DeepEqual(got, want) {
		t.Fatalf("leaderless streams\n got %+v\nwant %+v", got, want)
	}
}

// TestStalledStreams, on a real cluster: no stream is called stalled while
// each has a leader, nor while a node is away (its streams wait for it, or
// for an election, and the start-up error must say to start it).
func TestStalledStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	t.Parallel()
	c := testutil.StartCluster(t, 3, queue.DefaultConfig())
	for i, n := range c.Nodes {
		if s := n.StalledStreams(); len(s) > 0 {
			t.Errorf("node %d with every stream led calls %v stalled", i, s)
		}
	}
	c.Kill(1)
	c.Kill(2)
	deadline := time.Now().Add(30 * time.Second)
	for len(c.Nodes[0].LeaderlessHere()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("node 0 alone still sees a leader for every stream after 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if s := c.Nodes[0].StalledStreams(); len(s) > 0 {
		t.Errorf("node 0 alone (streams %v without a quorum) calls %v stalled", c.Nodes[0].LeaderlessHere(), s)
	}
}

// TestStalledJobsStreamReplaced makes the stall of "A stream no replica will
// lead" on purpose and checks that the brokers get out of it alone, losing
// no job: a worker of pool "later" runs 30 jobs and stops (the pool's
// consumer has delivered up to sequence 30); 20 more jobs are queued; every
// node is stopped (each snapshots the jobs stream, listing the 20); each
// node's store of the stream is removed, which leaves it behind its
// snapshot as the power cut did. Started again, every replica waits for a
// leader none will become; after the repair delay each node sets its copy
// aside (kept under its JetStream directory) and starts, the stream comes
// back empty, the worker's consumer, which kept its position in the old
// stream, is made again, and the state replicas queue the 20 jobs again:
// the worker, started again, then runs each of them, once.
func TestStalledJobsStreamReplaced(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	t.Parallel()
	const warm, n = 30, 20
	c := testutil.StartCluster(t, 3, queue.DefaultConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fnc := c.ConnectAll(t, "fe")
	testutil.AnnouncePool(t, fnc, "later")
	fe := testutil.FrontendOn(t, fnc, "fe")
	wcfg := worker.DefaultConfig("w1")
	wcfg.Pool = "later"
	w1 := testutil.WorkerOn(t, c.ConnectAll(t, "w1"), testutil.NewFakeRuntime(warm), wcfg)
	var before []*jobs.Job
	for i := range warm {
		before = append(before, &jobs.Job{ID: fmt.Sprint("warm", i), Code: "hi", Pool: "later"})
	}
	submitAll(ctx, t, fe, before)
	waitSuccess(ctx, t, fe, before)
	w1.Stop()
	var js []*jobs.Job
	for i := range n {
		js = append(js, &jobs.Job{ID: fmt.Sprint("j", i), Code: "hi", Pool: "later"})
	}
	submitAll(ctx, t, fe, js)
	for i := range c.Nodes {
		c.Kill(i)
	}
	stream := jobs.Subjects{}.JobsStream()
	for i := range c.Nodes {
		msgs := filepath.Join(c.DataDir(i), "jetstream", "jetstream", "$G", "streams", stream, "msgs")
		if err := os.RemoveAll(msgs); err != nil {
			t.Fatal(err)
		}
	}
	// Node 0 decides first; the others when they hear it, a few seconds
	// later, as in the fault suite: meanwhile the consumers' Raft groups
	// on the nodes not yet replaced catch node 0's fresh ones up with the
	// old stream's positions.
	if errs := c.RestartAll(t, 2*time.Minute, func(i int, cfg *broker.Config) {
		cfg.StallRepair = 2 * time.Second
		if i > 0 {
			cfg.StallRepair = time.Minute
		}
	}); errors.Join(errs...) != nil {
		t.Fatalf("restart: %v", errs)
	}
	for i := range c.Nodes {
		aside, _ := filepath.Glob(filepath.Join(c.DataDir(i), "jetstream", "stalled-*", "jetstream", "$G", "streams", stream))
		if len(aside) != 1 {
			t.Errorf("node %d set no copy of %s aside: the stall was not made, or not repaired", i, stream)
		}
	}
	// The same worker again: its consumer is the one that delivered the
	// 30 (a worker's consumer outlives a power cut of the brokers).
	rt := testutil.NewFakeRuntime(n)
	testutil.WorkerOn(t, c.ConnectAll(t, "w1 again"), rt, wcfg)
	waitSuccess(ctx, t, fe, js)
	if got := rt.Runs(); got != n {
		t.Fatalf("%d runs of %d requeued jobs, want one each", got, n)
	}
}

func submitAll(ctx context.Context, t *testing.T, fe *frontend.Frontend, js []*jobs.Job) {
	t.Helper()
	for i, s := range fe.SubmitMany(ctx, js, "a") {
		if s.Err != nil {
			t.Fatalf("submit %s: %v", js[i].ID, s.Err)
		}
	}
}

// waitSuccess waits until every job of js is recorded success.
func waitSuccess(ctx context.Context, t *testing.T, fe *frontend.Frontend, js []*jobs.Job) {
	t.Helper()
	for _, j := range js {
		for {
			rec, err := fe.Get(ctx, "a", j.ID)
			if err == nil && rec.Status == jobs.StatusSuccess {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("job %s: %+v %v", j.ID, rec, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
