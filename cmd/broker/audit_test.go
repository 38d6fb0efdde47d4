package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	bolt "go.etcd.io/bbolt"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/auditlog"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestAuditVerifyNamesTheEditedEntry: a broker keeps entries a front-end's
// writer published; `broker audit verify` finds its chain whole, and after
// one entry of the stopped broker's file is edited, names that entry and
// exits 1.
func TestAuditVerifyNamesTheEditedEntry(t *testing.T) {
	dir := t.TempDir()
	b := testutil.Broker(t, dir, queue.DefaultConfig())
	nc := testutil.Connect(t, b, "frontend")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	key, err := queue.ProxyKey(ctx, js, jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := auditlog.New(nc, auditlog.Config{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	w.Start(key)
	for i := range 5 {
		w.Record(auditlog.Call{Entry: audit.Entry{JobID: jobs.ScopedID("ns", "j"), Attempt: 1, Namespace: "ns", Server: "github",
			Tool:     []string{"search_issues", "get_issue", "delete_repository", "search_issues", "get_issue"}[i],
			Decision: audit.DecisionAllow, DecidedBy: audit.DecidedByPolicy, Outcome: audit.OutcomeOK, At: time.Now().UTC()},
			Args: map[string]any{"q": i}})
	}
	w.Stop()
	sc := state.NewClient(nc, jobs.Subjects{})
	for {
		recs, _, err := sc.AuditList(ctx, state.AuditFilter{Namespace: "ns"})
		if err == nil && len(recs) == 5 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("entries never kept: %d %v", len(recs), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	nc.Close()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if err := auditCmd([]string{"verify", "--data", dir}, &out, &errb); err != nil {
		t.Fatalf("verify the untouched file: %v (%s)", err, errb.String())
	}
	if !strings.Contains(out.String(), `namespace "ns": entries 1-5 hold`) {
		t.Fatalf("output %q", out.String())
	}
	// Someone with the disk hides that the repository was deleted.
	db, err := bolt.Open(filepath.Join(dir, "state.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		chain := tx.Bucket([]byte("audit")).Bucket([]byte("nns"))
		k := binary.BigEndian.AppendUint64(nil, 3)
		edited := strings.Replace(string(chain.Get(k)), `"tool":"delete_repository"`, `"tool":"search_issues"`, 1)
		if edited == string(chain.Get(k)) {
			t.Fatalf("entry 3 is not the deletion: %s", chain.Get(k))
		}
		return chain.Put(k, []byte(edited))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = auditCmd([]string{"verify", "--json", "--file", filepath.Join(dir, "state.db")}, &out, &errb)
	if cli.ExitCode(err) != cli.ExitFailure || !strings.Contains(err.Error(), `namespace "ns" broken at entry 3`) {
		t.Fatalf("verify the edited file: %v", err)
	}
	var report struct {
		Broken *audit.BrokenError `json:"broken"`
	}
	if json.Unmarshal(out.Bytes(), &report) != nil || report.Broken == nil || report.Broken.Index != 3 {
		t.Fatalf("JSON report %s", out.String())
	}
	if err := auditCmd([]string{"check"}, &out, &errb); cli.ExitCode(err) != cli.ExitUsage {
		t.Fatalf("unknown audit command: %v", err)
	}
}
