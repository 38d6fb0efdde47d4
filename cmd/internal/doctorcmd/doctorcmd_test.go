package doctorcmd

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/doctor"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

func TestFrontendDoctorFailsWithoutBroker(t *testing.T) {
	var out, errOut bytes.Buffer
	err := Main(context.Background(), "frontend", []string{"--nats", "nats://127.0.0.1:1"}, &out, &errOut)
	if !errors.Is(err, doctor.ErrFailed) || cli.ExitCode(err) != cli.ExitFailure {
		t.Fatalf("err %v (exit %d)", err, cli.ExitCode(err))
	}
	if !strings.Contains(out.String(), "FAIL  nats") || !strings.Contains(out.String(), "fix: start the broker") {
		t.Fatalf("report:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "skip  sandbox") {
		t.Fatalf("a fleet front-end checked a sandbox:\n%s", out.String())
	}
}

func TestDoctorBadFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	err := Main(context.Background(), "worker", []string{"--memory", "lots"}, &out, &errOut)
	if cli.ExitCode(err) != cli.ExitUsage {
		t.Fatalf("err %v (exit %d)", err, cli.ExitCode(err))
	}
}

func TestWorkerDoctorReportsDocker(t *testing.T) {
	host := testutil.DockerHost()
	if host == "" {
		testutil.SkipOrFailDocker(t, "no Docker engine for the test (MCPEXEC_DOCKER)")
	}
	var out, errOut bytes.Buffer
	err := Main(context.Background(), "worker", []string{"--runtime", "docker", "--docker", host, "--nats", "nats://127.0.0.1:1"}, &out, &errOut)
	t.Log(out.String())
	if strings.Contains(out.String(), "FAIL  docker api") {
		testutil.SkipOrFailDocker(t, "Docker unavailable at %s", host)
	}
	if !errors.Is(err, doctor.ErrFailed) { // NATS is not there
		t.Fatalf("err %v", err)
	}
	for _, want := range []string{"ok    runtime                docker (--runtime docker)", "ok    docker api", "ok    sandbox starts", "FAIL  nats"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
