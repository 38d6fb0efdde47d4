// Package periodic runs a function on a fixed interval until a context ends:
// the loop every janitor, watcher and reconciler of the system would
// otherwise write again.
package periodic

import (
	"context"
	"time"
)

// Run calls fn every d (not at once) until ctx ends; it returns then. A call
// that outlasts d delays the next one (a ticker drops the ticks it missed).
func Run(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
