package broker_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
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
		{Name: "AUDIT", Files: []string{"/js/$G/streams/AUDIT"}},
		{Name: "MCPEXEC_JOBS", Files: []string{"/js/$G/streams/MCPEXEC_JOBS", "/js/$SYS/_js_/S-R3F-jobs", "/js/$SYS/_js_/C-R3F-w"}},
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
