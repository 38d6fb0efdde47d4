package sandbox_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// directHello is the hello of a runner whose Python spare takes its job's
// exec directly, and which runs code naming pandas elsewhere.
func directHello(spares ...string) *proxy.Frame {
	return &proxy.Frame{Type: proxy.TypeHello, Version: 2, CallChannel: true, DirectExec: true,
		DataWords: []string{"pandas", "numpy"}, Spares: spares}
}

// setupDirect returns a handshaken RunnerConn whose runner takes direct
// execs, and the call channel the host handed it after the hello.
func setupDirect(t *testing.T) (*sandbox.RunnerConn, *channelRunner, net.Conn) {
	t.Helper()
	return setupDirectMax(t, 0)
}

// setupDirectMax is setupDirect with the RunnerConn's frame limit.
func setupDirectMax(t *testing.T, maxFrame int) (*sandbox.RunnerConn, *channelRunner, net.Conn) {
	t.Helper()
	rc, cr, err := handshake(t, directHello(sandbox.Python), maxFrame)
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	return rc, cr, handed(t, cr)
}

// handed reads the channel frame the host sends an idle runner, and
// returns the channel that came with it.
func handed(t *testing.T, cr *channelRunner) net.Conn {
	t.Helper()
	ex := cr.readExec()
	if ex.err != nil || ex.f.Type != proxy.TypeChannel || !ex.f.CallChannel || ex.nfds != 1 {
		t.Fatalf("frame %+v with %d fds (err %v), want a channel frame with the next job's call channel", ex.f, ex.nfds, ex.err)
	}
	t.Cleanup(func() { _ = ex.ch.Close() })
	return ex.ch
}

// readPlain reads one frame that comes without a file, byte for byte (a
// read of more could take the start of the next frame).
func (cr *channelRunner) readPlain(t *testing.T) *proxy.Frame {
	t.Helper()
	var head [4]byte
	if _, err := io.ReadFull(cr.conn, head[:]); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint32(head[:]))
	if _, err := io.ReadFull(cr.conn, body); err != nil {
		t.Fatal(err)
	}
	f := new(proxy.Frame)
	if err := json.Unmarshal(body, f); err != nil {
		t.Fatal(err)
	}
	return f
}

// endsUnread checks that the host closed ch having written nothing on it:
// the spare that holds it got no exec.
func endsUnread(t *testing.T, ch net.Conn) {
	t.Helper()
	_ = ch.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := ch.Read(make([]byte, 4096))
	if n != 0 || !(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		t.Fatalf("the spare's channel gave %d bytes (err %v), want its end and nothing before it", n, err)
	}
}

// TestDirectExec: a runner whose Python spare waits gets the next job's
// call channel while idle; a fresh Python job's exec then goes on that
// channel, to the spare, and to the runner marked direct. Every other job
// goes the old way, and the handed channel is closed: the spare never
// sees an exec it must not run.
func TestDirectExec(t *testing.T) {
	fresh := sandbox.Job{ID: "j", Code: "print(1)", Servers: []string{"s1"}, Fresh: true, Timeout: 10 * time.Second}
	done := func(cr *channelRunner, exit int) {
		_ = cr.w.Write(&proxy.Frame{Type: proxy.TypeDone, Job: "j", Status: "error", ExitCode: exit})
	}
	call := func(t *testing.T, ch net.Conn, id uint64) {
		t.Helper()
		if err := proxy.NewWriter(ch, 0).Write(&proxy.Frame{Type: proxy.TypeCall, ID: id, Method: proxy.MethodCallTool, Params: json.RawMessage(`{"n":1}`)}); err != nil {
			t.Fatal(err)
		}
		_ = ch.SetReadDeadline(time.Now().Add(5 * time.Second))
		if rep, err := proxy.NewReader(ch, 0).Read(); err != nil || rep.Type != proxy.TypeReply || rep.ID != id || string(rep.Result) != `{"n":1}` {
			t.Fatalf("reply %+v (err %v), want call %d's parameters back", rep, err, id)
		}
	}

	t.Run("ExecOnTheHandedChannel", func(t *testing.T) {
		rc, cr, ch := setupDirect(t)
		for i, code := range []string{"print(1)", "pandas_free = 1"} { // the second names no data word as a word
			job := fresh
			job.Code = code
			res := driveChannel(t, rc, job)
			_ = ch.SetReadDeadline(time.Now().Add(5 * time.Second))
			spare, err := proxy.NewReader(ch, 0).Read()
			if err != nil || spare.Type != proxy.TypeExec || spare.Code != code || strings.Join(spare.Servers, ",") != "s1" || spare.Job != "" || spare.Direct {
				t.Fatalf("job %d: the spare read %+v (err %v), want its code and servers, nothing more", i, spare, err)
			}
			ex := cr.readExec()
			if ex.err != nil || ex.f.Type != proxy.TypeExec || !ex.f.Direct || ex.nfds != 0 || ex.f.Job != "j" || ex.f.Code != code {
				t.Fatalf("job %d: the runner read %+v with %d fds (err %v), want the exec marked direct", i, ex.f, ex.nfds, ex.err)
			}
			call(t, ch, 1) // the job's calls go on the channel it came on
			done(cr, 3)
			if r := <-res; r.ExitCode != 3 || r.Status != sandbox.StatusError {
				t.Fatalf("job %d: result %+v", i, r)
			}
			closedBy(t, ch, "after the job")
			if n := rc.DirectExecs(); n != uint64(i+1) {
				t.Fatalf("%d direct execs after job %d", n, i)
			}
			// Swept and armed again: the next job's channel is handed over.
			if err := cr.w.Write(&proxy.Frame{Type: proxy.TypeReady, Spares: []string{sandbox.Python}}); err != nil {
				t.Fatal(err)
			}
			ch = handed(t, cr)
		}
	})

	for _, tc := range []struct {
		name    string
		job     func(sandbox.Job) sandbox.Job
		channel bool // the exec comes with a call channel of its own
	}{
		{"CodeNamingADataWord", func(j sandbox.Job) sandbox.Job { j.Code = "import pandas as pd"; return j }, true},
		{"CodeTooLarge", func(j sandbox.Job) sandbox.Job { j.Code = strings.Repeat("#", 33<<10); return j }, true},
		{"InputFiles", func(j sandbox.Job) sandbox.Job {
			j.Files = []sandbox.File{{Name: "in.txt", Data: []byte("x")}}
			return j
		}, true},
		{"ASessionsJob", func(j sandbox.Job) sandbox.Job { j.Fresh = false; return j }, false},
		{"JavaScript", func(j sandbox.Job) sandbox.Job { j.Language = sandbox.JavaScript; return j }, false},
	} {
		t.Run("TheOldWayFor"+tc.name, func(t *testing.T) {
			rc, cr, ch := setupDirect(t)
			job := tc.job(fresh)
			res := driveChannel(t, rc, job)
			if len(job.Files) > 0 {
				if f := cr.readPlain(t); f.Type != proxy.TypeFile {
					t.Fatalf("frame %+v, want the input file", f)
				}
			}
			ex := cr.readExec()
			if ex.err != nil || ex.f.Type != proxy.TypeExec || ex.f.Direct || ex.f.CallChannel != tc.channel || (ex.nfds == 1) != tc.channel {
				t.Fatalf("exec %+v with %d fds (err %v), want the old way (a channel of its own: %v)", ex.f, ex.nfds, ex.err, tc.channel)
			}
			endsUnread(t, ch)
			done(cr, 4)
			<-res
			if n := rc.DirectExecs(); n != 0 {
				t.Fatalf("%d direct execs", n)
			}
		})
	}

	t.Run("CodeThatGrowsWhenEncoded", func(t *testing.T) {
		// 12 KiB of '<' is 72 KiB once escaped, over this runner's 64 KiB
		// frame: the job is refused as too large, and the spare, which must
		// never start what its supervisor does not hear of, got nothing.
		rc, _, ch := setupDirectMax(t, 64<<10)
		job := fresh
		job.Code = strings.Repeat("<", 12<<10)
		r := <-driveChannel(t, rc, job)
		if r.Status != sandbox.StatusError || !strings.Contains(r.Error, "too large") || !rc.Reusable() {
			t.Fatalf("result %+v (reusable %v), want the job refused as too large and the runner untouched", r, rc.Reusable())
		}
		endsUnread(t, ch)
	})

	t.Run("ADeadChannelFallsBack", func(t *testing.T) {
		// The runner closed the channel (it had no spare to give it to).
		rc, cr, ch := setupDirect(t)
		_ = ch.Close()
		res := driveChannel(t, rc, fresh)
		ex := cr.readExec()
		if ex.err != nil || ex.f.Direct || !ex.f.CallChannel || ex.nfds != 1 {
			t.Fatalf("exec %+v with %d fds (err %v), want the old way with a new channel", ex.f, ex.nfds, ex.err)
		}
		call(t, ex.ch, 1)
		done(cr, 5)
		if r := <-res; r.ExitCode != 5 {
			t.Fatalf("result %+v", r)
		}
	})

	t.Run("ASpareThatSpeaksFirstLosesIt", func(t *testing.T) {
		// Nothing may come on the channel before its job: the host closes
		// it, and the job goes the old way.
		rc, cr, ch := setupDirect(t)
		if err := proxy.NewWriter(ch, 0).Write(&proxy.Frame{Type: proxy.TypeCall, ID: 1, Method: proxy.MethodCallTool}); err != nil {
			t.Fatal(err)
		}
		closedBy(t, ch, "a channel that spoke before its job")
		res := driveChannel(t, rc, fresh)
		if ex := cr.readExec(); ex.err != nil || ex.f.Direct || ex.nfds != 1 {
			t.Fatalf("exec %+v with %d fds (err %v), want the old way with a new channel", ex.f, ex.nfds, ex.err)
		}
		done(cr, 5)
		<-res
	})

	t.Run("NoneWithoutAPythonSpare", func(t *testing.T) {
		rc, cr, err := handshake(t, directHello(sandbox.JavaScript), 0)
		if err != nil {
			t.Fatal(err)
		}
		res := driveChannel(t, rc, fresh)
		if ex := cr.readExec(); ex.err != nil || ex.f.Type != proxy.TypeExec || ex.f.Direct || ex.nfds != 1 {
			t.Fatalf("first frame %+v with %d fds (err %v), want the exec with its channel: no channel frame", ex.f, ex.nfds, ex.err)
		}
		done(cr, 5)
		<-res
	})

	t.Run("HelloWithBadDataWords", func(t *testing.T) {
		for _, words := range [][]string{{"os; import x"}, {"numpy", "(?:)"}, make([]string, 65)} {
			for i := range words {
				if words[i] == "" {
					words[i] = "m"
				}
			}
			h := directHello(sandbox.Python)
			h.DataWords = words
			if _, _, err := handshake(t, h, 0); !errors.Is(err, proxy.ErrBadFrame) {
				t.Fatalf("words %.3q: handshake %v, want a bad frame", words, err)
			}
		}
	})
}
