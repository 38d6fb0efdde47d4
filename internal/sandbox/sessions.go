package sandbox

import (
	"context"
	"fmt"
	"sync"
)

// Sessions is a runtime's table of sessions: each session holds one sandbox of
// type T, started by its first job, that runs the session's jobs one at a time
// and is kept while they end cleanly. Runtimes supply how to start, drive and
// discard a sandbox; Sessions owns the bookkeeping so that every runtime ends,
// reuses and forgets sessions the same way.
type Sessions[T any] struct {
	// Start starts the sandbox of a session's first job.
	Start func(ctx context.Context) (T, error)
	// Drive runs one job in a sandbox.
	Drive func(ctx context.Context, t T, job Job, host Host) (Result, error)
	// Reusable reports whether a sandbox may run the session's next job.
	Reusable func(t T) bool
	// Discard destroys a sandbox that is no longer wanted.
	Discard func(t T)
	// ErrClosed is returned by Run after Close.
	ErrClosed error

	mu     sync.Mutex // guards m, closed
	m      map[string]*sessionSlot[T]
	closed bool
}

// sessionSlot is one session.
type sessionSlot[T any] struct {
	turn chan struct{} // holds a token while one of the session's jobs runs

	mu      sync.Mutex // guards t, has, running, ended
	t       T
	has     bool // t is a started sandbox
	running bool
	ended   bool
}

// Run runs job in session key's sandbox, starting it for the session's first
// job. A job that fails the sandbox (timeout, crash, protocol error) ends the
// session; the next job starts it afresh.
func (s *Sessions[T]) Run(ctx context.Context, key string, job Job, host Host) (Result, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return Result{}, s.ErrClosed
	}
	if s.m == nil {
		s.m = map[string]*sessionSlot[T]{}
	}
	sl := s.m[key]
	if sl == nil {
		sl = &sessionSlot[T]{turn: make(chan struct{}, 1)}
		s.m[key] = sl
	}
	s.mu.Unlock()

	select {
	case sl.turn <- struct{}{}:
	case <-ctx.Done():
		return Result{}, fmt.Errorf("wait for session %s: %w", key, context.Cause(ctx))
	}
	defer func() { <-sl.turn }()
	sl.mu.Lock()
	t, has, ended := sl.t, sl.has, sl.ended
	sl.running = !ended
	sl.mu.Unlock()
	if ended {
		return Result{Status: StatusError, ExitCode: -1,
			Error: fmt.Sprintf("session %s ended while this job waited for it: run the job again to start the session afresh", key)}, nil
	}
	if !has {
		var err error
		if t, err = s.Start(ctx); err != nil {
			s.forget(key, sl)
			return Result{}, err
		}
	}
	res, err := s.Drive(ctx, t, job, host)
	if err == nil && s.Reusable(t) {
		sl.mu.Lock()
		sl.running = false
		if !sl.ended {
			sl.t, sl.has = t, true
			sl.mu.Unlock()
			return res, nil
		}
		sl.mu.Unlock()
	}
	s.forget(key, sl)
	s.Discard(t)
	return res, err
}

// forget marks sl ended and removes it from the table.
func (s *Sessions[T]) forget(key string, sl *sessionSlot[T]) {
	var zero T
	sl.mu.Lock()
	sl.ended, sl.running, sl.has, sl.t = true, false, false, zero
	sl.mu.Unlock()
	s.mu.Lock()
	if s.m[key] == sl {
		delete(s.m, key)
	}
	s.mu.Unlock()
}

// Has reports whether session key exists and has not ended.
func (s *Sessions[T]) Has(key string) bool {
	s.mu.Lock()
	sl := s.m[key]
	s.mu.Unlock()
	if sl == nil {
		return false
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	return !sl.ended
}

// End ends session key. A job of the session that is running finishes first and
// its sandbox is discarded afterwards.
func (s *Sessions[T]) End(key string) {
	s.mu.Lock()
	sl := s.m[key]
	delete(s.m, key)
	s.mu.Unlock()
	if sl != nil {
		s.end(sl)
	}
}

// Close ends every session; Run fails with ErrClosed afterwards.
func (s *Sessions[T]) Close() {
	s.mu.Lock()
	s.closed = true
	m := s.m
	s.m = nil
	s.mu.Unlock()
	for _, sl := range m {
		s.end(sl)
	}
}

// end marks sl ended and discards its sandbox unless a job is running on it.
func (s *Sessions[T]) end(sl *sessionSlot[T]) {
	var zero T
	sl.mu.Lock()
	sl.ended = true
	t, idle := sl.t, sl.has && !sl.running
	if idle {
		sl.t, sl.has = zero, false
	}
	sl.mu.Unlock()
	if idle {
		s.Discard(t)
	}
}

// SessionMethods are SessionRuntime's session methods on a runtime's Sessions
// table: a runtime embeds it and sets Sessions, instead of writing each
// delegation itself.
type SessionMethods[T any] struct {
	Sessions *Sessions[T] // safe for concurrent use
}

// RunInSession implements SessionRuntime.
func (m SessionMethods[T]) RunInSession(ctx context.Context, key string, job Job, host Host) (Result, error) {
	return m.Sessions.Run(ctx, key, job, host)
}

// HasSession implements SessionRuntime.
func (m SessionMethods[T]) HasSession(key string) bool { return m.Sessions.Has(key) }

// EndSession implements SessionRuntime. A job of the session that is running
// finishes first; its sandbox is discarded afterwards.
func (m SessionMethods[T]) EndSession(key string) error {
	m.Sessions.End(key)
	return nil
}
