package process_test

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// rawRunner is the runner started by the test, which plays its host frame
// by frame: what no RunnerConn sends (a host that breaks the protocol).
type rawRunner struct {
	conn *net.UnixConn
	r    *proxy.Reader
	w    *proxy.Writer
	ws   string // its workspace
	pid  int    // its supervisor's
}

func startRaw(t *testing.T) *rawRunner {
	t.Helper()
	dir := t.TempDir()
	if err := sandbox.WriteRunner(dir); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }() // one connection is all it takes
	ws := filepath.Join(dir, "ws")
	if err := os.Mkdir(ws, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", filepath.Join(dir, "runner.py"), sock)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "PYTHONDONTWRITEBYTECODE=1", sandbox.SecretEnv + "=s"}
	cmd.Dir = ws
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever is left of it
		_ = cmd.Wait()
	})
	_ = ln.(*net.UnixListener).SetDeadline(time.Now().Add(10 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	rr := &rawRunner{conn: c.(*net.UnixConn), r: proxy.NewReader(bufio.NewReader(c), 0), w: proxy.NewWriter(c, 0), ws: ws, pid: cmd.Process.Pid}
	hello, err := rr.r.Read()
	if err != nil || hello.Type != proxy.TypeHello || !hello.DirectExec || !strings.Contains(strings.Join(hello.Spares, ","), sandbox.Python) {
		t.Fatalf("hello %+v (err %v), want one that takes direct execs, its Python spare waiting", hello, err)
	}
	return rr
}

// hand sends a channel frame with one end of a new socket pair, and
// returns the other end.
func (rr *rawRunner) hand(t *testing.T) net.Conn {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	peer := os.NewFile(uintptr(fds[1]), "peer")
	defer func() { _ = peer.Close() }() // the runner has its copy
	mine := os.NewFile(uintptr(fds[0]), "mine")
	conn, err := net.FileConn(mine)
	_ = mine.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	body := `{"type":"channel","call_channel":true}`
	frame := append([]byte{0, 0, 0, byte(len(body))}, body...)
	if _, _, err := rr.conn.WriteMsgUnix(frame, syscall.UnixRights(fds[1]), nil); err != nil {
		t.Fatal(err)
	}
	return conn
}

// until reads frames up to the job's done.
func (rr *rawRunner) until(t *testing.T) (out string, done *proxy.Frame) {
	t.Helper()
	for {
		f, err := rr.r.Read()
		if err != nil {
			t.Fatalf("read: %v (output so far %q)", err, out)
		}
		switch f.Type {
		case proxy.TypeOut:
			out += f.Data
		case proxy.TypeDone:
			return out, f
		}
	}
}

// TestDirectExecFromABrokenHost: the runner's side of direct execs
// (RunnerConn's is TestDirectExec in package sandbox), against a host that
// does what RunnerConn never does.
func TestDirectExecFromABrokenHost(t *testing.T) {
	t.Run("WithoutAHandedSpareItRunsAsAnyOther", func(t *testing.T) {
		// A direct exec whose channel never reached the spare (a channel
		// frame without one): the supervisor sends the exec as usual.
		rr := startRaw(t)
		if err := rr.w.Write(&proxy.Frame{Type: proxy.TypeChannel}); err != nil {
			t.Fatal(err)
		}
		if err := rr.w.Write(&proxy.Frame{Type: proxy.TypeExec, Job: "a", Code: "print('ran once')", Fresh: true, Direct: true}); err != nil {
			t.Fatal(err)
		}
		out, done := rr.until(t)
		if out != "ran once\n" || done.Status != "success" || done.Job != "a" {
			t.Fatalf("output %q, done %+v: want the job run", out, done)
		}
	})

	t.Run("TheSpareRunsWhatCameOnItsChannel", func(t *testing.T) {
		// The exec comes on the handed channel, and to the supervisor: the
		// spare runs the channel's, once (RunnerConn sends the same code
		// both ways; here they differ, to tell which ran).
		rr := startRaw(t)
		ch := rr.hand(t)
		if err := proxy.NewWriter(ch, 0).Write(&proxy.Frame{Type: proxy.TypeExec, Code: "print('from the channel')"}); err != nil {
			t.Fatal(err)
		}
		if err := rr.w.Write(&proxy.Frame{Type: proxy.TypeExec, Job: "a", Code: "print('from the supervisor')", Fresh: true, Direct: true}); err != nil {
			t.Fatal(err)
		}
		out, done := rr.until(t)
		if out != "from the channel\n" || done.Status != "success" || done.Job != "a" {
			t.Fatalf("output %q, done %+v: want the channel's code run once", out, done)
		}
	})

	t.Run("ADirectExecItMayNotTakeRunsNothing", func(t *testing.T) {
		// A session's job marked direct, its code sent to the spare: the
		// supervisor must not adopt it (adopted, its output would come
		// back), so it fails the job and ends, and the spare that may have
		// started it dies (killed, and by its parent-death signal as the
		// zygote goes: the marker checks that it died, not which did it).
		rr := startRaw(t)
		ch := rr.hand(t)
		code := "import time\ntime.sleep(0.3)\nopen('marker', 'w').write('x')\nprint('ran')"
		if err := proxy.NewWriter(ch, 0).Write(&proxy.Frame{Type: proxy.TypeExec, Code: code}); err != nil {
			t.Fatal(err)
		}
		if err := rr.w.Write(&proxy.Frame{Type: proxy.TypeExec, Job: "b", Code: code, Direct: true}); err != nil {
			t.Fatal(err)
		}
		out, done := rr.until(t)
		if out != "" || done.Status != "error" || !done.Last || !strings.Contains(done.Error, "direct exec") {
			t.Fatalf("output %q, done %+v: want the job refused, and the runner's last frame", out, done)
		}
		time.Sleep(time.Second)
		if _, err := os.Stat(filepath.Join(rr.ws, "marker")); !os.IsNotExist(err) {
			t.Fatalf("the refused job's code ran (marker: %v)", err)
		}
	})
}
