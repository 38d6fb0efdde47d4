// Package jobs is the job model shared by every part of mcpexec: jobs, statuses,
// results, lifecycle events, the state machine that folds events into a job record,
// validation of submissions, and the wire names (subjects and streams) built from a
// prefix. It speaks in plain types and imports no NATS, Podman or bbolt.
package jobs
