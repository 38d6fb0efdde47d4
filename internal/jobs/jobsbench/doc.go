// Package jobsbench holds the end-to-end throughput benchmark of the job system:
// jobs submitted through embedded JetStream, run by workers on a no-op runtime,
// and recorded by the state service in bbolt. It has no code of its own.
package jobsbench
