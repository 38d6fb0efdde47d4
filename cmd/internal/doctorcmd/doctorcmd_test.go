package doctorcmd

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/doctor"
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
