package main

import (
	"flag"
	"time"

	"github.com/mcpexec/mcpexec/cmd/internal/natsflags"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/frontend"
)

// fleetFlags are the front-end's NATS security, shutdown and policy flags.
type fleetFlags struct {
	nats   *natsflags.Flags
	grace  time.Duration
	policy frontend.Policy
}

func registerFleetFlags(fs *flag.FlagSet) *fleetFlags {
	f := &fleetFlags{nats: natsflags.Register(fs)}
	d := frontend.DefaultPolicy()
	fs.DurationVar(&f.grace, "grace", 30*time.Second, "on SIGTERM, how long in-flight calls may wait for their jobs before they are answered with the job id to fetch later (and, embedded, how long the worker's jobs may finish)")
	fs.IntVar(&f.policy.MaxQueued, "ns-max-queued", d.MaxQueued, "refuse a namespace's submissions while it has this many jobs waiting for a worker (0: no cap; counted per front-end)")
	fs.IntVar(&f.policy.MaxActive, "ns-max-active", d.MaxActive, "refuse a namespace's submissions while it has this many jobs queued or running (0: no cap; counted per front-end)")
	fs.Int64Var(&f.policy.MaxQueuedBytes, "ns-max-queued-bytes", d.MaxQueuedBytes, "refuse a namespace's submissions while its waiting jobs' code passes this many bytes (0: no cap; counted per front-end)")
	fs.IntVar(&f.policy.MaxSessions, "ns-max-sessions", d.MaxSessions, "sessions a namespace may hold at once (0: no cap)")
	fs.Int64Var(&f.policy.MemoryBytes, "ns-memory-bytes", d.MemoryBytes, "bytes of memory (keys, values, metadata) a namespace may store (0: no cap)")
	fs.Int64Var(&f.policy.FilesBytes, "ns-files-bytes", d.FilesBytes, "bytes a namespace's jobs' files (in and out) may hold in the file store (0: no cap)")
	return f
}

func (f *fleetFlags) validate() error {
	switch {
	case f.grace < 0:
		return cli.Usagef("--grace must not be negative, got %s", f.grace)
	case f.policy.MaxQueued < 0, f.policy.MaxActive < 0, f.policy.MaxQueuedBytes < 0, f.policy.MaxSessions < 0, f.policy.MemoryBytes < 0, f.policy.FilesBytes < 0:
		return cli.Usagef("--ns-max-queued, --ns-max-active, --ns-max-queued-bytes, --ns-max-sessions, --ns-memory-bytes and --ns-files-bytes must be 0 (no cap) or more")
	}
	return f.nats.Validate()
}
