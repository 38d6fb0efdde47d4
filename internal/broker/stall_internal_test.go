package broker

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestStallReportsAsReceived: what arrives on the stall subject is checked
// where it is received. Oversized, undecodable or anonymous reports are
// dropped; at most 16 nodes are kept; a node's report that it replaces its
// copy stands against its later reports; and the replicas count as having
// waited only when each reported lately, for the same group, as long as the
// repair delay.
func TestStallReportsAsReceived(t *testing.T) {
	w := &stallWatch{after: time.Minute, reports: map[string]heard{}}
	send := func(v any) {
		data, ok := v.([]byte)
		if !ok {
			data, _ = json.Marshal(v)
		}
		w.hear(&nats.Msg{Data: data})
	}
	send([]byte(`{"node":"big","group":"g","stalled_for":60000000000,"pad":"` + strings.Repeat("x", 5000) + `"}`))
	send([]byte(`not json`))
	send(stallReport{Group: "g", For: time.Hour})
	send(stallReport{Node: "n", For: time.Hour})
	if len(w.reports) != 0 {
		t.Fatalf("hostile reports kept: %+v", w.reports)
	}
	for i := range 20 {
		send(stallReport{Node: fmt.Sprint("node", i), Group: "g", For: time.Hour})
	}
	if len(w.reports) != 16 {
		t.Fatalf("%d nodes kept, want at most 16", len(w.reports))
	}

	w.reports = map[string]heard{}
	st := &stalled{Group: "g", Peers: []string{"a", "b"}}
	now := time.Now()
	send(stallReport{Node: "a", Group: "g", For: 2 * time.Minute})
	if w.peersWaited(st, now) {
		t.Fatal("counted as waited with one of two peers heard")
	}
	send(stallReport{Node: "b", Group: "other", For: 2 * time.Minute})
	if w.peersWaited(st, now) {
		t.Fatal("counted a report of another group")
	}
	send(stallReport{Node: "b", Group: "g", For: 30 * time.Second})
	if w.peersWaited(st, now) {
		t.Fatal("counted a peer that waited less than the repair delay")
	}
	send(stallReport{Node: "b", Group: "g", For: time.Minute})
	if !w.peersWaited(st, now) {
		t.Fatal("every peer waited the delay, lately: not counted")
	}
	if w.peersWaited(st, now.Add(stallReportFresh+time.Second)) {
		t.Fatal("counted reports older than stallReportFresh")
	}

	if w.peerReplacing("g") {
		t.Fatal("a replacement no peer announced")
	}
	send(stallReport{Node: "a", Group: "g", Replacing: true})
	send(stallReport{Node: "a", Group: "g", For: time.Second})
	if !w.peerReplacing("g") || w.peerReplacing("other") {
		t.Fatal("a peer's announced replacement did not stand, or stood for another group")
	}
}

// TestSetAside: the stalled stream's files move under one directory of the
// JetStream directory, keeping their paths; files already gone are
// skipped; a path outside it is refused, and nothing outside it is moved.
func TestSetAside(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "jetstream", "$G", "streams", "MCPEXEC_JOBS")
	group := filepath.Join(dir, "jetstream", "$SYS", "_js_", "S-R3F-x")
	for _, d := range []string{store, group} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "f"), []byte("data"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	aside, err := setAside(dir, []string{store, group, filepath.Join(dir, "jetstream", "gone")})
	if filepath.Dir(aside) != dir {
		t.Fatalf("set aside in %s, want a directory of %s (the same file system)", aside, dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{store, group} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s is still in place: %v", d, err)
		}
		rel, _ := filepath.Rel(dir, d)
		if b, err := os.ReadFile(filepath.Join(aside, rel, "f")); err != nil || string(b) != "data" {
			t.Errorf("%s set aside: %q %v", rel, b, err)
		}
	}
	outside := t.TempDir()
	if _, err := setAside(dir, []string{outside}); err == nil || !strings.Contains(err.Error(), "not under the JetStream directory") {
		t.Fatalf("a path outside the data dir: %v", err)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatalf("the path outside was moved: %v", err)
	}
}

// The copies setAside makes are kept a week, the newest whatever its age;
// nothing else in the JetStream directory is touched.
func TestPruneAside(t *testing.T) {
	dir := t.TempDir()
	now := time.Unix(2_000_000_000, 0)
	made := func(dir, name string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Join(p, "jetstream", "$G"), 0o700); err != nil {
			t.Fatal(err)
		}
		return p
	}
	age := func(d time.Duration) string { return fmt.Sprintf("stalled-%d", now.Add(-d).Unix()) }
	young := made(dir, age(24*time.Hour))    // within the week, and the newest
	old := made(dir, age(8*24*time.Hour))    // past the week
	older := made(dir, age(30*24*time.Hour)) // past the week
	other := made(dir, "$G")                 // an account's directory
	odd := made(dir, "stalled-notatime")     // not a copy's name
	removed, err := pruneAside(dir, now)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{old, older}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	for _, p := range []string{young, other, odd} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
	// Only old copies left: the newest of them stays.
	dir2 := t.TempDir()
	a, b := made(dir2, age(9*24*time.Hour)), made(dir2, age(20*24*time.Hour))
	if removed, err := pruneAside(dir2, now); err != nil || !slices.Equal(removed, []string{b}) {
		t.Fatalf("removed %v (%v), want only %s", removed, err, b)
	}
	if _, err := os.Stat(a); err != nil {
		t.Fatalf("the newest copy was removed: %v", err)
	}
	if removed, err := pruneAside(filepath.Join(dir2, "missing"), now); err != nil || removed != nil {
		t.Fatalf("a missing directory: %v %v", removed, err)
	}
}
