package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/natsauth"
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
		{"unexpected argument", []string{"--data", filepath.Join(dir, "d2"), "serve"}, cli.ExitUsage, `unexpected argument "serve"`},
		{"queued max age under the dedupe window", []string{"--data", filepath.Join(dir, "d2"), "--queued-max-age", "1m"}, cli.ExitUsage, "QueuedMaxAge (1m0s) must be at least DedupeWindow"},
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
	go func() {
		done <- run(sctx, []string{"--data", filepath.Join(dir, "d3"), "--listen", "0.0.0.0:0",
			"--nats-config", filepath.Join(dir, "creds", natsauth.ConfigName)}, &bytes.Buffer{})
	}()
	select {
	case err := <-done:
		t.Fatalf("serving the written config ended: %v", err)
	case <-time.After(2 * time.Second):
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("serving the written config: %v", err)
	}
}
