// Package state is the system of record: the NATS service that folds the
// events and memory streams into each replica's Store and answers queries
// about jobs and memory, and the client that calls it. Package boltstore
// holds the Store in a bbolt file; package statetest the behaviour every
// Store must have.
package state

import "github.com/mcpexec/mcpexec/internal/errs"

// ErrNotFound is returned when no record exists for a key.
var ErrNotFound = errs.New(errs.NotFound, "not found")
