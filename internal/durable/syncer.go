package durable

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
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
	dirs := func() []string {
		found, _ := filepath.Glob(filepath.Join(s.dir, "*", "streams", name, "msgs"))
		return found
	}
	if len(dirs()) == 0 || len(s.streams) >= maxStreams {
		return nil
	}
	sc := &scope{dirs: dirs, synced: map[string]stamp{}}
	s.streams[name] = sc
	return sc
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
	since := s.since
	seen := map[string]stamp{}
	var firstErr error
	var err error
	for _, dir := range s.dirs() {
		err = errors.Join(err, s.walk(dir, since, seen, &firstErr))
	}
	if err = errors.Join(err, firstErr); err != nil {
		return fmt.Errorf("sync %v: %w", s.dirs(), err)
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

// walk fsyncs what under dir changed since, and is not as synced says,
// noting what it synced in seen and its first failure in firstErr.
func (s *scope) walk(dir string, since time.Time, seen map[string]stamp, firstErr *error) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed as we walked: nothing to sync
			}
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if info.ModTime().Before(since) {
			return nil
		}
		st := stamp{size: info.Size(), mtime: info.ModTime().UnixNano()}
		if sys, ok := info.Sys().(*syscall.Stat_t); ok {
			st.ino = sys.Ino
		}
		if s.synced[path] == st {
			return nil
		}
		switch err := syncPath(path, d.IsDir()); {
		case err == nil:
			seen[path] = st
		case *firstErr == nil:
			*firstErr = err
		}
		return nil
	})
}

// syncPath fsyncs a file (opened for writing: some file systems sync a
// file's data only through a handle that may write it) or a directory.
func syncPath(path string, dir bool) error {
	flag := os.O_WRONLY
	if dir {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	err = f.Sync()
	return errors.Join(err, f.Close())
}
