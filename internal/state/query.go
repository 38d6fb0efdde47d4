package state

import (
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Listing bounds.
const (
	DefaultListLimit = jobs.DefaultListLimit
	MaxListLimit     = jobs.MaxListLimit
)

// JobFilter selects job records (jobs.Filter).
type JobFilter = jobs.Filter

// Retention says which finished job records are deleted. Zero fields keep all.
type Retention struct {
	MaxAge   time.Duration // finished longer ago than this
	MaxCount int           // finished records beyond this many, oldest first
}
