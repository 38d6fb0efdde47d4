package boltstore_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/state/boltstore"
)

func auditIn(ns, job, tool string, seq uint64, at time.Time) state.AuditIn {
	e := audit.Entry{ID: fmt.Sprint(seq), JobID: job, Namespace: ns, Server: "ts", Tool: tool, Decision: audit.DecisionAllow, At: at}
	data, _ := json.Marshal(e)
	return state.AuditIn{Namespace: ns, JobID: job, At: at, Seq: seq, Data: data}
}

// TestAuditChains: entries are chained per namespace, listed newest first
// with filters and cursors within their namespace only, pruned from the
// start of each chain, and the file verifies before and after.
func TestAuditChains(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	old, now := time.Now().Add(-48*time.Hour), time.Now()
	var in []state.AuditIn
	for i := range 30 {
		at := now
		if i < 10 {
			at = old
		}
		ns := "a"
		if i%3 == 0 {
			ns = "b"
		}
		tool := "echo"
		if i%2 == 0 {
			tool = "add"
		}
		in = append(in, auditIn(ns, fmt.Sprintf("job%d", i%4), tool, uint64(i+1), at))
	}
	if err := s.ApplyAudit(in[:15], 15); err != nil {
		t.Fatal(err)
	}
	if err := s.ApplyAudit(in[15:], 30); err != nil {
		t.Fatal(err)
	}
	if seq, err := s.AuditApplied(); err != nil || seq != 30 {
		t.Fatalf("applied %d %v", seq, err)
	}
	list := func(f state.AuditFilter) []audit.Entry {
		t.Helper()
		var out []audit.Entry
		for pages := 0; ; pages++ {
			recs, next, err := s.AuditList(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				var e audit.Entry
				_ = json.Unmarshal(r.Entry, &e)
				out = append(out, e)
			}
			if next == "" {
				return out
			}
			if pages > 100 {
				t.Fatal("cursor never ends")
			}
			f.Cursor = next
		}
	}
	all := list(state.AuditFilter{Namespace: "a", Limit: 3})
	if len(all) != 20 || all[0].ID != "30" || all[19].ID != "2" {
		t.Fatalf("namespace a: %d entries, first %+v", len(all), all[0])
	}
	for _, e := range all {
		if e.Namespace != "a" {
			t.Fatalf("namespace a listed %+v", e)
		}
	}
	byJob := list(state.AuditFilter{Namespace: "a", Job: "job1", Tool: "echo", Limit: 2})
	for _, e := range byJob {
		if e.JobID != "job1" || e.Tool != "echo" || e.Namespace != "a" {
			t.Fatalf("job filter listed %+v", e)
		}
	}
	if len(byJob) == 0 {
		t.Fatal("job filter listed nothing")
	}
	if got := list(state.AuditFilter{Namespace: "c"}); len(got) != 0 {
		t.Fatalf("namespace c: %v", got)
	}
	if _, _, err := s.AuditList(state.AuditFilter{Namespace: "a", Cursor: "x"}); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("bad cursor: %v", err)
	}
	n, err := s.PruneAudit(now.Add(-time.Hour))
	if err != nil || n != 10 {
		t.Fatalf("pruned %d %v", n, err)
	}
	if got := list(state.AuditFilter{Namespace: "a"}); len(got) != 20-6 {
		t.Fatalf("after pruning: %d", len(got))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	chains, err := boltstore.VerifyAudit(path)
	if err != nil || len(chains) != 2 || chains[0].Entries+chains[1].Entries != 20 {
		t.Fatalf("verify: %+v %v", chains, err)
	}
}

// TestVerifyAuditNamesTheEditedEntry edits, removes and rehashes entries of
// a state file as someone with the disk would, and checks verify names the
// first broken one each time.
func TestVerifyAuditNamesTheEditedEntry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		edit func(chain *bolt.Bucket)
		want uint64
	}{
		{"altered", func(chain *bolt.Bucket) {
			k := binary.BigEndian.AppendUint64(nil, 4)
			chain.Put(k, []byte(strings.Replace(string(chain.Get(k)), `"tool":"echo"`, `"tool":"search"`, 1))) //nolint:errcheck // checked by verify
		}, 4},
		{"removed", func(chain *bolt.Bucket) { chain.Delete(binary.BigEndian.AppendUint64(nil, 3)) }, 3},      //nolint:errcheck // checked by verify
		{"removed last", func(chain *bolt.Bucket) { chain.Delete(binary.BigEndian.AppendUint64(nil, 6)) }, 6}, //nolint:errcheck // checked by verify
		{"rehashed", func(chain *bolt.Bucket) {
			k := binary.BigEndian.AppendUint64(nil, 2)
			var r audit.Record
			_ = json.Unmarshal(chain.Get(k), &r)
			r.Entry = json.RawMessage(strings.Replace(string(r.Entry), `"echo"`, `"search"`, 1))
			r.Hash = audit.Link(r.Prev, r.Index, r.Seq, r.Entry)
			data, _ := json.Marshal(r)
			chain.Put(k, data) //nolint:errcheck // checked by verify
		}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "state.db")
			s, err := boltstore.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			var in []state.AuditIn
			for i := range 6 {
				in = append(in, auditIn("a", "j", "echo", uint64(i+1), time.Now()))
			}
			if err := s.ApplyAudit(in, 6); err != nil {
				t.Fatal(err)
			}
			_ = s.Close()
			if _, err := boltstore.VerifyAudit(path); err != nil {
				t.Fatalf("before the edit: %v", err)
			}
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(func(tx *bolt.Tx) error {
				tc.edit(tx.Bucket([]byte("audit")).Bucket([]byte("na")))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			_ = db.Close()
			_, err = boltstore.VerifyAudit(path)
			var broken *audit.BrokenError
			if !errors.As(err, &broken) || broken.Index != tc.want || broken.Namespace != "a" {
				t.Fatalf("verify = %v, want entry %d named", err, tc.want)
			}
			t.Log(err)
		})
	}
}
