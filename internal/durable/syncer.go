package durable

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Syncer is the Barrier of a store directory on this machine: a pass
// fsyncs every file and directory under it changed since shortly before the
// previous pass began (their modification time says so), and concurrent
// callers share a pass. A pass scoped to one stream (SyncStream) walks and
// syncs only that stream's message files, which is all its writers need.
type Syncer struct {
	dir string
	all scope // the whole store

	mu      sync.Mutex // guards streams
	streams map[string]*scope
}

// scope is what one kind of pass covers and what it has seen.
type scope struct {
	g    group
	dirs func() []string // the directories it walks
	// Only the pass in flight touches these.
	since  time.Time
	synced map[string]stamp // what each file was when a pass synced it
}

// stamp is what a pass saw of a file: a file that still shows the same
// was not written since (nats-server appends to its files, and replaces
// rather than overwrites them: a write changes the size or the inode).
type stamp struct {
	ino   uint64
	size  int64
	mtime int64 // Unix nanoseconds
}

// NewSyncer returns the Syncer of dir, a JetStream store directory.
func NewSyncer(dir string) *Syncer {
	s := &Syncer{dir: dir, streams: map[string]*scope{}}
	s.all = scope{dirs: func() []string { return []string{dir} }, synced: map[string]stamp{}}
	return s
}

// maxStreams bounds the stream scopes a Syncer keeps.
const maxStreams = 256

// SyncStream returns once a pass over stream's message files (in every
// account) that began after the call has completed: the writes JetStream
// acknowledged to it before the call are on disk. A name that is not a
// stream of the store gets a pass over the whole store.
func (s *Syncer) SyncStream(ctx context.Context, stream string) error {
	sc := s.stream(stream)
	if sc == nil {
		return s.Sync(ctx)
	}
	return sc.g.wait(ctx, sc.pass)
}

// stream is the scope of stream, or nil when the store has no such stream.
func (s *Syncer) stream(name string) *scope {
	if !validStream(name) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sc := s.streams[name]; sc != nil {
		return sc
	}
	dirs := func() []string { return streamDirs(s.dir, name) }
	if len(dirs()) == 0 || len(s.streams) >= maxStreams {
		return nil
	}
	sc := &scope{dirs: dirs, synced: map[string]stamp{}}
	s.streams[name] = sc
	return sc
}

// streamDirs returns the message directories of stream name in each
// account of the store dir: a listing of dir and a status of each
// account's, in system calls (filepath.Glob would list every level).
func streamDirs(dir, name string) []string {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	accounts, err := readNames(fd)
	_ = unix.Close(fd) // read only: nothing to lose
	if err != nil {
		return nil
	}
	var found []string
	for _, acc := range accounts {
		msgs := filepath.Join(dir, acc, "streams", name, "msgs")
		var st unix.Stat_t
		if unix.Lstat(msgs, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			found = append(found, msgs)
		}
	}
	return found
}

// validStream reports whether name can be a JetStream stream's directory
// name (and no path): it comes from a request.
func validStream(name string) bool {
	if name == "" || len(name) > 255 {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// mtimeSlack is how far before a pass's start a change may be stamped and
// still be synced by the next pass: file systems stamp modification times
// from a coarse clock (a tick behind the real time).
const mtimeSlack = time.Second

// Sync returns once a pass over the whole store that began after the call
// has completed.
func (s *Syncer) Sync(ctx context.Context) error { return s.all.g.wait(ctx, s.all.pass) }

// pass fsyncs what changed under the scope's directories since its
// previous pass began (less mtimeSlack); the first pass fsyncs everything.
func (s *scope) pass() error {
	start := time.Now()
	since := int64(math.MinInt64) // the first pass (s.since is zero): everything
	if !s.since.IsZero() {
		since = s.since.UnixNano()
	}
	seen := map[string]stamp{}
	var firstErr error
	var err error
	dirs := s.dirs()
	for _, dir := range dirs {
		err = errors.Join(err, s.walk(dir, since, seen, &firstErr))
	}
	if err = errors.Join(err, firstErr); err != nil {
		return fmt.Errorf("sync %v: %w", dirs, err)
	}
	s.since = start.Add(-mtimeSlack)
	// Forget what was stamped before since: such files are skipped by
	// their time until they change again.
	for path, st := range s.synced {
		if st.mtime < s.since.UnixNano() {
			delete(s.synced, path)
		}
	}
	maps.Copy(s.synced, seen)
	return nil
}

// walk fsyncs what under dir changed since (Unix ns), and is not as synced says,
// noting what it synced in seen and its first failure in firstErr. It goes
// by system calls, not through os.File: a pass is on a writer's path, and
// a file opened through os (descriptor flags, the poller's try) costs
// several calls more, each dear in a virtual machine
// (BenchmarkSyncStream).
func (s *scope) walk(dir string, since int64, seen map[string]stamp, firstErr *error) error {
	var st unix.Stat_t
	switch err := unix.Lstat(dir, &st); {
	case errors.Is(err, unix.ENOENT):
		return nil // removed: nothing to sync
	case err != nil:
		return &fs.PathError{Op: "lstat", Path: dir, Err: err}
	}
	return s.visit(dir, &st, since, seen, firstErr)
}

// visit syncs path, whose status is st, if it changed since (Unix ns),
// and, for a directory, visits its entries.
func (s *scope) visit(path string, st *unix.Stat_t, since int64, seen map[string]stamp, firstErr *error) error {
	dir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	if !dir && st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	stp := stamp{ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano()}
	changed := stp.mtime >= since && s.synced[path] != stp
	if !dir {
		if changed {
			note(syncFile(path), path, stp, seen, firstErr)
		}
		return nil
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil // removed as we walked
	}
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer func() { _ = unix.Close(fd) }() // read only: nothing to lose
	names, err := readNames(fd)
	if err != nil {
		return &fs.PathError{Op: "readdirent", Path: path, Err: err}
	}
	if changed {
		err := unix.Fsync(fd)
		if err != nil {
			err = &fs.PathError{Op: "fsync", Path: path, Err: err}
		}
		note(err, path, stp, seen, firstErr)
	}
	for _, name := range names {
		child := filepath.Join(path, name)
		var cst unix.Stat_t
		switch err := unix.Fstatat(fd, name, &cst, unix.AT_SYMLINK_NOFOLLOW); {
		case errors.Is(err, unix.ENOENT):
			continue // removed as we walked
		case err != nil:
			return &fs.PathError{Op: "lstat", Path: child, Err: err}
		}
		if err := s.visit(child, &cst, since, seen, firstErr); err != nil {
			return err
		}
	}
	return nil
}

// note records the outcome of a sync of path: in seen if it succeeded, in
// firstErr if it is the pass's first failure.
func note(err error, path string, st stamp, seen map[string]stamp, firstErr *error) {
	switch {
	case err == nil:
		seen[path] = st
	case *firstErr == nil:
		*firstErr = err
	}
}

// readNames returns the names in the directory open on fd, sorted (as
// filepath.WalkDir visits them), without "." and "..".
func readNames(fd int) ([]string, error) {
	var names []string
	buf := make([]byte, 8<<10)
	for {
		n, err := unix.ReadDirent(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			slices.Sort(names)
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// syncFile fsyncs a file, opened for writing: some file systems sync a
// file's data only through a handle that may write it. A file removed
// meanwhile needs nothing.
func syncFile(path string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	err = unix.Fsync(fd)
	if err != nil {
		err = &fs.PathError{Op: "fsync", Path: path, Err: err}
	}
	if cerr := unix.Close(fd); cerr != nil && err == nil {
		err = &fs.PathError{Op: "close", Path: path, Err: cerr}
	}
	return err
}
