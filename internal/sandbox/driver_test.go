package sandbox_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// fakeRunner is the sandbox end of a RunnerConn, driven by the test: a hostile
// runner that may send anything.
type fakeRunner struct {
	t    *testing.T
	conn net.Conn
	r    *proxy.Reader
	w    *proxy.Writer
}

// setup returns a handshaken RunnerConn whose runner the test plays.
func setup(t *testing.T, maxFrame int) (*sandbox.RunnerConn, *fakeRunner) {
	t.Helper()
	host, sb := net.Pipe()
	fr := &fakeRunner{t: t, conn: sb, r: proxy.NewReader(sb, 0), w: proxy.NewWriter(sb, 0)}
	rc := sandbox.NewRunnerConn(host, maxFrame)
	t.Cleanup(func() { _, _ = rc.Close(), sb.Close() }) // the test is over with them: a failing close changes no result
	go func() { _ = fr.w.Write(&proxy.Frame{Type: proxy.TypeHello, Version: 1}) }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rc.Handshake(ctx, ""); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	return rc, fr
}

// drive runs a job on rc while the fake runner does act after reading the exec.
func drive(t *testing.T, rc *sandbox.RunnerConn, fr *fakeRunner, act func()) sandbox.Result {
	t.Helper()
	go func() {
		if _, err := fr.r.Read(); err != nil {
			return
		}
		act()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	res, err := rc.Drive(ctx, sandbox.Job{ID: "j", Code: "print(1)", Timeout: 10 * time.Second}, nil)
	if err != nil {
		t.Fatalf("Drive: %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("Drive took %s against a hostile runner", el)
	}
	return res
}

func TestDriveCleanDoneIsReusable(t *testing.T) {
	rc, fr := setup(t, 0)
	res := drive(t, rc, fr, func() {
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeOut, Stream: "stdout", Data: "1\n"})
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Status: "success"})
	})
	if res.Status != sandbox.StatusSuccess || res.Stdout != "1\n" || !rc.Reusable() {
		t.Fatalf("result %+v reusable %v", res, rc.Reusable())
	}
}

func TestDriveHostileRunner(t *testing.T) {
	raw := func(b []byte) func(fr *fakeRunner) {
		return func(fr *fakeRunner) { _, _ = fr.conn.Write(b) }
	}
	header := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	body := func(s string) []byte { return append(header(uint32(len(s))), s...) }
	tests := []struct {
		name string
		act  func(fr *fakeRunner)
		want string
	}{
		{"GiantFrameHeader", raw(header(0xFFFFFFFF)), "exceeds size limit"},
		{"OverLimitFrame", raw(header(proxy.DefaultMaxFrame + 1)), "exceeds size limit"},
		{"GarbageBody", raw(body("\x00\xffnot json")), "malformed frame"},
		{"JSONArray", raw(body(`[1,2,3]`)), "malformed frame"},
		{"UnknownType", raw(body(`{"type":"exec!"}`)), "unknown type"},
		{"BadStream", raw(body(`{"type":"out","stream":"stdin","data":"x"}`)), "stream"},
		{"CallWithoutID", raw(body(`{"type":"call","method":"call_tool"}`)), "needs id"},
		{"SecondHello", func(fr *fakeRunner) { _ = fr.w.Write(&proxy.Frame{Type: proxy.TypeHello}) }, "unexpected"},
		{"ExecFromSandbox", func(fr *fakeRunner) { _ = fr.w.Write(&proxy.Frame{Type: proxy.TypeExec, Code: "x"}) }, "unexpected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc, fr := setup(t, 0)
			res := drive(t, rc, fr, func() { tt.act(fr) })
			if res.Status != sandbox.StatusError || !strings.Contains(res.Error, tt.want) {
				t.Fatalf("result %+v, want error containing %q", res, tt.want)
			}
			if rc.Reusable() {
				t.Fatal("a runner that broke the protocol is still marked reusable")
			}
		})
	}
}

func TestDriveLostRunner(t *testing.T) {
	rc, fr := setup(t, 0)
	go func() {
		_, _ = fr.r.Read()
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeOut, Stream: "stderr", Data: "dying"})
		_ = fr.conn.Close() // a failing close changes no result
	}()
	res, err := rc.Drive(context.Background(), sandbox.Job{ID: "j", Code: "x", Timeout: time.Second}, nil)
	if !errors.Is(err, sandbox.ErrRunnerLost) || res.Stderr != "dying" || rc.Reusable() {
		t.Fatalf("err %v result %+v", err, res)
	}
}

func TestDriveCodeOverFrameLimit(t *testing.T) {
	rc, fr := setup(t, 1<<20)
	got := make(chan struct{}, 1)
	go func() {
		if _, err := fr.r.Read(); err == nil {
			got <- struct{}{}
		}
	}()
	code := strings.Repeat("#", 2<<20)
	res, err := rc.Drive(context.Background(), sandbox.Job{ID: "j", Code: code, Timeout: time.Second}, nil)
	if err != nil || res.Status != sandbox.StatusError || !strings.Contains(res.Error, "too large") {
		t.Fatalf("err %v result %+v", err, res)
	}
	if !rc.Reusable() {
		t.Fatal("runner not reusable although nothing was sent")
	}
	select {
	case <-got:
		t.Fatal("an oversized exec frame reached the runner")
	case <-time.After(50 * time.Millisecond):
	}
}

func TestDriveTimeoutNotReusable(t *testing.T) {
	rc, fr := setup(t, 0)
	go func() { _, _ = fr.r.Read() }()
	ctx, cancel := context.WithTimeoutCause(context.Background(), 100*time.Millisecond, sandbox.ErrTimeout)
	defer cancel()
	res, err := rc.Drive(ctx, sandbox.Job{ID: "j", Code: "x", Timeout: 100 * time.Millisecond}, nil)
	if err != nil || res.Status != sandbox.StatusTimeout || rc.Reusable() {
		t.Fatalf("err %v result %+v reusable %v", err, res, rc.Reusable())
	}
}

// unixPair returns both ends of a connected Unix socket (net.Pipe has no
// half-close).
func unixPair(t *testing.T) (host, sb net.Conn) {
	t.Helper()
	ln, err := net.Listen("unix", t.TempDir()+"/s")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }() // the test is over with it: a failing close changes no result
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	sb, err = net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	host = <-acc
	t.Cleanup(func() { _, _ = host.Close(), sb.Close() }) // the test is over with them: a failing close changes no result
	return host, sb
}

func TestFinish(t *testing.T) {
	for _, tc := range []struct {
		name  string
		exits bool // the runner closes its side on EOF
		want  bool
	}{{"RunnerExits", true, true}, {"RunnerStays", false, false}} {
		t.Run(tc.name, func(t *testing.T) {
			host, sb := unixPair(t)
			w := proxy.NewWriter(sb, 0)
			rc := sandbox.NewRunnerConn(host, 0)
			go func() {
				_ = w.Write(&proxy.Frame{Type: proxy.TypeHello, Version: 1})
				// A frame the host no longer reads, then EOF from the host.
				_ = w.Write(&proxy.Frame{Type: proxy.TypeOut, Stream: "stdout", Data: "late"})
				buf := make([]byte, 16)
				if _, err := sb.Read(buf); err == nil {
					t.Error("runner read data, want EOF")
				}
				if tc.exits {
					_ = sb.Close() // a failing close changes no result
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := rc.Handshake(ctx, ""); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if got := rc.Finish(300 * time.Millisecond); got != tc.want {
				t.Fatalf("Finish = %v, want %v", got, tc.want)
			}
			if el := time.Since(start); tc.want && el > 250*time.Millisecond {
				t.Fatalf("Finish took %s", el)
			}
		})
	}
}

// countingHost answers every call with a big result and counts output bytes.
type countingHost struct {
	mu     sync.Mutex
	calls  int
	output int
	result json.RawMessage
}

func (h *countingHost) Call(ctx context.Context, method string, _ json.RawMessage) (json.RawMessage, error) {
	h.mu.Lock()
	h.calls++
	h.mu.Unlock()
	return h.result, nil
}

func (h *countingHost) Output(_, data string) {
	h.mu.Lock()
	h.output += len(data)
	h.mu.Unlock()
}

// TestDriveRunnerThatStopsReading: the runner floods calls whose answers are
// big and never reads them. Drive must still end at the job's time limit, within
// WriteTimeout.
func TestDriveRunnerThatStopsReading(t *testing.T) {
	rc, fr := setup(t, 0)
	h := &countingHost{result: json.RawMessage(`"` + strings.Repeat("r", 1<<20) + `"`)}
	go func() {
		if _, err := fr.r.Read(); err != nil {
			return
		}
		for i := uint64(1); i < 100_000; i++ {
			if fr.w.Write(&proxy.Frame{Type: proxy.TypeCall, ID: i, Method: "memory_get", Params: json.RawMessage(`{}`)}) != nil {
				return
			}
		}
	}()
	ctx, cancel := context.WithTimeoutCause(context.Background(), time.Second, sandbox.ErrTimeout)
	defer cancel()
	start := time.Now()
	res, err := rc.Drive(ctx, sandbox.Job{ID: "j", Code: "x", Timeout: time.Second}, h)
	if err != nil || res.Status != sandbox.StatusTimeout {
		t.Fatalf("err %v result %+v", err, res)
	}
	if el := time.Since(start); el > time.Second+sandbox.WriteTimeout+time.Second {
		t.Fatalf("Drive took %s against a runner that stopped reading", el)
	}
	if rc.Reusable() {
		t.Fatal("reusable after a timeout")
	}
}

// TestDriveBounds: output floods, unknown methods, call floods and oversized
// calls are all answered by the host's own bounds.
func TestDriveBounds(t *testing.T) {
	t.Run("OutputFloodKeepsOnlyTheCap", func(t *testing.T) {
		rc, fr := setup(t, 0)
		h := &countingHost{}
		big := strings.Repeat("x", 8<<20)
		res, err := driveWith(t, rc, fr, h, func() {
			for range 8 {
				_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeOut, Stream: "stdout", Data: big})
			}
			_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Status: "success"})
		})
		if err != nil || len(res.Stdout) != 4096 || !res.StdoutTruncated || h.output != 4096 {
			t.Fatalf("err %v stdout %d truncated %v forwarded %d", err, len(res.Stdout), res.StdoutTruncated, h.output)
		}
	})
	t.Run("UnknownMethodRefused", func(t *testing.T) {
		rc, fr := setup(t, 0)
		h := &countingHost{result: json.RawMessage(`1`)}
		var reply *proxy.Frame
		res, err := driveWith(t, rc, fr, h, func() {
			_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeCall, ID: 1, Method: strings.Repeat("m", 3<<20)})
			reply, _ = fr.r.Read()
			_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Status: "success"})
		})
		if err != nil || res.Status != sandbox.StatusSuccess || h.calls != 0 || reply == nil || !strings.Contains(reply.Error, "unknown proxy method") {
			t.Fatalf("err %v result %+v host calls %d reply %+v", err, res, h.calls, reply)
		}
	})
	t.Run("CallFloodRefused", func(t *testing.T) {
		rc, fr := setup(t, 0)
		h := &countingHost{result: json.RawMessage(`1`)}
		var refused atomic.Int64
		res, err := driveWith(t, rc, fr, h, func() {
			go func() { // the replies, read as they come
				for {
					f, err := fr.r.Read()
					if err != nil {
						return
					}
					if strings.Contains(f.Error, "calls per second") || strings.Contains(f.Error, "concurrent calls") {
						refused.Add(1)
					}
				}
			}()
			for i := uint64(1); i <= sandbox.CallBurst+200; i++ {
				_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeCall, ID: i, Method: "list_servers"})
			}
			time.Sleep(200 * time.Millisecond)
			_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Status: "success"})
		})
		if err != nil || res.Status != sandbox.StatusSuccess || refused.Load() == 0 {
			t.Fatalf("err %v result %+v refused %d", err, res, refused.Load())
		}
	})
	t.Run("CallsOnlyOfTheJobWhileItRuns", func(t *testing.T) {
		// The reader hands a running job's calls to its host itself: a call
		// that names another job, or comes after the job's end, reaches no
		// host.
		rc, fr := setup(t, 0)
		h := &countingHost{result: json.RawMessage(`1`)}
		var reply *proxy.Frame
		res, err := driveWith(t, rc, fr, h, func() {
			_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeCall, Job: "earlier", ID: 1, Method: "list_servers"})
			_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeCall, Job: "j", ID: 2, Method: "list_servers"})
			reply, _ = fr.r.Read()
			_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Job: "j", Status: "success"})
		})
		if err != nil || res.Status != sandbox.StatusSuccess || reply == nil || reply.ID != 2 || string(reply.Result) != "1" {
			t.Fatalf("err %v result %+v reply %+v", err, res, reply)
		}
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeCall, Job: "j", ID: 3, Method: "list_servers"})
		time.Sleep(100 * time.Millisecond)
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.calls != 1 {
			t.Fatalf("host calls %d, want 1 (the job's own, while it ran)", h.calls)
		}
	})
	t.Run("LateFramesOfAnotherJobDropped", func(t *testing.T) {
		rc, fr := setup(t, 0)
		res, err := driveWith(t, rc, fr, nil, func() {
			_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeOut, Job: "earlier", Stream: "stdout", Data: "stale"})
			_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Job: "earlier", Status: "error", ExitCode: 9})
			_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeOut, Job: "j", Stream: "stdout", Data: "mine"})
			_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Job: "j", Status: "success", Last: true})
		})
		if err != nil || res.Stdout != "mine" || res.Status != sandbox.StatusSuccess || rc.Reusable() {
			t.Fatalf("err %v result %+v reusable %v (want false after last)", err, res, rc.Reusable())
		}
	})
}

func driveWith(t *testing.T, rc *sandbox.RunnerConn, fr *fakeRunner, h sandbox.Host, act func()) (sandbox.Result, error) {
	t.Helper()
	go func() {
		if _, err := fr.r.Read(); err != nil {
			return
		}
		act()
	}()
	ctx, cancel := context.WithTimeoutCause(context.Background(), 20*time.Second, sandbox.ErrTimeout)
	defer cancel()
	return rc.Drive(ctx, sandbox.Job{ID: "j", Code: "x", Timeout: 20 * time.Second, OutputCap: 4096}, h)
}

// TestAcceptRunnerNeedsTheSecret: a local impostor connecting first is turned
// away; the sandbox's runner gets in; the socket is gone afterwards.
func TestAcceptRunnerNeedsTheSecret(t *testing.T) {
	sock := t.TempDir() + "/s"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hello := func(secret string) net.Conn {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() }) // the test is over with it: a failing close changes no result
		_ = proxy.NewWriter(c, 0).Write(&proxy.Frame{Type: proxy.TypeHello, Version: 2, Secret: secret})
		return c
	}
	impostor := hello("guess")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type acc struct {
		rc  *sandbox.RunnerConn
		err error
	}
	ch := make(chan acc, 1)
	go func() {
		rc, err := sandbox.AcceptRunner(ctx, ln, 0, "the-secret")
		ch <- acc{rc, err}
	}()
	// The impostor's connection is closed by the host.
	_ = impostor.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := impostor.Read(make([]byte, 1)); err == nil {
		t.Fatal("impostor's connection stayed open")
	}
	hello("the-secret")
	a := <-ch
	if a.err != nil {
		t.Fatalf("AcceptRunner: %v", a.err)
	}
	_ = a.rc.Close() // a failing close changes no result
	if _, err := net.Dial("unix", sock); err == nil {
		t.Fatal("the runner socket still accepts connections after the runner is in")
	}
}

// TestDriveCleanDoneIsIdleAtOnce: once Drive returns a clean done, the runner
// is idle at once: the frame Drive took is not counted as one the reader
// still holds (a runtime checks Idle right after the job to keep the sandbox).
func TestDriveCleanDoneIsIdleAtOnce(t *testing.T) {
	rc, fr := setup(t, 0)
	for i := 0; i < 300; i++ {
		res := drive(t, rc, fr, func() {
			_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Status: "success"})
		})
		if res.Status != sandbox.StatusSuccess || !rc.Idle() {
			t.Fatalf("run %d: result %+v, idle %v right after a clean done", i, res, rc.Idle())
		}
	}
	// A frame the runner sends while idle makes it unfit, until taken.
	_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeOut, Stream: "stdout", Data: "late\n"})
	deadline := time.Now().Add(5 * time.Second)
	for rc.Idle() {
		if time.Now().After(deadline) {
			t.Fatal("a runner that spoke while idle is still idle")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReadyArmsForItsLanguages: a ready frame after a job's done arms the
// runner for the languages it names; one that arrives while a job runs (the
// runner sent it before it read that job's exec, which takes the executor
// it announced) does not.
func TestReadyArmsForItsLanguages(t *testing.T) {
	rc, fr := setup(t, 0)
	if !rc.ArmedFor(sandbox.Python) || rc.ArmedFor(sandbox.JavaScript) {
		t.Fatalf("after a hello without spares: python %v, javascript %v", rc.ArmedFor(sandbox.Python), rc.ArmedFor(sandbox.JavaScript))
	}
	armedWithin := func(lang string) bool {
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if rc.ArmedFor(lang) {
				return true
			}
		}
		return false
	}
	drive(t, rc, fr, func() {
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Status: "success"})
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeReady, Spares: []string{sandbox.Python, sandbox.JavaScript}})
	})
	if !armedWithin(sandbox.JavaScript) || !rc.ArmedFor(sandbox.Python) {
		t.Fatal("a ready frame naming both languages did not arm the runner for both")
	}
	// Stale: sent while the job runs, before its done.
	drive(t, rc, fr, func() {
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeReady, Spares: []string{sandbox.Python}})
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Status: "success"})
	})
	if armedWithin(sandbox.Python) {
		t.Fatal("a ready frame sent during a job armed the runner after it")
	}
	drive(t, rc, fr, func() {
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Status: "success"})
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeReady, Spares: []string{sandbox.Python}})
	})
	if !armedWithin(sandbox.Python) || rc.ArmedFor(sandbox.JavaScript) {
		t.Fatalf("after a ready for python alone: python %v, javascript %v", rc.ArmedFor(sandbox.Python), rc.ArmedFor(sandbox.JavaScript))
	}
}
