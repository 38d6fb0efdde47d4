package durable_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/mcpexec/mcpexec/internal/durable"
)

// BenchmarkSyncStream is one writer's barrier on a store laid out as
// nats-server lays out mcpexec's: each op appends a message to a stream's
// block and waits for a pass over that stream. "append" is the events
// stream (one block that grows); "new-block" is the jobs work queue, whose
// acknowledgement empties its block, so that each message starts a block
// of its own (nats-server removes the empty one). "fsync" is the floor: the
// same append and one fsync of its file.
//
//	go test -run '^$' -bench SyncStream ./internal/durable
func BenchmarkSyncStream(b *testing.B) {
	dir := b.TempDir()
	for _, s := range []string{"MCPEXEC_EVENTS", "MCPEXEC_JOBS", "MCPEXEC_MEMORY", "KV_MCPEXEC_SESSIONS"} {
		msgs := filepath.Join(dir, "$G", "streams", s, "msgs")
		if err := os.MkdirAll(msgs, 0o700); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(msgs, "1.blk"), nil, 0o600); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "$G", "streams", s, "meta.inf"), []byte("{}"), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	msg := make([]byte, 300)
	ctx := context.Background()
	s := durable.NewSyncer(dir)
	// appending appends msg to the events stream's block, then calls after.
	appending := func(after func(f *os.File) error) func(*testing.B) {
		return func(b *testing.B) {
			f, err := os.OpenFile(filepath.Join(dir, "$G", "streams", "MCPEXEC_EVENTS", "msgs", "1.blk"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = f.Close() }() // written and synced: nothing to lose
			for b.Loop() {
				if _, err := f.Write(msg); err != nil {
					b.Fatal(err)
				}
				if err := after(f); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.Run("fsync", appending(func(f *os.File) error { return f.Sync() }))
	b.Run("append", appending(func(*os.File) error { return s.SyncStream(ctx, "MCPEXEC_EVENTS") }))
	b.Run("new-block", func(b *testing.B) {
		msgs := filepath.Join(dir, "$G", "streams", "MCPEXEC_JOBS", "msgs")
		n := 1
		for b.Loop() {
			n++
			if err := os.WriteFile(filepath.Join(msgs, fmt.Sprintf("%d.blk", n)), msg, 0o600); err != nil {
				b.Fatal(err)
			}
			if err := os.Remove(filepath.Join(msgs, fmt.Sprintf("%d.blk", n-1))); err != nil {
				b.Fatal(err)
			}
			if err := s.SyncStream(ctx, "MCPEXEC_JOBS"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
