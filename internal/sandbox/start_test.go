package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// startProbe is a job's BeforeExec that holds until the test releases it
// with the hook's answer, and a host that counts what reached it.
type startProbe struct {
	entered chan struct{}
	answer  chan error
	host    *countingHost
}

func newStartProbe() *startProbe {
	return &startProbe{entered: make(chan struct{}), answer: make(chan error), host: &countingHost{result: json.RawMessage(`{"ok":true}`)}}
}

func (p *startProbe) hook() error {
	close(p.entered)
	return <-p.answer
}

// seen returns how many calls and output bytes reached the host.
func (p *startProbe) seen() (calls, output int) {
	p.host.mu.Lock()
	defer p.host.mu.Unlock()
	return p.host.calls, p.host.output
}

// execBeside runs a fresh job whose start the probe holds, and returns Exec's
// outcome.
func execBeside(rc *sandbox.RunnerConn, p *startProbe) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := rc.Exec(ctx, sandbox.Job{ID: "j", Code: "x", Fresh: true, Timeout: 10 * time.Second, BeforeExec: p.hook}, p.host)
		if err == nil && (res.Status != sandbox.StatusSuccess || res.Stdout != "1\n") {
			err = fmt.Errorf("unexpected result %+v", res)
		}
		done <- err
	}()
	return done
}

// codeActs plays a fresh job's code once its exec frame came: it prints,
// calls a tool, and ends once the call is answered. It reports the frame
// that answered the call (nil if the connection ended first).
func codeActs(fr *fakeRunner) <-chan *proxy.Frame {
	reply := make(chan *proxy.Frame, 1)
	go func() {
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeOut, Job: "j", Stream: "stdout", Data: "1\n"})
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeCall, Job: "j", ID: 1, Method: "call_tool", Params: json.RawMessage(`{"server":"s","tool":"t"}`)})
		f, err := fr.r.Read()
		if err != nil {
			reply <- nil
			return
		}
		reply <- f
		_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Job: "j", Status: "success"})
	}()
	return reply
}

// TestFreshCodeRunsBesideItsStart: a fresh job's code is sent while its start
// is recorded, and nothing of it (output, calls, its end) reaches the host
// before that has succeeded.
func TestFreshCodeRunsBesideItsStart(t *testing.T) {
	rc, fr := setup(t, 0)
	p := newStartProbe()
	done := execBeside(rc, p)
	<-p.entered
	// The start is not recorded yet, and the code is on its way.
	f, err := fr.r.Read()
	if err != nil || f.Type != proxy.TypeExec {
		t.Fatalf("the runner got %+v, %v before the start was recorded: want the exec frame", f, err)
	}
	reply := codeActs(fr)
	time.Sleep(200 * time.Millisecond) // the host would have served the call and the output by now
	if calls, out := p.seen(); calls != 0 || out != 0 {
		t.Fatalf("before its start was recorded, %d calls and %d output bytes of the code reached the host", calls, out)
	}
	select {
	case f := <-reply:
		t.Fatalf("the code's call was answered (%+v) before its start was recorded", f)
	default:
	}
	p.answer <- nil
	if err := <-done; err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if calls, out := p.seen(); calls != 1 || out != 2 {
		t.Fatalf("after its start: %d calls, %d output bytes reached the host; want 1 and 2", calls, out)
	}
	if f := <-reply; f == nil || f.Type != proxy.TypeReply || f.ID != 1 || f.Error != "" {
		t.Fatalf("the call's answer: %+v", f)
	}
}

// TestFreshStartFailedLeavesNothing: when the start cannot be recorded (a
// cancellation came first, the broker failed), the code that ran meanwhile
// has had no effect outside the sandbox, Exec says it did not start, and
// the runner is cut off, so the sandbox is not used again.
func TestFreshStartFailedLeavesNothing(t *testing.T) {
	rc, fr := setup(t, 0)
	p := newStartProbe()
	done := execBeside(rc, p)
	<-p.entered
	if f, err := fr.r.Read(); err != nil || f.Type != proxy.TypeExec {
		t.Fatalf("the runner got %+v, %v: want the exec frame", f, err)
	}
	reply := codeActs(fr)
	time.Sleep(100 * time.Millisecond)
	p.answer <- errors.New("the job has events since its claim")
	err := <-done
	if !errors.Is(err, sandbox.ErrNotStarted) {
		t.Fatalf("Exec: %v, want ErrNotStarted", err)
	}
	if calls, out := p.seen(); calls != 0 || out != 0 {
		t.Fatalf("a job whose start failed had %d calls and %d output bytes reach the host", calls, out)
	}
	if rc.Reusable() {
		t.Fatal("the runner of a job whose start failed is still reusable")
	}
	if f := <-reply; f != nil {
		t.Fatalf("the call of a job whose start failed was answered: %+v", f)
	}
}

// TestSessionJobWaitsForItsStart: a job that is not fresh (a session's, whose
// process keeps what its code does) is sent only once its start is recorded.
func TestSessionJobWaitsForItsStart(t *testing.T) {
	rc, fr := setup(t, 0)
	p := newStartProbe()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := rc.Exec(ctx, sandbox.Job{ID: "j", Code: "x", Timeout: 10 * time.Second, BeforeExec: p.hook}, p.host)
		done <- err
	}()
	<-p.entered
	_ = fr.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if f, err := fr.r.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a session's job reached the runner (%+v, %v) before its start was recorded", f, err)
	}
	_ = fr.conn.SetReadDeadline(time.Time{})
	p.answer <- nil
	if f, err := fr.r.Read(); err != nil || f.Type != proxy.TypeExec {
		t.Fatalf("after its start the runner got %+v, %v, want the exec frame", f, err)
	}
	_ = fr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Job: "j", Status: "success"})
	if err := <-done; err != nil {
		t.Fatalf("Exec: %v", err)
	}
}
