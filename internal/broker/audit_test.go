package broker_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/auditlog"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestAuditChainsAgreeAcrossNodes: every broker node of a cluster keeps
// the audit trail, and folds the same stream into the same chains: each
// entry has the same index and hash on every node, so chain heads can be
// compared across nodes.
func TestAuditChainsAgreeAcrossNodes(t *testing.T) {
	t.Parallel()
	c := testutil.StartCluster(t, 3, queue.DefaultConfig())
	nc := c.ConnectAll(t, "frontend")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(nc)
	key, err := queue.ProxyKey(ctx, js, jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := auditlog.New(nc, auditlog.Config{Logger: testutil.Logger(t), Linger: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w.Start(key)
	const n = 40
	for i := range n {
		ns := []string{"a", "b"}[i%2]
		w.Record(auditlog.Call{Entry: audit.Entry{JobID: jobs.ScopedID(ns, "j"), Namespace: ns, Server: "ts", Tool: fmt.Sprint("t", i),
			Decision: audit.DecisionAllow, At: time.Now().UTC()}, Args: map[string]any{"i": i}})
	}
	w.Stop()
	if w.Written() != n {
		t.Fatalf("written %d of %d (dropped %d)", w.Written(), n, w.Dropped())
	}
	chains := func(node int) []audit.Record {
		var all []audit.Record
		for _, ns := range []string{"a", "b"} {
			recs, _, err := c.Nodes[node].Store().AuditList(state.AuditFilter{Namespace: ns, Limit: n})
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, recs...)
		}
		return all
	}
	var first []audit.Record
	for node := range c.Nodes {
		var got []audit.Record
		for got = chains(node); len(got) < n; got = chains(node) {
			if ctx.Err() != nil {
				t.Fatalf("node %d holds %d of %d entries", node, len(got), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if node == 0 {
			first = got
			continue
		}
		if !slices.EqualFunc(first, got, func(x, y audit.Record) bool {
			return x.Index == y.Index && x.Hash == y.Hash && x.Prev == y.Prev && string(x.Entry) == string(y.Entry)
		}) {
			t.Fatalf("node %d's chains differ from node 0's", node)
		}
	}
}
