package sandbox

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// box is a fake sandbox: a number, and whether it may be reused.
type box struct {
	n     int
	reuse bool
}

type fakeSandboxes struct {
	mu        sync.Mutex
	started   int
	discarded []int
	inDrive   chan struct{} // when set, Drive signals it and waits for release
	release   chan struct{}
}

func (f *fakeSandboxes) sessions() *Sessions[*box] {
	return &Sessions[*box]{
		Start: func(context.Context) (*box, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.started++
			return &box{n: f.started, reuse: true}, nil
		},
		Drive: func(_ context.Context, b *box, job Job, _ Host) (Result, error) {
			if f.inDrive != nil {
				f.inDrive <- struct{}{}
				<-f.release
			}
			if job.Code == "break" {
				b.reuse = false
			}
			return Result{Status: StatusSuccess, Stdout: job.Code}, nil
		},
		Reusable:  func(b *box) bool { return b.reuse },
		Discard:   func(b *box) { f.mu.Lock(); f.discarded = append(f.discarded, b.n); f.mu.Unlock() },
		ErrClosed: errors.New("closed"),
	}
}

func (f *fakeSandboxes) counts() (int, []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started, append([]int(nil), f.discarded...)
}

func TestSessionsReuseAndEnd(t *testing.T) {
	f := &fakeSandboxes{}
	s := f.sessions()
	ctx := context.Background()
	run := func(code string) {
		t.Helper()
		if _, err := s.Run(ctx, "k", Job{Code: code}, nil); err != nil {
			t.Fatal(err)
		}
	}
	run("a")
	run("b")
	if started, disc := f.counts(); started != 1 || len(disc) != 0 || !s.Has("k") {
		t.Fatalf("two jobs: started %d discarded %v has %v, want one sandbox kept", started, disc, s.Has("k"))
	}
	run("break") // the sandbox cannot be reused: the session ends with it
	if started, disc := f.counts(); started != 1 || len(disc) != 1 || s.Has("k") {
		t.Fatalf("after a broken job: started %d discarded %v has %v", started, disc, s.Has("k"))
	}
	run("c") // starts afresh
	s.End("k")
	if started, disc := f.counts(); started != 2 || len(disc) != 2 || s.Has("k") {
		t.Fatalf("after End: started %d discarded %v", started, disc)
	}
}

func TestSessionsEndWhileRunning(t *testing.T) {
	f := &fakeSandboxes{inDrive: make(chan struct{}), release: make(chan struct{})}
	s := f.sessions()
	done := make(chan error, 1)
	go func() {
		_, err := s.Run(context.Background(), "k", Job{Code: "x"}, nil)
		done <- err
	}()
	<-f.inDrive
	s.End("k")
	if _, disc := f.counts(); len(disc) != 0 {
		t.Fatalf("a running sandbox was discarded by End: %v", disc)
	}
	close(f.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, disc := f.counts(); len(disc) != 1 {
		t.Fatalf("the running job's sandbox was not discarded after it: %v", disc)
	}
	s.Close()
	if _, err := s.Run(context.Background(), "k", Job{}, nil); err == nil || err.Error() != "closed" {
		t.Fatalf("Run after Close: %v", err)
	}
}
