package main

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestSubmitCommandLine drives `frontend submit` as its command line does:
// flags, then the JSONL file; results go to --out.
func TestSubmitCommandLine(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.NewFakeRuntime(16), worker.DefaultConfig("w"))
	fe := testutil.Frontend(t, b, "fe")
	hs := httptest.NewServer(mcpserver.Handler(mcpserver.New(fe, mcpserver.Options{}), mcpserver.HTTPOptions{API: jobsapi.New(jobsapi.Config{Backend: fe})}))
	t.Cleanup(hs.Close)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "jobs.jsonl"), filepath.Join(dir, "results.jsonl")
	if err := os.WriteFile(in, []byte("{\"id\": \"a\", \"code\": \"one\"}\n{\"id\": \"b\", \"code\": \"two\", \"after\": [\"a\"]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err := submitCmd(context.Background(), []string{"--url", hs.URL, "--progress", "0", "--out", out, in}, nil, &stdout, &stderr)
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, stderr.String())
	}
	got, _ := os.ReadFile(out)
	if lines := strings.Split(strings.TrimSpace(string(got)), "\n"); len(lines) != 2 || !strings.Contains(string(got), `"status":"success"`) {
		t.Fatalf("results %s", got)
	}
	// Stdin, with -.
	err = submitCmd(context.Background(), []string{"--url", hs.URL, "--progress", "0", "-"}, strings.NewReader("{\"id\": \"c\", \"code\": \"three\"}\n"), &stdout, &stderr)
	if err != nil || !strings.Contains(stdout.String(), `"id":"c"`) {
		t.Fatalf("stdin: %v %s", err, stdout.String())
	}
	// Wrong command lines are usage errors that say what is wrong.
	for _, args := range [][]string{{}, {in, in}, {"--batch", "0", in}, {"--nope", in}} {
		stderr.Reset()
		err := submitCmd(context.Background(), args, nil, &stdout, &stderr)
		var ue *cli.UsageError
		if !errors.As(err, &ue) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}
