package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/natsauth"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
)

func TestCommandLine(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a broker that starts stops at once
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"beyond loopback without auth", []string{"--data", filepath.Join(dir, "d1"), "--listen", "0.0.0.0:0"}, cli.ExitFailure, "broker auth init DIR"},
		{"sync sometimes", []string{"--data", filepath.Join(dir, "d4"), "--sync", "sometimes"}, cli.ExitUsage, "want always or interval:D"},
		{"sync interval zero", []string{"--data", filepath.Join(dir, "d5"), "--sync", "interval:0s"}, cli.ExitUsage, "positive duration"},
		{"stall repair too soon", []string{"--data", filepath.Join(dir, "d6"), "--stall-repair", "2s"}, cli.ExitUsage, "--stall-repair must be -1 (never) or at least 10s"},
		{"unexpected argument", []string{"--data", filepath.Join(dir, "d2"), "serve"}, cli.ExitUsage, `unexpected argument "serve"`},
		{"queued max age under the dedupe window", []string{"--data", filepath.Join(dir, "d2"), "--queued-max-age", "1m"}, cli.ExitUsage, "QueuedMaxAge (1m0s) must be at least DedupeWindow"},
		{"audit retention under the dedupe window", []string{"--data", filepath.Join(dir, "d2"), "--audit-retention", "1m"}, cli.ExitUsage, "AuditMaxAge (the audit retention, 1m0s) must be at least DedupeWindow"},
		{"queued max age over the events' age", []string{"--data", filepath.Join(dir, "d2"), "--queued-max-age", "200h"}, cli.ExitUsage, "must not exceed EventsMaxAge"},
		{"auth without init", []string{"auth"}, cli.ExitUsage, "broker auth init DIR"},
		{"auth init without a dir", []string{"auth", "init"}, cli.ExitUsage, "exactly one directory"},
		{"auth init", []string{"auth", "init", filepath.Join(dir, "creds")}, cli.ExitOK, ""},
		{"auth init again", []string{"auth", "init", filepath.Join(dir, "creds")}, cli.ExitFailure, "--force"},
		{"auth add", []string{"auth", "add", "worker", "host2", filepath.Join(dir, "creds")}, cli.ExitOK, ""},
		{"auth add again", []string{"auth", "add", "worker", "host2", filepath.Join(dir, "creds")}, cli.ExitFailure, "remove it first"},
		{"auth add unknown role", []string{"auth", "add", "janitor", "x", filepath.Join(dir, "creds")}, cli.ExitFailure, "unknown role"},
		{"auth add bad name", []string{"auth", "add", "worker", "A/B", filepath.Join(dir, "creds")}, cli.ExitFailure, "identity name"},
		{"auth add without init", []string{"auth", "add", "worker", "x", filepath.Join(dir, "none")}, cli.ExitFailure, "broker auth init"},
		{"auth add short", []string{"auth", "add", "worker"}, cli.ExitUsage, "wrong number of arguments"},
		{"auth remove", []string{"auth", "remove", "worker", "host2", filepath.Join(dir, "creds")}, cli.ExitOK, ""},
		{"auth remove gone", []string{"auth", "remove", "worker", "host2", filepath.Join(dir, "creds")}, cli.ExitFailure, "revoke worker-host2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := run(ctx, tc.args, &stderr)
			if got := cli.ExitCode(err); got != tc.code || (tc.want != "" && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("exit %d (%v), want %d with %q; stderr %s", got, err, tc.code, tc.want, stderr.String())
			}
		})
	}
	for _, role := range natsauth.Roles {
		st, err := os.Stat(natsauth.SeedFile(filepath.Join(dir, "creds"), role))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s seed: %v %v", role, st, err)
		}
	}
	if st, err := os.Stat(filepath.Join(dir, "creds", natsauth.RouteSecretName)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("route secret: %v %v", st, err)
	}
	// The broker serves the written configuration, beyond loopback too.
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs bytes.Buffer // read after run returns
	go func() {
		done <- run(sctx, []string{"--data", filepath.Join(dir, "d3"), "--listen", "0.0.0.0:0",
			"--nats-config", filepath.Join(dir, "creds", natsauth.ConfigName)}, &logs)
	}()
	select {
	case err := <-done:
		t.Fatalf("serving the written config ended: %v", err)
	case <-time.After(2 * time.Second):
	}
	stop()
	if err := testenv.Receive(t, done, time.Minute, "the broker's exit after stop"); err != nil {
		t.Fatalf("serving the written config: %v", err)
	}
	// The start log names the sync policy.
	if !strings.Contains(logs.String(), `"msg":"broker ready"`) || !strings.Contains(logs.String(), `"sync":"always"`) {
		t.Fatalf("the start log does not name the sync policy:\n%s", logs.String())
	}
}

// TestSyncFlag: --sync, or MCPEXEC_SYNC, sets the broker's sync policy;
// always when neither is given.
func TestSyncFlag(t *testing.T) {
	parse := func(args ...string) (broker.Config, error) {
		fs := flag.NewFlagSet("broker", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fl := registerFleetFlags(fs)
		if err := cli.Parse(fs, args, nil); err != nil {
			return broker.Config{}, err
		}
		var cfg broker.Config
		err := fl.apply(&cfg, slog.New(slog.DiscardHandler))
		return cfg, err
	}
	if cfg, err := parse(); err != nil || !cfg.Sync.Always() {
		t.Fatalf("default: %v %v, want always", cfg.Sync, err)
	}
	if cfg, err := parse("--sync", "interval:30s"); err != nil || cfg.Sync.Interval != 30*time.Second {
		t.Fatalf("--sync interval:30s: %v %v", cfg.Sync, err)
	}
	if cfg, err := parse(); err != nil || cfg.StallRepair != broker.DefaultStallRepair {
		t.Fatalf("default stall repair: %v %v, want %v", cfg.StallRepair, err, broker.DefaultStallRepair)
	}
	if cfg, err := parse("--stall-repair", "-1s"); err != nil || cfg.StallRepair >= 0 {
		t.Fatalf("--stall-repair -1s: %v %v, want never (negative)", cfg.StallRepair, err)
	}
	t.Setenv("MCPEXEC_SYNC", "interval:1m")
	if cfg, err := parse(); err != nil || cfg.Sync.Interval != time.Minute {
		t.Fatalf("MCPEXEC_SYNC=interval:1m: %v %v", cfg.Sync, err)
	}
	if cfg, err := parse("--sync", "always"); err != nil || !cfg.Sync.Always() {
		t.Fatalf("the flag did not win over the environment: %v %v", cfg.Sync, err)
	}
	t.Setenv("MCPEXEC_SYNC", "never")
	if _, err := parse(); cli.ExitCode(err) != cli.ExitUsage || !strings.Contains(err.Error(), "MCPEXEC_SYNC") {
		t.Fatalf("MCPEXEC_SYNC=never: %v", err)
	}
}
