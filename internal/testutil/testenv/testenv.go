// Package testenv is the leaf of the test helpers: what a test needs to know
// about its environment (a logger, whether Podman or Docker must be there)
// without importing the fleet. Runtime test packages (podmantest, the
// sandbox suites) use it; testutil, which starts brokers, workers and
// front-ends, builds on it.
package testenv

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// Logger returns a logger that writes to the test log when -v is given.
func Logger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// The variables that make tests needing an engine fail rather than skip.
const (
	requirePodmanEnv = "MCPEXEC_REQUIRE_PODMAN"
	requireDockerEnv = "MCPEXEC_REQUIRE_DOCKER"
)

// RequirePodman reports whether tests needing Podman must fail rather than skip
// (CI sets MCPEXEC_REQUIRE_PODMAN=1).
func RequirePodman() bool { return os.Getenv(requirePodmanEnv) == "1" }

// SkipOrFail skips the test with reason, or fails it when Podman is required.
func SkipOrFail(t testing.TB, reason string, args ...any) {
	t.Helper()
	skipOrFail(t, requirePodmanEnv, fmt.Sprintf(reason, args...))
}

// skipOrFail skips the test with msg, or fails it when $env is 1.
func skipOrFail(t testing.TB, env, msg string) {
	t.Helper()
	if os.Getenv(env) == "1" {
		t.Fatalf("%s=1 but %s", env, msg)
	}
	t.Skip(msg)
}

// RequireDocker reports whether tests needing the Docker engine must fail
// rather than skip (make test sets MCPEXEC_REQUIRE_DOCKER=1 once it started
// the engine).
func RequireDocker() bool { return os.Getenv(requireDockerEnv) == "1" }

// SkipOrFailDocker skips the test with reason, or fails it when Docker is
// required.
func SkipOrFailDocker(t testing.TB, reason string, args ...any) {
	t.Helper()
	skipOrFail(t, requireDockerEnv, fmt.Sprintf(reason, args...))
}

// DockerHost is the engine the Docker tests use: $MCPEXEC_DOCKER (make test
// points it at the engine deploy/docker/start-dockerd.sh starts), else ""
// ($DOCKER_HOST, else the default socket).
func DockerHost() string { return os.Getenv("MCPEXEC_DOCKER") }

// Command is exec.Command bounded by d: the process is killed once d has
// passed, and its output pipes are given 10 s more to close (a child it left
// may hold them). A CLI that waits on a wedged lock (Podman's, after a fault
// test) then fails its test instead of hanging the package. Call cancel when
// the command is done.
func Command(d time.Duration, name string, args ...string) (cmd *exec.Cmd, cancel context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	cmd = exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 10 * time.Second
	return cmd, cancel
}

// CLITimeout bounds the CLI calls of tests (podman ps, create, save…):
// minutes more than any of them takes on a loaded machine.
const CLITimeout = 2 * time.Minute

// Receive returns the next value from ch, failing the test (naming what it
// waited for) when none comes within d: a bare receive from a goroutine
// that failed, or from a process that never started, waits forever.
func Receive[T any](t testing.TB, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %s", what, d)
		var zero T
		return zero
	}
}

// Context returns a context that ends after d, or when the test ends: for
// calls that return only when what they wait for comes, or their context
// ends.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Buffer is output that goroutines write (a logger's, a status line's) and
// a test reads back. The zero Buffer is empty and ready.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
