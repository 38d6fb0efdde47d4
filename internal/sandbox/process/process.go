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
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// Runtime runs each job in a fresh python3 process.
type Runtime struct {
	Python string // interpreter; default "python3"
	dir    string
}

var _ sandbox.Runtime = (*Runtime)(nil)

// New writes the runner to a temporary directory and returns a Runtime.
func New() (*Runtime, error) {
	dir, err := os.MkdirTemp("", "mcpexec-proc-")
	if err != nil {
		return nil, fmt.Errorf("create runner dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "runner.py"), sandbox.RunnerScript, 0o444); err != nil {
		return nil, fmt.Errorf("write runner: %w", err)
	}
	return &Runtime{Python: "python3", dir: dir}, nil
}

// Close removes the runner directory.
func (r *Runtime) Close() error { return os.RemoveAll(r.dir) }

// Run implements sandbox.Runtime.
func (r *Runtime) Run(ctx context.Context, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	sock := filepath.Join(r.dir, fmt.Sprintf("s%d.sock", time.Now().UnixNano()))
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return sandbox.Result{}, fmt.Errorf("listen for runner: %w", err)
	}
	defer ln.Close()
	defer os.Remove(sock)

	cmd := exec.Command(r.Python, filepath.Join(r.dir, "runner.py"), sock)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + r.dir, "PYTHONDONTWRITEBYTECODE=1"}
	cmd.Dir = r.dir
	if err := cmd.Start(); err != nil {
		return sandbox.Result{}, fmt.Errorf("start runner: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()

	startCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := accept(startCtx, ln)
	if err != nil {
		return sandbox.Result{}, fmt.Errorf("runner did not connect: %w", err)
	}
	rc := sandbox.NewRunnerConn(conn, 0)
	defer rc.Close()
	if err := rc.Handshake(startCtx); err != nil {
		return sandbox.Result{}, err
	}
	runCtx, cancelRun := context.WithTimeoutCause(ctx, job.Timeout, sandbox.ErrTimeout)
	defer cancelRun()
	res, err := rc.Drive(runCtx, job, host)
	if errors.Is(err, sandbox.ErrRunnerLost) {
		res.Status, res.ExitCode = sandbox.StatusError, -1
		res.Error = "sandbox process exited before the job finished"
		return res, nil
	}
	return res, err
}

func accept(ctx context.Context, ln net.Listener) (net.Conn, error) {
	type acc struct {
		c   net.Conn
		err error
	}
	ch := make(chan acc, 1)
	go func() {
		c, err := ln.Accept()
		ch <- acc{c, err}
	}()
	select {
	case a := <-ch:
		return a.c, a.err
	case <-ctx.Done():
		ln.Close()
		if a := <-ch; a.c != nil {
			a.c.Close()
		}
		return nil, ctx.Err()
	}
}
