// Package process is a sandbox.Runtime that runs the runner as a plain child
// process of the host's python3. It isolates nothing: it exists to test queue,
// protocol and proxy logic fast, and passes the protocol part of the sandbox
// conformance suite. Never use it for untrusted code.
package process

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// Runtime runs each job in a fresh python3 process, or a session's jobs in the
// session's process.
type Runtime struct {
	Python string // interpreter; default "python3"
	dir    string
	seq    atomic.Uint64

	sandbox.SessionMethods[*proc]
}

var (
	_ sandbox.SessionRuntime = (*Runtime)(nil)
	_ sandbox.StartReporter  = (*Runtime)(nil)
)

// ReportsStart implements sandbox.StartReporter.
func (r *Runtime) ReportsStart() {}

// Languages implements sandbox.LanguageReporter: Python, and JavaScript when
// the host has Node.js (the runner finds node on its PATH).
func (r *Runtime) Languages() []string {
	if _, err := exec.LookPath("node"); err == nil {
		return []string{sandbox.Python, sandbox.JavaScript}
	}
	return []string{sandbox.Python}
}

// New writes the runner to a temporary directory and returns a Runtime.
func New() (*Runtime, error) {
	dir, err := os.MkdirTemp("", "mcpexec-proc-")
	if err != nil {
		return nil, fmt.Errorf("create runner dir: %w", err)
	}
	if err := sandbox.WriteRunner(dir); err != nil {
		return nil, err
	}
	// Run as nobody when we are root, so that the code is no more privileged
	// than in a container: it must not be able to reach the runner's host
	// connection through /proc (root could, whatever the runner does).
	if os.Geteuid() == 0 {
		if err := os.Chmod(dir, 0o755); err != nil {
			return nil, err
		}
	}
	r := &Runtime{Python: "python3", dir: dir}
	r.Sessions = &sandbox.Sessions[*proc]{
		Start:     r.start,
		Drive:     drive,
		Reusable:  func(p *proc) bool { return p.rc.Reusable() },
		Discard:   (*proc).kill,
		ErrClosed: errors.New("process sandbox: runtime is closed"),
	}
	return r, nil
}

// Close ends every session and removes the runner directory.
func (r *Runtime) Close() error {
	r.Sessions.Close()
	return os.RemoveAll(r.dir)
}

// nobody is the user and group the runner runs as when the host process is root.
const nobody = 65534

// proc is one runner process and its connection.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been waited for
	ln     net.Listener
	sock   string
	rc     *sandbox.RunnerConn
	ws     string // its workspace directory
}

func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // the group may be gone already
	<-p.exited
	if p.rc != nil {
		_ = p.rc.Close() // the runner is dead: closing only frees the connection
	}
	_ = p.ln.Close()       // nothing may connect any more; a failure leaves nothing to do
	_ = os.Remove(p.sock)  // best effort: the socket lives in the runtime's own directory
	_ = os.RemoveAll(p.ws) // best effort, likewise
}

// start starts a runner and waits for its hello.
func (r *Runtime) start(ctx context.Context) (*proc, error) {
	sock := filepath.Join(r.dir, fmt.Sprintf("s%d.sock", r.seq.Add(1)))
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen for runner: %w", err)
	}
	secret := sandbox.NewSecret()
	python := r.Python
	if os.Geteuid() == 0 && !filepath.IsAbs(python) {
		// Look it up now: as nobody, root's PATH entries may be closed.
		for _, d := range []string{"/usr/bin", "/usr/local/bin", "/bin"} {
			if p := filepath.Join(d, python); isExecutable(p) {
				python = p
				break
			}
		}
	}
	cmd := exec.Command(python, filepath.Join(r.dir, "runner.py"), sock)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + r.dir, "PYTHONDONTWRITEBYTECODE=1", sandbox.SecretEnv + "=" + secret}
	// Its workspace (the runner places input files and collects /workspace/out there).
	ws := filepath.Join(r.dir, fmt.Sprintf("w%d", r.seq.Add(1)))
	if err := os.Mkdir(ws, 0o700); err != nil {
		_ = ln.Close() // err is what the caller hears
		return nil, fmt.Errorf("make the runner's workspace: %w", err)
	}
	if os.Geteuid() == 0 {
		_ = os.Chown(ws, nobody, nobody) // without it, writes fail and say so
	}
	cmd.Dir = ws
	// Its own process group, so that kill ends whatever the code started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() == 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: nobody, Gid: nobody}
		if err := os.Chmod(sock, 0o777); err != nil {
			_ = ln.Close() // err is what the caller hears
			return nil, err
		}
	}
	if err := cmd.Start(); err != nil {
		_ = ln.Close()      // err is what the caller hears
		_ = os.Remove(sock) // best effort: the socket lives in the runtime's own directory
		_ = os.RemoveAll(ws)
		return nil, fmt.Errorf("start runner: %w", err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{}), ln: ln, sock: sock, ws: ws}
	go func() {
		_ = cmd.Wait() // killed or ended: how it exited tells nothing here
		close(p.exited)
	}()
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if p.rc, err = sandbox.AcceptRunner(startCtx, ln, 0, secret); err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

// drive runs job on p within the job's time limit.
func drive(ctx context.Context, p *proc, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	res, err := p.rc.Exec(ctx, job, host)
	if errors.Is(err, sandbox.ErrRunnerLost) {
		res.Status, res.ExitCode = sandbox.StatusError, -1
		res.Error = "sandbox process exited before the job finished"
		return res, nil
	}
	return res, err
}

// Run implements sandbox.Runtime.
func (r *Runtime) Run(ctx context.Context, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	p, err := r.start(ctx)
	if err != nil {
		return sandbox.Result{}, err
	}
	defer p.kill()
	return drive(ctx, p, job, host)
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o001 != 0
}
