package discovery

import (
	"context"
	"time"

	"github.com/mcpexec/mcpexec/internal/periodic"
)

// WatchInterval is how often Watch looks at the config files by default: a
// file added, changed or removed takes effect within two intervals.
const WatchInterval = time.Second

// Watch calls fn with a new discovery each time the files Discover reads
// change from since (the Fingerprint taken before the discovery in use),
// until ctx ends. It looks every interval (0: WatchInterval), with stat
// calls only, and discovers again only on a change.
func Watch(ctx context.Context, o Options, since string, interval time.Duration, fn func(Result)) {
	if interval <= 0 {
		interval = WatchInterval
	}
	last := since
	periodic.Run(ctx, interval, func() {
		if fp := Fingerprint(o); fp != last {
			last = fp
			fn(Discover(o))
		}
	})
}
