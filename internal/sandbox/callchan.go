package sandbox

// A fresh Python job's calls come to the host on a channel of their own: a
// socket pair the host makes for the job, whose other end goes to the runner
// with the exec frame (SCM_RIGHTS) and from the supervisor to the job's
// process with its exec frame. The calls then skip the supervisor, whose
// relaying cost each call two process wake-ups (one each way), tens of
// microseconds apiece on a virtual machine.
//
// The channel is the job's: the host closes its end when the job ends, so a
// process the job left behind holds a dead socket; its reader then ends by
// itself. The host makes the next job's channel, and starts its reader,
// while the runner is idle (when it says it is armed), so that neither is on
// the job's path. What comes on it is the code's, and is checked as any call
// frame from the sandbox is: the same frame budget as the runner's
// connection, the same gate (bounds on calls in flight, their bytes and
// their rate), and only call frames of the job while it runs; any other
// frame closes the channel, and the code's later calls fail.

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mcpexec/mcpexec/internal/proxy"
)

// callChannelRead is the read buffer of a job's call channel.
const callChannelRead = 32 << 10

// callChannelMax is the largest frame a call channel reads: a call's
// parameters at their limit and the frame around them.
const callChannelMax = proxy.MaxRequest + 4096

// replySink is where a call's reply goes: the runner's connection, or the
// job's call channel.
type replySink interface {
	// write sends a frame within WriteTimeout.
	write(f *proxy.Frame) error
	// sendAsync sends a small frame (a refusal) without blocking its reader.
	sendAsync(f *proxy.Frame)
}

// callChannel is the host's end of a job's call channel.
type callChannel struct {
	conn net.Conn
	r    *proxy.Reader
	wmu  sync.Mutex // guards w, and orders writes
	w    *proxy.Writer
	once sync.Once
	done chan struct{} // closed by close: serve returns
	// jc is the job the channel serves, from Drive's start to its end; a
	// frame that comes while it is nil closes the channel.
	jc atomic.Pointer[jobCalls]
}

// openCallChannel makes a job's call channel: the host's end, and the
// other end as a file to send to the runner (then close).
func openCallChannel() (*callChannel, *os.File, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("call channel: %w", err)
	}
	hf := os.NewFile(uintptr(fds[0]), "calls")
	conn, err := net.FileConn(hf)
	_ = hf.Close() // FileConn holds a copy of its own
	peer := os.NewFile(uintptr(fds[1]), "calls-peer")
	if err != nil {
		_ = peer.Close()
		return nil, nil, fmt.Errorf("call channel: %w", err)
	}
	return &callChannel{
		conn: conn,
		r:    proxy.NewReader(bufio.NewReaderSize(conn, callChannelRead), callChannelMax),
		w:    proxy.NewWriter(conn, 0),
		done: make(chan struct{}),
	}, peer, nil
}

// serve passes the call frames read to serveCall for the channel's job
// until the channel is closed or breaks the protocol. Frames are drawn from
// the runner's frame budget: the code gets no more frames a second by
// having two ways to send them.
func (ch *callChannel) serve(c *RunnerConn) {
	for c.frameTokens.wait(ch.done) {
		f, err := ch.r.Read()
		if err != nil {
			ch.close() // closed, or a bad frame: the code's later calls fail
			return
		}
		jc := ch.jc.Load()
		if jc == nil || f.Type != proxy.TypeCall || !jc.owns(f) {
			ch.close() // only the job's calls come this way, while it runs
			return
		}
		serveCall(ch, jc.gate, jc.host, f)
	}
}

// startCallChannel makes a channel and starts its reader.
func (c *RunnerConn) startCallChannel() (*callChannel, *os.File, error) {
	ch, peer, err := openCallChannel()
	if err != nil {
		return nil, nil, err
	}
	go ch.serve(c)
	return ch, peer, nil
}

// prepareCallChannel makes the next job's channel ahead, when the runner
// takes them and none waits: called as the runner says it is armed (its
// hello, its ready frame), which is when it is idle. With hand (the
// runner's Python spare waits) and a runner that takes its exec directly,
// the other end goes to the runner at once (a channel frame), for that
// spare.
func (c *RunnerConn) prepareCallChannel(hand bool) {
	if !c.callChannels {
		return
	}
	// Only arm makes one, under armMu: none is made meanwhile.
	c.chMu.Lock()
	made := c.next != nil || c.chClosed
	c.chMu.Unlock()
	if made {
		return
	}
	ch, peer, err := c.startCallChannel()
	if err != nil {
		return // the job opens one, or its calls come through the supervisor
	}
	p := &preparedChannel{ch: ch, peer: peer}
	if hand && c.directExec {
		// Written without chMu: a failed write closes the connection, whose
		// Close takes it. The caller holds armMu, which the next exec waits
		// for.
		err = c.writeWithFile(&proxy.Frame{Type: proxy.TypeChannel, CallChannel: true}, peer)
		_ = peer.Close() // sent (the runner holds a copy), or the connection is closed
		p.peer = nil
		if err != nil {
			ch.close()
			return
		}
	}
	c.chMu.Lock()
	defer c.chMu.Unlock()
	if c.chClosed {
		p.discard() // Close ran meanwhile
		return
	}
	c.next = p
}

// preparedChannel is a channel made ahead: the host's end, serving, and
// the end to send (nil once handed to the runner).
type preparedChannel struct {
	ch   *callChannel
	peer *os.File
}

// takePrepared returns the channel made ahead (nil if none), which is the
// caller's from then on.
func (c *RunnerConn) takePrepared() *preparedChannel {
	c.chMu.Lock()
	defer c.chMu.Unlock()
	p := c.next
	c.next = nil
	return p
}

// closeCallChannels closes the channel made ahead (Close).
func (c *RunnerConn) closeCallChannels() {
	c.chMu.Lock()
	p := c.next
	c.next, c.chClosed = nil, true
	c.chMu.Unlock()
	p.discard()
}

// discard closes a channel made ahead that no job takes.
func (p *preparedChannel) discard() {
	if p == nil {
		return
	}
	p.ch.close()
	if p.peer != nil {
		_ = p.peer.Close() // never sent
	}
}

func (ch *callChannel) write(f *proxy.Frame) error {
	ch.wmu.Lock()
	defer ch.wmu.Unlock()
	_ = ch.conn.SetWriteDeadline(time.Now().Add(WriteTimeout)) // a closed channel fails the write anyway
	err := ch.w.Write(f)
	if err != nil && !errors.Is(err, proxy.ErrFrameTooLarge) {
		ch.close() // a code that does not read its replies loses its channel
	}
	return err
}

// sendAsync writes a refusal from the reader itself: a code that stops
// reading its replies blocks only its own channel, for WriteTimeout at
// most, and then loses it.
func (ch *callChannel) sendAsync(f *proxy.Frame) { _ = ch.write(f) }

// close closes the host's end: the code's reads see the end, its writes
// fail.
func (ch *callChannel) close() {
	ch.once.Do(func() {
		close(ch.done)
		_ = ch.conn.Close() // ends serve's read; nothing else to do
	})
}

// oobWriter writes to a connection, attaching oob, when set, to the next
// write: how a job's call channel goes to the runner with its exec frame.
type oobWriter struct {
	conn net.Conn
	oob  []byte // set and used under RunnerConn.wmu
}

func (w *oobWriter) Write(b []byte) (int, error) {
	if w.oob == nil {
		return w.conn.Write(b)
	}
	oob := w.oob
	w.oob = nil
	uc, ok := w.conn.(*net.UnixConn)
	if !ok {
		return 0, errors.New("a file can go only over a Unix socket")
	}
	n, _, err := uc.WriteMsgUnix(b, oob, nil)
	if err == nil && n < len(b) {
		var m int
		m, err = uc.Write(b[n:])
		n += m
	}
	return n, err
}

// writeWithFile sends frame f with file attached (SCM_RIGHTS).
func (c *RunnerConn) writeWithFile(f *proxy.Frame, file *os.File) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.ow.oob = syscall.UnixRights(int(file.Fd()))
	defer func() { c.ow.oob = nil }() // not written when f was too large
	return c.writeLocked(f)
}

// sendExec writes a job's exec frame, with a call channel for a fresh
// Python job when the runner takes one; it returns the channel, serving
// jc's calls (nil: the job's calls come through the supervisor, as a
// session's and a JavaScript job's do). On an error no channel is left
// open.
func (c *RunnerConn) sendExec(exec *proxy.Frame, job Job, jc *jobCalls) (*callChannel, error) {
	p := c.takePrepared()
	takes := c.callChannels && job.Fresh && (job.Language == "" || job.Language == Python)
	if p != nil && p.peer == nil {
		// Handed to the runner's Python spare: this job's, sent there, or
		// no job's.
		if takes && c.direct(job) {
			if ch, err := c.sendDirect(exec, job, p.ch, jc); ch != nil || err != nil {
				return ch, err
			}
		}
		p.discard()
		p = nil
	}
	if !takes {
		p.discard()
		return nil, c.write(exec)
	}
	var (
		ch   *callChannel
		peer *os.File
		err  error
	)
	if p != nil {
		ch, peer = p.ch, p.peer
	} else if ch, peer, err = c.startCallChannel(); err != nil {
		return nil, c.write(exec) // no socket to spare: the supervisor relays
	}
	defer func() { _ = peer.Close() }() // the runner has a copy of its own once it is sent
	ch.jc.Store(jc)
	exec.CallChannel = true
	if err := c.writeWithFile(exec, peer); err != nil {
		ch.close()
		return nil, err
	}
	return ch, nil
}

// directMax bounds the code (and server names) of a job whose exec goes
// straight to the spare: under a socket's buffer even escaped (JSON may
// write a byte as six), so that the write into a fresh channel does not
// wait, and under the frame limit (direct).
const directMax = 16 << 10

// direct says whether job's exec may go straight to the spare that holds
// the channel handed over: a fresh Python job without input files (the
// supervisor places them before its code starts), small, whose code names
// none of the words of jobs run elsewhere.
func (c *RunnerConn) direct(job Job) bool {
	n := len(job.Code)
	for _, s := range job.Servers {
		n += len(s) + 3
	}
	return len(job.Files) == 0 && n <= directMax && 6*n+4096 <= c.maxFrame &&
		(c.dataWords == nil || !c.dataWords.MatchString(job.Code))
}

// sendDirect sends a job's exec to the spare on its call channel ch (code
// and servers, all the spare needs), then to the runner, marked direct:
// the code starts as the spare reads it, while the supervisor, woken
// beside it, adopts the spare. It returns ch serving the job, or, when the
// channel is dead (the runner had no spare to hand it to), nil and no
// error: nothing was sent, and the caller sends the exec as any other.
func (c *RunnerConn) sendDirect(exec *proxy.Frame, job Job, ch *callChannel, jc *jobCalls) (*callChannel, error) {
	ch.jc.Store(jc)
	if err := ch.write(&proxy.Frame{Type: proxy.TypeExec, Code: job.Code, Servers: job.Servers}); err != nil {
		ch.jc.Store(nil)
		return nil, nil
	}
	exec.Direct = true
	if err := c.write(exec); err != nil {
		// The spare may run the code already: whatever failed (even a
		// frame too large, which direct's bound rules out), the runner is
		// lost, not untouched.
		ch.close()
		_ = c.Close() // err is what the caller hears
		// Not wrapped: never ErrFrameTooLarge, which says untouched.
		return nil, fmt.Errorf("send a direct exec: %s", err.Error())
	}
	c.directs.Add(1)
	return ch, nil
}

// maxDataWords bounds the words of a runner's hello (its preload modules).
const maxDataWords = 64

// wordsPattern is the pattern of code that names one of words as a word,
// as the runner's own check (a regular expression with \b around the
// names); nil for none. Go's \b knows only ASCII letters, which makes it
// match wherever Python's does (the names are ASCII identifiers): a job
// the runner would send elsewhere is never sent to its spare.
func wordsPattern(words []string) (*regexp.Regexp, error) {
	if len(words) == 0 {
		return nil, nil
	}
	if len(words) > maxDataWords {
		return nil, fmt.Errorf("%d data words, at most %d: %w", len(words), maxDataWords, proxy.ErrBadFrame)
	}
	quoted := make([]string, len(words))
	for i, w := range words {
		if !moduleName(w) {
			return nil, fmt.Errorf("data word %.40q is not a module name: %w", w, proxy.ErrBadFrame)
		}
		quoted[i] = regexp.QuoteMeta(w)
	}
	return regexp.Compile(`\b(?:` + strings.Join(quoted, "|") + `)\b`)
}
