// Package faults holds mcpexec's fault suite, in Jepsen's shape: a history
// of job submissions, results and update_memory increments through the real
// jobs API of a three-broker fleet, with faults injected between them (power
// cuts of one, two and all three nodes on lazyfs, kill -9 of the jobs
// stream's leader, a pause, a partition, a worker and a front-end killed
// together), and a checker of the history. `make test` runs a short
// schedule, `make faults` the long one (MCPEXEC_FAULTS=long). The package
// has no code outside its tests but lazyfs, the power-loss harness.
package faults
