package broker

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
)

// startOn starts a broker with the default queue configuration in dir and
// returns it with what it logged; it fails the test if the broker does not
// start or lacks its streams.
func startOn(t *testing.T, dir string) (*Broker, string) {
	t.Helper()
	var logs testenv.Buffer
	b, err := Start(context.Background(), Config{DataDir: dir, Queue: queue.DefaultConfig(),
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatalf("start a broker in %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = b.Close() })
	nc, err := b.Connect("store-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	sub := queue.DefaultConfig().Subjects
	for _, name := range []string{sub.JobsStream(), sub.EventsStream(), sub.MemoryStream(), sub.AuditStream()} {
		if _, err := js.Stream(context.Background(), name); err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
	}
	return b, logs.String()
}

// TestStartsOnASmallDisk: a broker whose data directory's disk has less
// free space than its streams are bounded to (here 2 GiB against 33 GiB)
// starts with its streams and says so. nats-server's own store limit
// (three quarters of the free disk) refused the events stream: "insufficient
// storage resources available", and no broker of a disk under about 45 GB
// started.
func TestStartsOnASmallDisk(t *testing.T) {
	real := diskFree
	diskFree = func(string) (int64, error) { return 2 << 30, nil }
	t.Cleanup(func() { diskFree = real })
	_, logs := startOn(t, t.TempDir())
	if !strings.Contains(logs, "less free space than the streams are bounded to") || !strings.Contains(logs, "free_mib=2048") {
		t.Fatalf("no warning about the small disk: %s", logs)
	}
}

// TestStartsOnASmallFileSystem: the same on a real 2 GiB file system
// (tmpfs; mounting it needs root, as make test runs).
func TestStartsOnASmallFileSystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root (make test runs as root)")
	}
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2g", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a small tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	_, logs := startOn(t, filepath.Join(dir, "data"))
	if !strings.Contains(logs, "less free space than the streams are bounded to") {
		t.Fatalf("no warning about the small disk: %s", logs)
	}
}
