package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

func TestParseSyncPolicy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want broker.SyncPolicy
		err  string
	}{
		{"always", broker.SyncPolicy{}, ""},
		{"interval:2m", broker.SyncPolicy{Interval: 2 * time.Minute}, ""},
		{"interval:250ms", broker.SyncPolicy{Interval: 250 * time.Millisecond}, ""},
		{"interval:0s", broker.SyncPolicy{}, "positive duration"},
		{"interval:-1s", broker.SyncPolicy{}, "positive duration"},
		{"interval:soon", broker.SyncPolicy{}, "positive duration"},
		{"interval:", broker.SyncPolicy{}, "positive duration"},
		{"sometimes", broker.SyncPolicy{}, "want always or interval:D"},
		{"", broker.SyncPolicy{}, "want always or interval:D"},
		{"Always", broker.SyncPolicy{}, "want always or interval:D"},
	} {
		got, err := broker.ParseSyncPolicy(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want one saying %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v %v, want %+v", tc.in, got, err, tc.want)
		}
		// String reads back as the same policy.
		if back, err := broker.ParseSyncPolicy(got.String()); err != nil || back != got {
			t.Errorf("%q: String %q reads back as %+v %v", tc.in, got.String(), back, err)
		}
	}
	if s := (broker.SyncPolicy{}).String(); s != "always" {
		t.Errorf("zero policy is %q, want always", s)
	}
}

// TestSyncPolicyReachesJetStream: the server's JetStream runs with the
// broker's policy, and keeps it across a reload of the configuration
// (nats-server refuses a reload that changes SyncAlways or SyncInterval, so
// a Reload that lost the policy fails here). One broker under sync always
// keeps it with barriers: JetStream syncs every second in the background,
// and the broker's Barrier syncs its store; under an interval JetStream
// syncs on it and there is no barrier.
func TestSyncPolicyReachesJetStream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy   broker.SyncPolicy
		always   bool
		interval time.Duration
		barrier  bool
		mode     durable.Mode
	}{
		{broker.SyncPolicy{}, false, time.Second, true, durable.ModeBarrier},
		{broker.SyncPolicy{Interval: 5 * time.Second}, false, 5 * time.Second, false, durable.ModeInterval},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			t.Parallel()
			b, err := broker.Start(context.Background(), broker.Config{DataDir: t.TempDir(), Queue: queue.DefaultConfig(), Logger: testutil.Logger(t), Sync: tc.policy})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			check := func(when string) {
				t.Helper()
				jsc := b.Server().JetStreamConfig()
				if jsc.SyncAlways != tc.always || jsc.SyncInterval != tc.interval {
					t.Fatalf("%s: JetStream sync_always %v, sync_interval %s; want %v, %s", when, jsc.SyncAlways, jsc.SyncInterval, tc.always, tc.interval)
				}
			}
			check("at start")
			if err := b.Reload(); err != nil {
				t.Fatalf("reload: %v", err)
			}
			check("after a reload")
			if b.Sync() != tc.policy {
				t.Fatalf("Sync() %v, want %v", b.Sync(), tc.policy)
			}
			if got := b.Barrier() != durable.None; got != tc.barrier {
				t.Fatalf("barrier %v, want %v", got, tc.barrier)
			}
			// What the fleet's writers read: the state service's metadata.
			f := durable.NewFleet(testutil.ConnectInProcess(t, b, "check"), jobs.Subjects{}.StateService(), jobs.Subjects{}.SyncBarrier())
			if m := f.Mode(context.Background()); m != tc.mode {
				t.Fatalf("the fleet's mode %d, want %d", m, tc.mode)
			}
			if err := f.Sync(context.Background()); err != nil {
				t.Fatalf("a barrier: %v", err)
			}
		})
	}
}

// TestClusterSyncsEachWrite: the nodes of a cluster under sync always keep
// nats-server's sync of each write (a write is acknowledged once a majority
// stored it: each node's copy is synced by its own server), and answer
// barriers at once.
func TestClusterSyncsEachWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	t.Parallel()
	c := testutil.StartCluster(t, 3, queue.DefaultConfig())
	for _, n := range c.Nodes {
		jsc := n.Server().JetStreamConfig()
		if !jsc.SyncAlways || n.Barrier() != durable.None {
			t.Errorf("%s: sync_always %v, barrier %T; want true and none", n.Server().Name(), jsc.SyncAlways, n.Barrier())
		}
	}
	f := durable.NewFleet(c.ConnectAll(t, "check"), jobs.Subjects{}.StateService(), jobs.Subjects{}.SyncBarrier())
	if m := f.Mode(context.Background()); m != durable.ModeAlways {
		t.Errorf("the fleet's mode %d, want ModeAlways", m)
	}
	if err := durable.NewClient(c.ConnectAll(t, "check2"), jobs.Subjects{}.SyncBarrier()).Sync(context.Background()); err != nil {
		t.Errorf("a barrier of the cluster: %v", err)
	}
}
