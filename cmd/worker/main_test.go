package main

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/cli"
)

// TestNamedIdentityFixesTheWorkerID: a named worker identity's seed runs as
// its name; another --id is refused before anything connects.
func TestNamedIdentityFixesTheWorkerID(t *testing.T) {
	seed := filepath.Join(t.TempDir(), "worker-host2.nk")
	err := run(context.Background(), []string{"--nats-nkey", seed, "--id", "host3"}, io.Discard)
	var ue *cli.UsageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), `answers only as worker id "host2"`) {
		t.Fatalf("--id host3 with worker-host2.nk: %v", err)
	}
}
