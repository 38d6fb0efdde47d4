package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpexec/mcpexec/internal/proxy"
)

// MaxConcurrentCalls bounds the proxy calls one job may have in flight.
const MaxConcurrentCalls = 16

// RunnerConn is the host's end of one runner's connection.
type RunnerConn struct {
	conn   net.Conn
	r      *proxy.Reader
	frames chan readResult // filled by the reader goroutine started in Handshake
	done   chan struct{}   // closed by Close
	ended  chan struct{}   // closed when the reader goroutine returns
	once   sync.Once

	wmu sync.Mutex // guards w
	w   *proxy.Writer

	// reusable is true while the runner is idle after a clean done frame: no
	// protocol error, no timeout, no lost connection. Only then may the runner
	// take another job (sessions).
	reusable atomic.Bool
}

// Reusable reports whether the runner finished its last job cleanly and waits for
// the next: false after a timeout, a cancelled run, a protocol error or a lost
// connection, when the sandbox must be destroyed.
func (c *RunnerConn) Reusable() bool { return c.reusable.Load() }

// NewRunnerConn wraps a connection from a runner. maxFrame 0 means
// proxy.DefaultMaxFrame.
func NewRunnerConn(conn net.Conn, maxFrame int) *RunnerConn {
	return &RunnerConn{
		conn:   conn,
		r:      proxy.NewReader(conn, maxFrame),
		w:      proxy.NewWriter(conn, maxFrame),
		frames: make(chan readResult),
		done:   make(chan struct{}),
		ended:  make(chan struct{}),
	}
}

type readResult struct {
	f   *proxy.Frame
	err error
}

// Close closes the connection and ends its reader.
func (c *RunnerConn) Close() error {
	var err error
	c.once.Do(func() {
		close(c.done)
		err = c.conn.Close()
	})
	return err
}

// readLoop hands frames to Drive until the connection fails or is closed.
func (c *RunnerConn) readLoop() {
	defer close(c.ended)
	for {
		f, err := c.r.Read()
		select {
		case c.frames <- readResult{f, err}:
		case <-c.done:
			return
		}
		if err != nil {
			return
		}
	}
}

// Finish ends a runner without a signal: it closes the host's side of the
// connection for writing, which makes the runner exit by itself (its reader
// ends the process on EOF), and waits up to d for the runner's side to close,
// which happens when its process has ended. It reports whether that happened
// within d (false also when the connection had already failed for another
// reason); the connection is closed in any case. Frames the runner still sends
// are dropped. Call it only after Handshake succeeded and no Drive is running.
func (c *RunnerConn) Finish(d time.Duration) bool {
	defer c.Close()
	cw, ok := c.conn.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case rd := <-c.frames:
			if rd.err != nil {
				return errors.Is(rd.err, io.EOF) || errors.Is(rd.err, io.ErrUnexpectedEOF)
			}
		case <-c.ended: // the reader already gave its error to Drive
			return true
		case <-t.C:
			return false
		}
	}
}

// Handshake waits for the runner's hello frame.
func (c *RunnerConn) Handshake(ctx context.Context) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.conn.SetReadDeadline(dl)
		defer c.conn.SetReadDeadline(time.Time{})
	}
	f, err := c.r.Read()
	if err != nil {
		return fmt.Errorf("wait for runner hello: %w", err)
	}
	if f.Type != proxy.TypeHello {
		return fmt.Errorf("runner sent %q before hello: %w", f.Type, proxy.ErrBadFrame)
	}
	go c.readLoop()
	c.reusable.Store(true)
	return nil
}

func (c *RunnerConn) write(f *proxy.Frame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.w.Write(f)
}

// capped keeps the first limit bytes written to it.
type capped struct {
	b         strings.Builder
	limit     int
	truncated bool
}

func (c *capped) add(s string) {
	room := c.limit - c.b.Len()
	if len(s) > room {
		c.truncated = true
		s = s[:max(room, 0)]
	}
	c.b.WriteString(s)
}

// Drive runs job on a runner that has completed its handshake and returns the
// outcome. When ctx ends first, Drive returns a timeout Result (or ctx's error if
// ctx was cancelled for another reason); the caller must then destroy the sandbox,
// since the runner may still be executing. When the connection ends before the job
// is done, Drive returns ErrRunnerLost with the output collected so far.
func (c *RunnerConn) Drive(ctx context.Context, job Job, host Host) (Result, error) {
	if host == nil {
		host = NopHost{}
	}
	limit := job.OutputCap
	if limit <= 0 {
		limit = DefaultOutputCap
	}
	start := time.Now()
	stdout := &capped{limit: limit}
	stderr := &capped{limit: limit}
	result := func(r Result) Result {
		r.Stdout, r.StdoutTruncated = stdout.b.String(), stdout.truncated
		r.Stderr, r.StderrTruncated = stderr.b.String(), stderr.truncated
		r.Duration = time.Since(start)
		return r
	}

	c.reusable.Store(false)
	err := c.write(&proxy.Frame{
		Type: proxy.TypeExec, Job: job.ID, Code: job.Code, Servers: job.Servers,
		TimeoutMS: job.Timeout.Milliseconds(), OutputCap: limit,
	})
	if errors.Is(err, proxy.ErrFrameTooLarge) {
		// Nothing was written: the runner is untouched and may serve another job.
		c.reusable.Store(true)
		return result(Result{Status: StatusError, ExitCode: -1,
			Error: fmt.Sprintf("the job is too large for the sandbox channel (%v): send less code, or load data through a tool", err)}), nil
	}
	if err != nil {
		return result(Result{}), fmt.Errorf("send job to runner: %w: %w", ErrRunnerLost, err)
	}

	callCtx, cancelCalls := context.WithCancel(ctx)
	defer cancelCalls()
	var calls sync.WaitGroup
	defer calls.Wait()
	sem := make(chan struct{}, MaxConcurrentCalls)

	for {
		select {
		case <-ctx.Done():
			// The runner may still be executing: the caller destroys the sandbox.
			if errors.Is(context.Cause(ctx), ErrTimeout) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return result(Result{Status: StatusTimeout, ExitCode: -1,
					Error: fmt.Sprintf("timed out after %s", job.Timeout)}), nil
			}
			return result(Result{}), ctx.Err()
		case rd := <-c.frames:
			if rd.err != nil {
				if errors.Is(rd.err, io.EOF) || errors.Is(rd.err, io.ErrUnexpectedEOF) || errors.Is(rd.err, net.ErrClosed) {
					return result(Result{}), ErrRunnerLost
				}
				return result(Result{Status: StatusError, ExitCode: -1,
					Error: fmt.Sprintf("sandbox broke the runner protocol: %v", rd.err)}), nil
			}
			f := rd.f
			switch f.Type {
			case proxy.TypeOut:
				if f.Stream == "stdout" {
					stdout.add(f.Data)
				} else {
					stderr.add(f.Data)
				}
				host.Output(f.Stream, f.Data)
			case proxy.TypeCall:
				select {
				case sem <- struct{}{}:
				default:
					_ = c.write(&proxy.Frame{Type: proxy.TypeReply, ID: f.ID,
						Error: fmt.Sprintf("too many concurrent calls (limit %d): await some before starting more", MaxConcurrentCalls)})
					continue
				}
				calls.Add(1)
				go func(f *proxy.Frame) {
					defer calls.Done()
					defer func() { <-sem }()
					reply := &proxy.Frame{Type: proxy.TypeReply, ID: f.ID}
					res, err := host.Call(callCtx, f.Method, f.Params)
					if err != nil {
						reply.Error = err.Error()
					} else {
						reply.Result = res
					}
					if werr := c.write(reply); werr != nil && errors.Is(werr, proxy.ErrFrameTooLarge) {
						_ = c.write(&proxy.Frame{Type: proxy.TypeReply, ID: f.ID, Error: werr.Error()})
					}
				}(f)
			case proxy.TypeDone:
				st := Status(f.Status)
				if st != StatusSuccess && st != StatusError {
					st = StatusError
				}
				if st == StatusSuccess && f.ExitCode != 0 {
					st = StatusError
				}
				c.reusable.Store(true)
				return result(Result{Status: st, ExitCode: f.ExitCode, Error: f.Error}), nil
			default:
				return result(Result{Status: StatusError, ExitCode: -1,
					Error: fmt.Sprintf("sandbox sent an unexpected %q frame", f.Type)}), nil
			}
		}
	}
}

// ErrTimeout is the cause of a run's context when the job's time limit passed.
var ErrTimeout = errors.New("job time limit reached")

// AcceptRunner waits on ln for a runner to connect and complete its hello, and
// returns its connection. maxFrame 0 means proxy.DefaultMaxFrame. When ctx ends
// first the listener is closed.
func AcceptRunner(ctx context.Context, ln net.Listener, maxFrame int) (*RunnerConn, error) {
	type acc struct {
		c   net.Conn
		err error
	}
	ch := make(chan acc, 1)
	go func() {
		c, err := ln.Accept()
		ch <- acc{c, err}
	}()
	var conn net.Conn
	select {
	case a := <-ch:
		if a.err != nil {
			return nil, fmt.Errorf("runner did not connect: %w", a.err)
		}
		conn = a.c
	case <-ctx.Done():
		ln.Close()
		if a := <-ch; a.c != nil {
			a.c.Close()
		}
		return nil, fmt.Errorf("runner did not connect: %w", ctx.Err())
	}
	rc := NewRunnerConn(conn, maxFrame)
	if err := rc.Handshake(ctx); err != nil {
		rc.Close()
		return nil, err
	}
	return rc, nil
}
