package lazyfs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/mcpexec/mcpexec/internal/faults/lazyfs"
)

// TestMain fails the package's tests when goroutines outlive them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mount mounts a lazy file system for the test; restart unmounts it and
// mounts it again on the same backing dir (the machine boots after a cut).
func mount(t *testing.T) (fs *lazyfs.FS, restart func() *lazyfs.FS) {
	t.Helper()
	if err := lazyfs.Available(); err != nil {
		t.Skipf("no power-loss harness: %v", err)
	}
	dir, backing := t.TempDir(), t.TempDir()
	fs, err := lazyfs.Mount(dir, backing)
	if err != nil {
		t.Fatal(err)
	}
	cur := fs
	t.Cleanup(func() {
		if err := cur.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return fs, func() *lazyfs.FS {
		t.Helper()
		if err := cur.Unmount(); err != nil {
			t.Fatal(err)
		}
		next, err := lazyfs.Mount(dir, backing)
		if err != nil {
			t.Fatal(err)
		}
		cur = next
		return next
	}
}

func write(t *testing.T, path string, data []byte, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestUnsyncedWriteLost: written, read back, not synced, power cut: gone.
func TestUnsyncedWriteLost(t *testing.T) {
	fs, restart := mount(t)
	path := filepath.Join(fs.Dir(), "f")
	write(t, path, []byte("kept "), true)
	write(t, path, []byte("lost"), false)
	if got := read(t, path); string(got) != "kept lost" {
		t.Fatalf("before the cut: %q, want %q (reads see unsynced writes)", got, "kept lost")
	}
	if st, err := os.Stat(path); err != nil || st.Size() != 9 {
		t.Fatalf("before the cut: size %v %v, want 9", st, err)
	}
	if n := fs.Cut(); n != 1 {
		t.Errorf("the cut dropped %d writes, want 1", n)
	}
	if _, err := os.ReadFile(path); err == nil {
		t.Error("a read after the cut succeeded: the machine is off")
	}
	fs = restart()
	if got := read(t, filepath.Join(fs.Dir(), "f")); string(got) != "kept " {
		t.Fatalf("after the cut: %q, want %q", got, "kept ")
	}
}

// TestSyncedWriteKept: written, synced, power cut: still there.
func TestSyncedWriteKept(t *testing.T) {
	fs, restart := mount(t)
	path := filepath.Join(fs.Dir(), "sub", "f")
	if err := os.Mkdir(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, path, []byte("one "), false)
	write(t, path, []byte("two"), true) // the sync covers the earlier write too
	fs.Cut()
	fs = restart()
	if got := read(t, filepath.Join(fs.Dir(), "sub", "f")); string(got) != "one two" {
		t.Fatalf("after the cut: %q, want %q", got, "one two")
	}
}

// TestOSyncWriteKept: a file opened with O_SYNC is synced by every write,
// as on a disk; nats-server writes its Raft term, vote, peers and snapshots
// so (write to a temporary file opened O_SYNC, then rename), and a harness
// that dropped them would fail the cluster for a reason no disk has.
func TestOSyncWriteKept(t *testing.T) {
	fs, restart := mount(t)
	path := filepath.Join(fs.Dir(), "tav.idx")
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_SYNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("term 7 vote n2")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	write(t, path+".plain", []byte("unsynced"), false)
	fs.Cut()
	fs = restart()
	if got := read(t, filepath.Join(fs.Dir(), "tav.idx")); string(got) != "term 7 vote n2" {
		t.Fatalf("after the cut: %q, want the O_SYNC write", got)
	}
	if got := read(t, filepath.Join(fs.Dir(), "tav.idx.plain")); len(got) != 0 {
		t.Fatalf("after the cut the plain write is %q, want it gone", got)
	}
}

// TestUnsyncedTruncateLost: a truncate not followed by a sync is undone, and
// a file created and never synced survives empty.
func TestUnsyncedTruncateLost(t *testing.T) {
	fs, restart := mount(t)
	path := filepath.Join(fs.Dir(), "f")
	write(t, path, []byte("0123456789"), true)
	if err := os.Truncate(path, 4); err != nil {
		t.Fatal(err)
	}
	write(t, path, []byte("XY"), false)
	if got := read(t, path); string(got) != "0123XY" {
		t.Fatalf("before the cut: %q, want 0123XY", got)
	}
	write(t, filepath.Join(fs.Dir(), "new"), []byte("data"), false)
	fs.Cut()
	fs = restart()
	if got := read(t, filepath.Join(fs.Dir(), "f")); string(got) != "0123456789" {
		t.Fatalf("after the cut: %q, want the synced 0123456789", got)
	}
	if got := read(t, filepath.Join(fs.Dir(), "new")); len(got) != 0 {
		t.Fatalf("a created, never synced file holds %q after the cut, want it empty", got)
	}
}

// TestFreezeKeepsUnsynced: a killed process (Freeze, Thaw) loses nothing it
// had written, synced or not; a sync after a rename keeps the data.
func TestFreezeKeepsUnsynced(t *testing.T) {
	fs, _ := mount(t)
	path := filepath.Join(fs.Dir(), "f")
	write(t, path, bytes.Repeat([]byte("a"), 100_000), false)
	fs.Freeze()
	if err := os.WriteFile(filepath.Join(fs.Dir(), "g"), []byte("x"), 0o600); err == nil {
		t.Error("a write while frozen succeeded")
	}
	fs.Thaw()
	if got := read(t, path); len(got) != 100_000 {
		t.Fatalf("after the kill: %d bytes, want 100000", len(got))
	}
	if err := os.Rename(path, path+".2"); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path+".2", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	_ = f.Close() // synced above
	if st, err := os.Stat(filepath.Join(fs.Backing(), "f.2")); err != nil || st.Size() != 100_000 {
		t.Fatalf("backing file after the sync: %v %v, want 100000 bytes", st, err)
	}
}
