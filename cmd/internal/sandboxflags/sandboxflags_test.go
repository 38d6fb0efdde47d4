package sandboxflags

import (
	"context"
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/sandbox/docker"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"512m": 512 << 20, "1g": 1 << 30, "65536k": 64 << 20, "1024": 1024, " 2G ": 2 << 30, "0": 0} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "m", "-1", "1t", "1.5g", "lots"} {
		if _, err := ParseBytes(in); err == nil {
			t.Errorf("%q was accepted", in)
		}
	}
}

func parse(t *testing.T, args ...string) *Flags {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	f := Register(fs)
	if err := cli.Parse(fs, args, Aliases); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return f
}

func TestRuntimeFlag(t *testing.T) {
	for _, env := range []string{"MCPEXEC_RUNTIME", "MCP_BRIDGE_RUNTIME", "MCPEXEC_DOCKER", "DOCKER_HOST", "MCPEXEC_ROOTFS", "MCPEXEC_USERNS"} {
		t.Setenv(env, "")
		_ = os.Unsetenv(env) // cannot fail for a valid name
	}
	if f := parse(t); f.Runtime != RuntimeAuto {
		t.Fatalf("default runtime %q", f.Runtime)
	}
	t.Setenv("MCP_BRIDGE_RUNTIME", "docker")
	if f := parse(t); f.Runtime != RuntimeDocker {
		t.Fatalf("MCP_BRIDGE_RUNTIME=docker gave %q", f.Runtime)
	}
	if f := parse(t, "--runtime", "podman"); f.Runtime != RuntimePodman {
		t.Fatalf("the flag does not win over the environment: %q", f.Runtime)
	}
	_ = os.Unsetenv("MCP_BRIDGE_RUNTIME") // cannot fail for a valid name

	for _, bad := range [][]string{
		{"--runtime", "lxc"},
		{"--runtime", "docker", "--rootfs", "/srv/rootfs"},
		{"--runtime", "docker", "--userns", "on"},
	} {
		if _, err := parse(t, bad...).Limits(); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	for _, good := range [][]string{{"--runtime", "docker"}, {"--runtime", "podman"}, {"--runtime", "auto", "--docker", "unix:///run/x.sock"}} {
		if _, err := parse(t, good...).Limits(); err != nil {
			t.Errorf("%v: %v", good, err)
		}
	}

	ctx := context.Background()
	if c := parse(t, "--runtime", "docker", "--docker", "tcp://127.0.0.1:1").Choose(ctx); c.Runtime != RuntimeDocker || c.DockerHost != "tcp://127.0.0.1:1" {
		t.Fatalf("--runtime docker chose %+v", c)
	}
	if c := parse(t, "--runtime", "docker").Choose(ctx); c.DockerHost != docker.DefaultHost {
		t.Fatalf("--runtime docker without --docker chose %+v", c)
	}
	t.Setenv("DOCKER_HOST", "unix:///run/elsewhere.sock")
	if c := parse(t, "--runtime", "docker").Choose(ctx); c.DockerHost != "unix:///run/elsewhere.sock" {
		t.Fatalf("DOCKER_HOST is not the default: %+v", c)
	}
	if c := parse(t, "--runtime", "podman").Choose(ctx); c.Runtime != RuntimePodman {
		t.Fatalf("--runtime podman chose %+v", c)
	}
	if c := parse(t, "--podman", "unix:///run/p.sock").Choose(ctx); c.Runtime != RuntimePodman {
		t.Fatalf("auto with --podman chose %+v", c)
	}
	if got := dockerCandidates(""); !slices.Equal(got, []string{"unix:///run/elsewhere.sock", docker.DefaultHost, MCPEXECDockerHost}) {
		t.Fatalf("candidates %v", got)
	}
}

// TestAutoWithoutPodman: auto falls back to a Docker engine that answers, and
// to Podman (and its install hint) when none does.
func TestAutoWithoutPodman(t *testing.T) {
	for _, s := range []string{"/run/podman/podman.sock"} {
		if _, err := os.Stat(s); err == nil {
			t.Skipf("%s exists: auto picks Podman here", s)
		}
	}
	t.Setenv("PATH", t.TempDir()) // no podman binary
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	ctx := context.Background()
	none := "unix://" + t.TempDir() + "/none.sock"
	if c := parse(t, "--docker", none).Choose(ctx); c.Runtime != RuntimePodman || !strings.Contains(c.Reason, "neither") {
		t.Fatalf("auto without any runtime chose %+v", c)
	}
	host := os.Getenv("MCPEXEC_DOCKER")
	if host == "" {
		t.Skip("no Docker engine to find (MCPEXEC_DOCKER)")
	}
	c := parse(t, "--docker", host).Choose(ctx)
	if c.Runtime != RuntimeDocker || c.DockerHost != host {
		if os.Getenv("MCPEXEC_REQUIRE_DOCKER") == "1" {
			t.Fatalf("auto without Podman did not pick the Docker engine at %s: %+v", host, c)
		}
		t.Skipf("the Docker engine at %s did not answer: %+v", host, c)
	}
	t.Logf("chose %+v", c)
}
