package sandbox_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// echoParams answers each call with its parameters.
type echoParams struct{}

func (echoParams) Call(_ context.Context, _ string, params json.RawMessage) (json.RawMessage, error) {
	return params, nil
}
func (echoParams) Output(string, string) {}

// channelRunner is a runner that takes call channels, played by the test:
// its connection, and the exec frame and the call channel (nil when none
// came) of the job being driven.
type channelRunner struct {
	conn net.Conn
	w    *proxy.Writer
	exec chan channelExec
}

type channelExec struct {
	f    *proxy.Frame
	ch   net.Conn
	err  error
	nfds int
}

// setupChannel returns a handshaken RunnerConn over a Unix socket whose
// runner says it takes call channels.
func setupChannel(t *testing.T) (*sandbox.RunnerConn, *channelRunner) {
	t.Helper()
	rc, cr, err := handshake(t, &proxy.Frame{Type: proxy.TypeHello, Version: 2, CallChannel: true}, 0)
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	return rc, cr
}

// handshake returns a RunnerConn over a Unix socket (maxFrame as
// NewRunnerConn's), and the runner played by the test, after hello.
func handshake(t *testing.T, hello *proxy.Frame, maxFrame int) (*sandbox.RunnerConn, *channelRunner, error) {
	t.Helper()
	host, sb := unixPair(t)
	cr := &channelRunner{conn: sb, w: proxy.NewWriter(sb, 0), exec: make(chan channelExec, 1)}
	rc := sandbox.NewRunnerConn(host, maxFrame)
	t.Cleanup(func() { _ = rc.Close() }) // the test is over with it
	// A Unix socket takes a small frame without a reader.
	if err := cr.w.Write(hello); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return rc, cr, rc.Handshake(ctx, "")
}

// readExec reads one exec frame and the file descriptors sent with it.
func (cr *channelRunner) readExec() channelExec {
	buf := make([]byte, 64<<10)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	n, oobn, _, _, err := cr.conn.(*net.UnixConn).ReadMsgUnix(buf, oob)
	if err != nil {
		return channelExec{err: err}
	}
	if n < 4 || int(binary.BigEndian.Uint32(buf))+4 != n {
		return channelExec{err: errors.New("the exec frame did not come in one read")}
	}
	f := new(proxy.Frame) // not DecodeFrame: a channel frame goes only this way
	if err := json.Unmarshal(buf[4:n], f); err != nil {
		return channelExec{err: err}
	}
	ex := channelExec{f: f}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return channelExec{err: err}
	}
	for _, m := range msgs {
		fds, err := syscall.ParseUnixRights(&m)
		if err != nil {
			return channelExec{err: err}
		}
		ex.nfds += len(fds)
		for _, fd := range fds {
			file := os.NewFile(uintptr(fd), "calls")
			c, err := net.FileConn(file)
			_ = file.Close() // FileConn keeps a copy
			if err != nil {
				return channelExec{err: err}
			}
			ex.ch = c
		}
	}
	return ex
}

// driveChannel drives job on rc in the background; the runner's exec
// frame and channel are then read with cr.readExec.
func driveChannel(t *testing.T, rc *sandbox.RunnerConn, job sandbox.Job) <-chan sandbox.Result {
	t.Helper()
	out := make(chan sandbox.Result, 1)
	go func() {
		ctx, cancel := context.WithTimeoutCause(context.Background(), 10*time.Second, sandbox.ErrTimeout)
		defer cancel()
		res, err := rc.Drive(ctx, job, echoParams{})
		if err != nil {
			res.Error = "Drive: " + err.Error()
		}
		out <- res
	}()
	return out
}

// closedBy waits for conn's read to see the host's end closed.
func closedBy(t *testing.T, conn net.Conn, what string) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	for {
		_, err := conn.Read(buf)
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			return
		}
		if err != nil {
			t.Fatalf("%s: the host did not close the call channel: %v", what, err)
		}
	}
}

// TestCallChannel: a fresh Python job's exec frame brings a socket of its
// own; calls sent on it are answered on it, past the runner's connection;
// it closes when the job ends. What the code sends on it is the code's:
// any frame but a call of the job closes it and counts for nothing.
func TestCallChannel(t *testing.T) {
	fresh := sandbox.Job{ID: "j", Code: "x", Fresh: true, Timeout: 10 * time.Second}
	done := func(cr *channelRunner, exit int) {
		_ = cr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Job: "j", Status: "error", ExitCode: exit})
	}

	t.Run("CallsAnsweredOnIt", func(t *testing.T) {
		rc, cr := setupChannel(t)
		res := driveChannel(t, rc, fresh)
		ex := cr.readExec()
		if ex.err != nil || ex.ch == nil || !ex.f.CallChannel || ex.nfds != 1 {
			t.Fatalf("exec %+v with %d fds (err %v), want one call channel", ex.f, ex.nfds, ex.err)
		}
		cw, cread := proxy.NewWriter(ex.ch, 0), proxy.NewReader(ex.ch, 0)
		for id := uint64(1); id <= 3; id++ {
			if err := cw.Write(&proxy.Frame{Type: proxy.TypeCall, ID: id, Method: proxy.MethodCallTool, Params: json.RawMessage(`{"n":1}`)}); err != nil {
				t.Fatal(err)
			}
			rep, err := cread.Read()
			if err != nil || rep.Type != proxy.TypeReply || rep.ID != id || string(rep.Result) != `{"n":1}` {
				t.Fatalf("reply %+v (err %v), want call %d's parameters back", rep, err, id)
			}
		}
		// A call the host refuses is refused on the channel too.
		_ = cw.Write(&proxy.Frame{Type: proxy.TypeCall, ID: 9, Method: "no_such"})
		if rep, err := cread.Read(); err != nil || rep.ID != 9 || rep.Error == "" {
			t.Fatalf("reply %+v (err %v), want a refusal of an unknown method", rep, err)
		}
		done(cr, 3)
		if r := <-res; r.ExitCode != 3 || r.Status != sandbox.StatusError {
			t.Fatalf("result %+v", r)
		}
		closedBy(t, ex.ch, "after the job")
	})

	t.Run("EachJobItsOwn", func(t *testing.T) {
		// The next job's channel is made while the runner is idle (after
		// its ready frame); the last job's stays closed.
		rc, cr := setupChannel(t)
		var chans []net.Conn
		for i := range 2 {
			res := driveChannel(t, rc, fresh)
			ex := cr.readExec()
			if ex.err != nil || ex.ch == nil {
				t.Fatalf("job %d: no call channel: %v", i, ex.err)
			}
			chans = append(chans, ex.ch)
			cw, cread := proxy.NewWriter(ex.ch, 0), proxy.NewReader(ex.ch, 0)
			if err := cw.Write(&proxy.Frame{Type: proxy.TypeCall, ID: 1, Method: proxy.MethodCallTool, Params: json.RawMessage(`{}`)}); err != nil {
				t.Fatal(err)
			}
			if rep, err := cread.Read(); err != nil || rep.ID != 1 || rep.Error != "" {
				t.Fatalf("job %d: reply %+v (err %v)", i, rep, err)
			}
			done(cr, 3)
			<-res
			if err := cr.w.Write(&proxy.Frame{Type: proxy.TypeReady, Spares: []string{sandbox.Python}}); err != nil {
				t.Fatal(err)
			}
		}
		for i, ch := range chans {
			closedBy(t, ch, fmt.Sprintf("job %d's channel after the jobs", i))
		}
	})

	for _, tc := range []struct {
		name string
		send func(net.Conn)
	}{
		{"ADoneOnItIsNotTheJobs", func(c net.Conn) {
			_ = proxy.NewWriter(c, 0).Write(&proxy.Frame{Type: proxy.TypeDone, Job: "j", Status: "success"})
		}},
		{"ACallOfAnotherJob", func(c net.Conn) {
			_ = proxy.NewWriter(c, 0).Write(&proxy.Frame{Type: proxy.TypeCall, Job: "other", ID: 1, Method: proxy.MethodCallTool})
		}},
		{"AFrameOverItsLimit", func(c net.Conn) {
			_, _ = c.Write(binary.BigEndian.AppendUint32(nil, 1<<30))
		}},
		{"NotJSON", func(c net.Conn) {
			_, _ = c.Write(append(binary.BigEndian.AppendUint32(nil, 5), "hello"...))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, cr := setupChannel(t)
			res := driveChannel(t, rc, fresh)
			ex := cr.readExec()
			if ex.err != nil || ex.ch == nil {
				t.Fatalf("no call channel: %v", ex.err)
			}
			tc.send(ex.ch)
			closedBy(t, ex.ch, tc.name)
			// The job goes on, and ends with the runner's done, not the code's.
			done(cr, 4)
			if r := <-res; r.ExitCode != 4 || r.Status != sandbox.StatusError {
				t.Fatalf("result %+v, want the runner's done (exit 4)", r)
			}
		})
	}

	t.Run("NoneForSessionsNorJavaScript", func(t *testing.T) {
		for _, job := range []sandbox.Job{
			{ID: "j", Code: "x", Timeout: 10 * time.Second},                                            // a session's job
			{ID: "j", Code: "x", Fresh: true, Language: sandbox.JavaScript, Timeout: 10 * time.Second}, // JavaScript
		} {
			rc, cr := setupChannel(t)
			res := driveChannel(t, rc, job)
			ex := cr.readExec()
			if ex.err != nil || ex.nfds != 0 || ex.f.CallChannel {
				t.Fatalf("job %+v: exec %+v with %d fds (err %v), want none", job, ex.f, ex.nfds, ex.err)
			}
			done(cr, 5)
			<-res
		}
	})

	t.Run("NoneForARunnerThatDoesNotTakeThem", func(t *testing.T) {
		host, sb := unixPair(t)
		cr := &channelRunner{conn: sb, w: proxy.NewWriter(sb, 0)}
		rc := sandbox.NewRunnerConn(host, 0)
		t.Cleanup(func() { _ = rc.Close() }) // the test is over with it
		if err := cr.w.Write(&proxy.Frame{Type: proxy.TypeHello, Version: 2}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := rc.Handshake(ctx, ""); err != nil {
			t.Fatal(err)
		}
		res := driveChannel(t, rc, fresh)
		if ex := cr.readExec(); ex.err != nil || ex.nfds != 0 || ex.f.CallChannel {
			t.Fatalf("exec %+v with %d fds (err %v), want none", ex.f, ex.nfds, ex.err)
		}
		done(cr, 5)
		<-res
	})
}
