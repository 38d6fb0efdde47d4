package faults_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// streamState is what node i's own store holds of stream (not the leader's
// answer: the node's replica).
func (f *fleet) streamState(i int, stream string) (server.StreamState, error) {
	b := f.nodes[i].broker()
	if b == nil {
		return server.StreamState{}, fmt.Errorf("node %d is down", i)
	}
	info, err := b.Server().Jsz(&server.JSzOptions{Streams: true, Accounts: true})
	if err != nil {
		return server.StreamState{}, err
	}
	for _, a := range info.AccountDetails {
		for _, s := range a.Streams {
			if s.Name == stream {
				return s.State, nil
			}
		}
	}
	return server.StreamState{}, fmt.Errorf("node %d holds no replica of %s", i, stream)
}

// storeDir is node i's JetStream directory (through its lazy file system),
// where nats-server keeps each account's streams and the Raft groups.
func (f *fleet) storeDir(i int) string {
	return filepath.Join(f.nodes[i].cfg.DataDir, "jetstream", "jetstream")
}

// msgsDir holds the message blocks of stream's store on node i.
func (f *fleet) msgsDir(i int, stream string) string {
	return filepath.Join(f.storeDir(i), "$G", "streams", stream, "msgs")
}

// blockFile is the first message block of stream on node i (through its
// lazy file system: the node must be down, killed).
func (f *fleet) blockFile(i int, stream string) string {
	return filepath.Join(f.msgsDir(i, stream), "1.blk")
}

// raftGroup is the name of stream's Raft group, as node i knows it.
func (f *fleet) raftGroup(t *testing.T, i int, stream string) string {
	t.Helper()
	info, err := f.nodes[i].broker().Server().Jsz(&server.JSzOptions{Streams: true, Accounts: true, RaftGroups: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range info.AccountDetails {
		for _, s := range a.Streams {
			if s.Name == stream && s.RaftGroup != "" {
				return s.RaftGroup
			}
		}
	}
	t.Fatalf("node %d knows no Raft group of %s", i, stream)
	return ""
}

// raftLogFile is the last block of Raft group's log on node i: the entries
// not yet folded into a snapshot (the node must be down, killed).
func (f *fleet) raftLogFile(t *testing.T, i int, group string) string {
	t.Helper()
	dir := filepath.Join(f.storeDir(i), "$SYS", "_js_", group, "msgs")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	last, lastN := "", -1
	for _, e := range entries {
		var n int
		if _, err := fmt.Sscanf(e.Name(), "%d.blk", &n); err == nil && n > lastN {
			last, lastN = e.Name(), n
		}
	}
	if last == "" {
		t.Fatalf("no log block in %s", dir)
	}
	return filepath.Join(dir, last)
}

// flipBit flips one bit of the file at off.
func flipBit(t *testing.T, path string, off int64) {
	t.Helper()
	fh, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fh.Close() }() // written and synced below
	b := make([]byte, 1)
	if _, err := fh.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := fh.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := fh.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedStreamFiles flips a bit in the middle of one node's events
// stream file, truncates another node's to half, and flips a bit in the
// third node's Raft log of that stream, while they are down (killed): restarted, each holds what the healthy majority holds, and
// leading the stream it serves every message as it was written. nats-server
// rebuilds a stream's store from its Raft log and the other replicas; this
// proves it does for mcpexec's streams, and that a damaged node neither
// serves nor leads with what it lost.
func TestDamagedStreamFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite")
	}
	f := startFleet(t, fleetOptions{})
	f.addWorker(t)
	f.addFrontend(t)
	for i := range 20 {
		status, body := apiDo("POST", f.apiURLs()[0]+"/api/jobs", map[string]any{"id": fmt.Sprint("d", i), "code": "print(1)"}, 10*time.Second)
		if status/100 != 2 {
			t.Fatalf("submit: %d %s", status, body)
		}
	}
	if err := tryProbe(f, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	stream := f.q.Subjects.EventsStream()
	want := f.messages(t, stream)
	t.Logf("the events stream holds %d messages", len(want))

	flip := func(t *testing.T, path string, size int64) { flipBit(t, path, size/2) }
	group := f.raftGroup(t, 0, stream)
	for _, tc := range []struct {
		name   string
		node   int
		file   func(t *testing.T, i int) string
		damage func(t *testing.T, path string, size int64)
	}{
		{"bit flip", 1, func(_ *testing.T, i int) string { return f.blockFile(i, stream) }, flip},
		{"truncation", 2, func(_ *testing.T, i int) string { return f.blockFile(i, stream) }, func(t *testing.T, path string, size int64) {
			if err := os.Truncate(path, size/2); err != nil {
				t.Fatal(err)
			}
		}},
		// The stream's Raft log, not its store: the entries since the last
		// snapshot, which a node replays at its start.
		{"raft log bit flip", 0, func(t *testing.T, i int) string { return f.raftLogFile(t, i, group) }, flip},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.down(tc.node, kill)
			path := tc.file(t, tc.node)
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			tc.damage(t, path, st.Size())
			t.Logf("node %d: %s of %s damaged (%d bytes)", tc.node, tc.name, filepath.Base(path), st.Size())
			f.up(t, tc.node)
			deadline := time.Now().Add(30 * time.Second)
			for {
				got, err := f.streamState(tc.node, stream)
				if err == nil && got.Msgs >= uint64(len(want)) && got.Lost == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("node %d holds %+v (lost %+v, %v) after the %s, the others %d messages", tc.node, got, got.Lost, err, tc.name, len(want))
				}
				time.Sleep(200 * time.Millisecond)
			}
			f.lead(t, stream, tc.node)
			got := f.messages(t, stream)
			for seq, w := range want {
				if g, ok := got[seq]; !ok || g != w {
					t.Errorf("node %d, leading, serves message %d as %.60q, written as %.60q", tc.node, seq, g, w)
				}
			}
		})
	}
}

// messages reads every message of stream from its leader.
func (f *fleet) messages(t *testing.T, stream string) map[uint64]string {
	t.Helper()
	nc := f.connect(t, "faults-reader", 0)
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64]string{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get message %d of %s: %v", seq, stream, err)
		}
		out[seq] = m.Subject + " " + string(m.Data)
	}
	return out
}

// lead makes node i the leader of stream.
func (f *fleet) lead(t *testing.T, stream string, i int) {
	t.Helper()
	nc := f.connect(t, "faults-leader", 0)
	defer nc.Close()
	req := fmt.Sprintf(`{"placement":{"preferred":%q}}`, f.nodes[i].cfg.ServerName)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if f.leader(stream) == i {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %d did not become the leader of %s", i, stream)
		}
		_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, []byte(req), 5*time.Second) // the next look says
		time.Sleep(time.Second)
	}
}
