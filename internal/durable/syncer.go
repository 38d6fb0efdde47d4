package durable

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Syncer is the Barrier of a store directory on this machine: a pass
// fsyncs every file and directory under it changed since shortly before the
// previous pass began (their modification time says so), and concurrent
// callers share a pass.
type Syncer struct {
	dir string
	g   group
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

// NewSyncer returns the Syncer of dir.
func NewSyncer(dir string) *Syncer { return &Syncer{dir: dir, synced: map[string]stamp{}} }

// mtimeSlack is how far before a pass's start a change may be stamped and
// still be synced by the next pass: file systems stamp modification times
// from a coarse clock (a tick behind the real time).
const mtimeSlack = time.Second

// Sync returns once a pass that began after the call has completed.
func (s *Syncer) Sync(ctx context.Context) error { return s.g.wait(ctx, s.pass) }

// pass fsyncs what changed under dir since the previous pass began (less
// mtimeSlack); the first pass fsyncs everything.
func (s *Syncer) pass() error {
	start := time.Now()
	since := s.since
	seen := map[string]stamp{}
	var firstErr error
	err := filepath.WalkDir(s.dir, func(path string, d fs.DirEntry, err error) error {
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
		case firstErr == nil:
			firstErr = err
		}
		return nil
	})
	if err = errors.Join(err, firstErr); err != nil {
		return fmt.Errorf("sync %s: %w", s.dir, err)
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
