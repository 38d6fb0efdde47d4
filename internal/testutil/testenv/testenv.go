// Package testenv is the leaf of the test helpers: what a test needs to know
// about its environment (a logger, whether Podman or Docker must be there)
// without importing the fleet. Runtime test packages (podmantest, the
// sandbox suites) use it; testutil, which starts brokers, workers and
// front-ends, builds on it.
package testenv

import (
	"fmt"
	"log/slog"
	"os"
	"testing"
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
