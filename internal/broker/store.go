package broker

import (
	"os"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/sys/unix"
)

// storeMargin is the room JetStream keeps beyond the streams' and
// buckets' bounds, for what has none (consumers' state, the catalog).
const storeMargin = 1 << 30

// diskFree returns the bytes free to an unprivileged writer on dir's file
// system (a variable: tests stand in a small disk).
var diskFree = func(dir string) (int64, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, err
	}
	return int64(fs.Bavail) * fs.Bsize, nil
}

// storeLimit is the JetStream store limit of a node whose streams and
// buckets are bounded to bound, in dir: nats-server's own estimate (three
// quarters of the free disk), or the bounds and storeMargin if that is
// more. nats-server refuses a stream whose bound its limit cannot reserve,
// so on its own estimate a broker on a disk with less than about 45 GB
// free (the default bounds are 33.3 GiB) could not create its streams and
// did not start. With the limit at the bounds it starts, and writes fail
// only once the disk is really full (a warning says so at start). short
// reports that the free disk is below bound.
func storeLimit(dir string, bound int64) (limit int64, free int64, short bool) {
	free, err := diskFree(dir)
	if err != nil {
		return bound + storeMargin, 0, false // nats-server would guess 1 TB
	}
	return max(free/4*3, bound+storeMargin), free, free < bound
}

// keepStoreLimit sets opts' JetStream store limit to limit, unless
// --nats-config sets one (max_file_store).
func keepStoreLimit(opts *server.Options, limit int64) {
	if opts.JetStreamMaxStore == 0 {
		opts.JetStreamMaxStore = limit
	}
}
