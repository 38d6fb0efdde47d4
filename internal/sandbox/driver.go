package sandbox

import (
	"bufio"
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobclock"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/proxy"
)

// The host's bounds of one runner connection. Everything the runner sends is
// hostile: these hold whatever the code does.
const (
	// MaxConcurrentCalls bounds the proxy calls one job may have in flight.
	MaxConcurrentCalls = 16
	// MaxCallBytesInFlight bounds the parameters of one job's calls in flight.
	MaxCallBytesInFlight = 16 << 20
	// WriteTimeout bounds every write to a runner: a runner that stops reading
	// cannot block the host.
	WriteTimeout = 5 * time.Second
	// FramesPerSecond and FrameBurst throttle the frames read from one runner
	// (reading pauses when they are spent).
	FramesPerSecond = 4000
	FrameBurst      = 8000
	// CallsPerSecond and CallBurst bound one job's proxy calls; calls over them
	// are refused.
	CallsPerSecond = 200
	CallBurst      = 400
	// maxHelloAttempts bounds the connections AcceptRunner takes that do not
	// present the sandbox's secret.
	maxHelloAttempts = 8
)

// ErrUnknownMethod is the error of a call whose method is not a proxy method.
var ErrUnknownMethod = errors.New("unknown proxy method")

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
	ow  *oobWriter // w's writer: attaches a job's call channel to its exec frame

	// reusable is true while the runner is idle after a clean done frame: no
	// protocol error, no timeout, no lost connection, no lost code process.
	// Only then may the runner take another job (sessions).
	reusable atomic.Bool
	// isolated is what the runner's hello said: its code cannot reach it.
	isolated bool
	// resets is what the runner's hello said: it sweeps its container after
	// each fresh job.
	resets bool
	// callChannels: the runner's hello said it takes a call channel with a
	// fresh Python job's exec frame, and the connection can carry one (a
	// Unix socket).
	callChannels bool
	// directExec: the hello said the runner takes the next job's call
	// channel ahead, for its Python spare, and then a fresh Python job's
	// exec on it (proxy.Frame.DirectExec); dataWords matches the code of
	// jobs it runs elsewhere (nil: none).
	directExec bool
	dataWords  *regexp.Regexp
	directs    atomic.Uint64    // execs sent straight to the spare
	maxFrame   int              // the largest frame written to the runner
	chMu       sync.Mutex       // guards next, chClosed
	next       *preparedChannel // the next job's call channel, made ahead
	chClosed   bool             // Close ran: no channel is made ahead
	// unread counts the frames the reader read that nobody has taken yet (0
	// or 1): a runner that spoke while idle is not fit for another job. The
	// reader counts a frame before it hands it over and the taker uncounts it
	// (take): the reader cannot uncount it after the handover, which would
	// leave it counted for a moment after Drive returned with it.
	unread atomic.Int32
	// armed is true from the runner's ready frame (or its hello) until the
	// next exec: its sandbox is swept and the next job's process waits.
	armed atomic.Bool
	// armedJS is true while armed and its spares include JavaScript's: a
	// JavaScript job sent now finds Node started.
	armedJS atomic.Bool
	// armMu orders arming (readLoop) and disarming (Exec): a ready frame
	// counts only if every exec sent before it was read has been answered
	// (execs == dones); one the runner sent before it read the latest exec
	// is stale, as that job takes the executor it announced.
	armMu        sync.Mutex
	execs, dones uint64 // guarded by armMu

	// calls, while a job is driven, is where the reader hands that job's
	// call frames itself, not through Drive: a call starts one goroutine
	// handoff sooner (each costs a virtual machine's CPUs a wake-up).
	calls atomic.Pointer[jobCalls]

	frameTokens *bucket           // throttles frames read, across jobs
	async       chan *proxy.Frame // small frames written by asyncWriter (refusals)
}

// Reusable reports whether the runner finished its last job cleanly and waits for
// the next: false after a timeout, a cancelled run, a protocol error or a lost
// connection, when the sandbox must be destroyed.
func (c *RunnerConn) Reusable() bool { return c.reusable.Load() }

// DirectExecs counts the jobs whose exec went straight to the runner's
// waiting Python process, on the call channel handed to it while idle, so
// that the code started without waiting for the supervisor.
func (c *RunnerConn) DirectExecs() uint64 { return c.directs.Load() }

// Isolated reports whether the runner said its code cannot reach it (its hello).
func (c *RunnerConn) Isolated() bool { return c.isolated }

// Resets reports whether the runner said it sweeps its container after each
// fresh job (its hello), so that the container may serve another job.
func (c *RunnerConn) Resets() bool { return c.resets }

// Idle reports whether the runner may take a job now: it finished its last
// one cleanly and has said nothing since.
func (c *RunnerConn) Idle() bool { return c.reusable.Load() && c.unread.Load() == 0 }

// Armed reports whether the runner said, since its last job, that its
// sandbox is swept and the next job's process is started (a ready frame):
// a job sent now starts at once. A runner that is idle but not armed takes
// the job too, once it is ready.
func (c *RunnerConn) Armed() bool { return c.armed.Load() }

// ArmedFor reports whether the runner is armed with an executor of lang
// started: Python's (or "") whenever it is armed, JavaScript's when its
// ready frame said so.
func (c *RunnerConn) ArmedFor(lang string) bool {
	if lang == JavaScript {
		return c.armedJS.Load() && c.armed.Load()
	}
	return c.armed.Load()
}

// arm notes a ready frame or hello: armed, with executors of spares
// started, unless a job was sent since the runner sent it.
func (c *RunnerConn) arm(spares []string) {
	c.armMu.Lock()
	defer c.armMu.Unlock()
	if c.execs != c.dones {
		return
	}
	// Made (and handed over) before the runner counts as armed: the next
	// exec, which waits for armMu, finds it.
	c.prepareCallChannel(slices.Contains(spares, Python))
	c.armedJS.Store(slices.Contains(spares, JavaScript))
	c.armed.Store(true)
}

// disarm notes an exec about to be sent: the runner is armed no more.
func (c *RunnerConn) disarm() {
	c.armMu.Lock()
	defer c.armMu.Unlock()
	c.execs++
	c.armed.Store(false)
	c.armedJS.Store(false)
}

// answered notes a done frame read from the runner.
func (c *RunnerConn) answered() {
	c.armMu.Lock()
	defer c.armMu.Unlock()
	c.dones++
}

// take uncounts a frame received from c.frames.
func (c *RunnerConn) take(rd readResult) readResult {
	c.unread.Add(-1)
	return rd
}

// readBuffer is what a RunnerConn reads from its runner at once: a small
// frame (a call, a job's output) costs one read, not one for its length and
// one for its body.
const readBuffer = 64 << 10

// NewRunnerConn wraps a connection from a runner. maxFrame 0 means
// proxy.DefaultMaxFrame.
func NewRunnerConn(conn net.Conn, maxFrame int) *RunnerConn {
	ow := &oobWriter{conn: conn}
	return &RunnerConn{
		conn:        conn,
		r:           proxy.NewReader(bufio.NewReaderSize(conn, readBuffer), maxFrame),
		w:           proxy.NewWriter(ow, maxFrame),
		maxFrame:    cmp.Or(maxFrame, proxy.DefaultMaxFrame),
		ow:          ow,
		frames:      make(chan readResult),
		done:        make(chan struct{}),
		ended:       make(chan struct{}),
		frameTokens: newBucket(FramesPerSecond, FrameBurst),
		async:       make(chan *proxy.Frame, 64),
	}
}

// asyncWriter writes the frames Drive must not wait for (refusals of calls).
func (c *RunnerConn) asyncWriter() {
	for {
		select {
		case f := <-c.async:
			_ = c.write(f) // a failed write has closed the connection
		case <-c.done:
			return
		}
	}
}

// sendAsync queues a small frame without waiting; a runner that lets 64 of
// them pile up is not reading, and gets none.
func (c *RunnerConn) sendAsync(f *proxy.Frame) {
	select {
	case c.async <- f:
	default:
	}
}

// jobCalls is the job whose calls the reader hands itself: its id, its
// calls' bounds and its host.
type jobCalls struct {
	job  string
	gate *callGate
	host Host
}

// owns says whether call frame f is the job's: it names the job, or none.
func (jc *jobCalls) owns(f *proxy.Frame) bool { return f.Job == "" || f.Job == jc.job }

type readResult struct {
	f   *proxy.Frame
	err error
}

// Close closes the connection and ends its reader.
func (c *RunnerConn) Close() error {
	var err error
	c.once.Do(func() {
		c.reusable.Store(false)
		close(c.done)
		err = c.conn.Close()
		c.closeCallChannels()
	})
	return err
}

// readLoop hands frames to Drive until the connection fails or is closed. It
// throttles a flooding runner by pausing its reads.
func (c *RunnerConn) readLoop() {
	defer close(c.ended)
	for {
		if !c.frameTokens.wait(c.done) {
			return
		}
		f, err := c.r.Read()
		if err == nil && f.Type == proxy.TypeReady {
			c.arm(f.Spares) // between jobs: not a frame for Drive
			continue
		}
		if err == nil && f.Type == proxy.TypeCall {
			if jc := c.calls.Load(); jc != nil && jc.owns(f) {
				serveCall(c, jc.gate, jc.host, f)
				continue
			}
		}
		if err == nil && f.Type == proxy.TypeDone {
			c.answered()
		}
		c.unread.Add(1)
		select {
		case c.frames <- readResult{f, err}: // the taker uncounts it
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
	defer func() { _ = c.Close() }() // the outcome is the bool: closing only frees the connection
	cw, ok := c.conn.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case rd := <-c.frames:
			rd = c.take(rd)
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

// Handshake waits for the runner's hello, which must carry secret (when not
// empty): the proof that the connection comes from the sandbox the host
// started.
func (c *RunnerConn) Handshake(ctx context.Context, secret string) error {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(30 * time.Second)
	}
	_ = c.conn.SetReadDeadline(dl) // a connection without deadlines fails the read below
	f, err := c.r.Read()
	_ = c.conn.SetReadDeadline(time.Time{}) // a connection that refuses deadlines fails its next read or write
	if err != nil {
		return fmt.Errorf("wait for runner hello: %w", err)
	}
	if f.Type != proxy.TypeHello {
		return fmt.Errorf("runner sent %q before hello: %w", f.Type, proxy.ErrBadFrame)
	}
	if secret != "" && subtle.ConstantTimeCompare([]byte(f.Secret), []byte(secret)) != 1 {
		return fmt.Errorf("runner hello without the sandbox's secret: %w", errWrongSecret)
	}
	c.isolated, c.resets = f.Isolated, f.Reset
	_, unix := c.conn.(*net.UnixConn)
	c.callChannels = f.CallChannel && unix
	c.directExec = c.callChannels && f.DirectExec
	if c.directExec {
		if c.dataWords, err = wordsPattern(f.DataWords); err != nil {
			return fmt.Errorf("runner hello: %w", err)
		}
	}
	c.arm(f.Spares) // a runner says hello once its first job's process waits
	select {
	case <-c.done:
		return fmt.Errorf("runner hello: %w", net.ErrClosed) // the channel frame's write failed
	default:
	}
	go c.readLoop()
	go c.asyncWriter()
	c.reusable.Store(true)
	return nil
}

var errWrongSecret = errors.New("not the sandbox this host started")

// write sends one frame within WriteTimeout. A write that fails (the runner
// stopped reading, or is gone) closes the connection: nothing more is written,
// and Drive sees the connection end.
func (c *RunnerConn) write(f *proxy.Frame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(f)
}

// writeLocked is write with c.wmu held.
func (c *RunnerConn) writeLocked(f *proxy.Frame) error {
	_ = c.conn.SetWriteDeadline(time.Now().Add(WriteTimeout)) // a closed connection fails the write anyway
	err := c.w.Write(f)
	if err != nil && !errors.Is(err, proxy.ErrFrameTooLarge) {
		_ = c.Close() // the connection failed already: err is what the caller hears
	}
	return err
}

// capped keeps the first limit bytes written to it.
type capped struct {
	b         strings.Builder
	limit     int
	truncated bool
}

// add keeps what fits and returns it.
func (c *capped) add(s string) string {
	room := c.limit - c.b.Len()
	if len(s) > room {
		c.truncated = true
		s = s[:max(room, 0)]
	}
	c.b.WriteString(s)
	return s
}

// Exec runs job (after its BeforeExec) on a runner that has completed its
// handshake, within the job's time limit (30 s when it sets none): Drive under
// a deadline whose cause is ErrTimeout.
//
// A fresh job's code is sent while its BeforeExec runs (the worker records
// the start, a durable write): the code runs meanwhile, but nothing of it
// leaves the sandbox before the hook has succeeded, since its frames are read
// and its calls answered only then. If the hook fails, the runner is cut off
// (the caller discards the sandbox, as after any error) and Exec returns the
// hook's error, wrapped in ErrNotStarted, as when nothing was sent. A
// session's job (not fresh) changes what its process keeps for later jobs,
// so its hook returns before its code is sent.
func (c *RunnerConn) Exec(ctx context.Context, job Job, host Host) (Result, error) {
	if job.Timeout <= 0 {
		job.Timeout = 30 * time.Second
	}
	if !job.Fresh || job.BeforeExec == nil {
		if err := BeforeExec(job); err != nil {
			return Result{}, err
		}
	} else {
		job.start = startHook(job)
	}
	// The job's clock stops while a tool call waits for a person's approval.
	runCtx, _, cancel := jobclock.WithBudget(ctx, job.Timeout, ErrTimeout)
	defer cancel()
	res, err := c.Drive(runCtx, job, host)
	if serr := job.start.wait(); serr != nil {
		return Result{}, serr // Drive cut the runner off, if it had sent the code
	}
	return res, err
}

// startRun is a fresh job's BeforeExec, running beside its code.
type startRun struct {
	done chan struct{}
	err  error
}

// startHook runs job's BeforeExec in a goroutine of its own; wait waits for it.
func startHook(job Job) *startRun {
	s := &startRun{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = BeforeExec(job)
	}()
	return s
}

// wait returns the hook's error once it has returned; on a nil startRun
// (no hook running) it returns nil.
func (s *startRun) wait() error {
	if s == nil {
		return nil
	}
	<-s.done
	return s.err
}

// Drive runs job on a runner that has completed its handshake and returns the
// outcome. When ctx ends first, Drive closes the connection and returns a
// timeout Result (or ctx's error if ctx was cancelled for another reason); the
// caller must then destroy the sandbox, since the code may still be running.
// When the connection ends before the job is done, Drive returns ErrRunnerLost
// with the output collected so far. Drive returns within WriteTimeout of ctx's
// end whatever the runner does.
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

	fl := job.FileLimits.Or()
	for _, in := range job.Files {
		if err := jobs.CheckFileName(in.Name); err != nil {
			return result(Result{Status: StatusError, ExitCode: -1, Error: fmt.Sprintf("input file: %v", err)}), nil
		}
	}
	c.reusable.Store(false)
	c.disarm()
	var err error
	for _, in := range job.Files {
		if err = c.write(&proxy.Frame{Type: proxy.TypeFile, Job: job.ID, Name: in.Name, Data: base64.StdEncoding.EncodeToString(in.Data)}); err != nil {
			break
		}
	}
	calls := newCallGate(ctx, job.start != nil)
	jc := &jobCalls{job: job.ID, gate: calls, host: host}
	var ch *callChannel
	if err == nil {
		exec := &proxy.Frame{
			Type: proxy.TypeExec, Job: job.ID, Code: job.Code, Lang: job.Language, Servers: job.Servers,
			TimeoutMS: job.Timeout.Milliseconds(), OutputCap: limit, Fresh: job.Fresh,
			MaxFiles: fl.MaxFiles, MaxFileBytes: fl.MaxFileBytes, MaxJobBytes: fl.MaxJobBytes,
		}
		ch, err = c.sendExec(exec, job, jc)
	}
	if err != nil {
		calls.stop() // no call came: it only ends the gate's context
	}
	if errors.Is(err, proxy.ErrFrameTooLarge) && len(job.Files) > 0 {
		// An input frame went out before: the runner holds part of the job.
		_ = c.Close() // err is what the caller hears
		return result(Result{Status: StatusError, ExitCode: -1,
			Error: fmt.Sprintf("an input file is too large for the sandbox channel (%v)", err)}), nil
	}
	if errors.Is(err, proxy.ErrFrameTooLarge) {
		// Nothing was written: the runner is untouched and may serve another job.
		c.reusable.Store(true)
		return result(Result{Status: StatusError, ExitCode: -1,
			Error: fmt.Sprintf("the job is too large for the sandbox channel (%v): send less code, or load data through a tool", err)}), nil
	}
	if err != nil {
		_ = c.Close() // the connection failed already: err is what the caller hears
		return result(Result{}), fmt.Errorf("send job to runner: %w: %w", ErrRunnerLost, err)
	}

	c.calls.Store(jc)
	out := newFilesOut(fl)
	clean := false
	defer func() {
		c.calls.Store(nil)
		if ch != nil {
			// Its reader ends by itself once closed: nothing waits for it
			// here, on the job's way out.
			ch.jc.Store(nil)
			ch.close()
		}
		// A runner that did not end its job cleanly may go on sending: cut it
		// off before waiting for the calls, whose replies then fail at once.
		if !clean {
			_ = c.Close() // the runner is lost already: closing only cuts it off
		}
		calls.stop()
	}()
	if job.start != nil {
		// The code runs; its frames and calls wait until its start is
		// recorded. The wait is the host's, not the code's: its clock stops.
		resume := jobclock.From(ctx).Pause()
		err := job.start.wait()
		resume()
		if err != nil {
			return result(Result{}), err // not clean: the runner is cut off
		}
		calls.open()
	}

	for {
		select {
		case <-ctx.Done():
			// The code may still be running: the caller destroys the sandbox.
			if errors.Is(context.Cause(ctx), ErrTimeout) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return result(Result{Status: StatusTimeout, ExitCode: -1, Error: timedOut(ctx, job.Timeout)}), nil
			}
			return result(Result{}), ctx.Err()
		case rd := <-c.frames:
			rd = c.take(rd)
			if rd.err != nil {
				if errors.Is(rd.err, io.EOF) || errors.Is(rd.err, io.ErrUnexpectedEOF) || errors.Is(rd.err, net.ErrClosed) {
					return result(Result{}), ErrRunnerLost
				}
				return result(Result{Status: StatusError, ExitCode: -1,
					Error: fmt.Sprintf("sandbox broke the runner protocol: %v", rd.err)}), nil
			}
			f := rd.f
			if f.Job != "" && f.Job != job.ID && f.Type != proxy.TypeHello {
				continue // a late frame of an earlier job of the session
			}
			switch f.Type {
			case proxy.TypeOut:
				// Only what fits in the caps is kept and forwarded: a flood
				// costs the host nothing beyond them.
				var kept string
				if f.Stream == "stdout" {
					kept = stdout.add(f.Data)
				} else {
					kept = stderr.add(f.Data)
				}
				if kept != "" {
					host.Output(f.Stream, kept)
				}
			case proxy.TypeCall:
				serveCall(c, calls, host, f)
			case proxy.TypeFile:
				out.add(f.Name, f.Data)
			case proxy.TypeDone:
				if f.NotRun {
					// The runner retired before this job: nothing of it ran.
					clean = true
					c.reusable.Store(false)
					return result(Result{}), ErrNotRun
				}
				st := Status(f.Status)
				if st != StatusSuccess && st != StatusError {
					st = StatusError
				}
				if st == StatusSuccess && f.ExitCode != 0 {
					st = StatusError
				}
				clean = true
				c.reusable.Store(!f.Last)
				out.notes(f.Notes)
				return result(Result{Status: st, ExitCode: f.ExitCode, Error: errs.Clip(f.Error, 64<<10), Files: out.files, Notes: out.kept}), nil
			default:
				return result(Result{Status: StatusError, ExitCode: -1,
					Error: fmt.Sprintf("sandbox sent an unexpected %q frame", errs.Clip(f.Type, 40))}), nil
			}
		}
	}
}

// ErrNotRun is Drive's error when the runner retired without running the job
// (its sweep after the previous job found damage): the job may run in
// another sandbox.
var ErrNotRun = errors.New("the sandbox retired before running the job")

// ErrTimeout is the cause of a run's context when the job's time limit passed.
var ErrTimeout = errors.New("job time limit reached")

// AcceptRunner waits on ln for the sandbox's runner to connect and say hello
// with secret (when not empty), and returns its connection. Connections that
// do not present the secret are closed, up to a few; once the runner is in,
// the listener is closed, so no one else can connect. maxFrame 0 means
// proxy.DefaultMaxFrame. When ctx ends first the listener is closed.
func AcceptRunner(ctx context.Context, ln net.Listener, maxFrame int, secret string) (*RunnerConn, error) {
	defer func() { _ = ln.Close() }() // no one else may connect; a failure to close leaves nothing to do
	type acc struct {
		c   net.Conn
		err error
	}
	for range maxHelloAttempts {
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
			_ = ln.Close() // ends the Accept; ctx's error is what the caller hears
			if a := <-ch; a.c != nil {
				_ = a.c.Close() // a runner too late: nobody reads it
			}
			return nil, fmt.Errorf("runner did not connect: %w", ctx.Err())
		}
		rc := NewRunnerConn(conn, maxFrame)
		err := rc.Handshake(ctx, secret)
		if err == nil {
			return rc, nil
		}
		_ = rc.Close() // the handshake failed: err is what counts
		if !errors.Is(err, errWrongSecret) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("runner did not connect: %d connections without the sandbox's secret", maxHelloAttempts)
}
