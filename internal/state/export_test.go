package state

import (
	"context"
	"time"
)

// The package's tests check for streams that lost their tail often, so that
// a test of it runs in a second; and their nodes share one clock, so a
// message published after a replica's last commit is never the one it
// applied (the tests restart within clockTolerance).
func init() {
	rewindCheck = 300 * time.Millisecond
	clockTolerance = 0
}

// CheckTail is checkTail, for the tests of package state_test: whether stream
// lost what a replica applied up to applied, and why.
func (s *Service) CheckTail(ctx context.Context, stream string, applied uint64, published, notAfter time.Time) (string, error) {
	lost, err := s.checkTail(ctx, stream, applied, published, notAfter)
	if lost == nil {
		return "", err
	}
	return lost.why, err
}
