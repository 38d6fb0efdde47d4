package broker

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mcpexec/mcpexec/internal/queue"
)

// SyncPolicy is when JetStream's writes (jobs, events, memory, buckets) reach
// the disk relative to their acknowledgement. The zero value is "always".
type SyncPolicy struct {
	// Interval, when positive, lets JetStream acknowledge a write at once and
	// fsync every Interval: a power cut loses up to Interval of acknowledged
	// writes. Zero: every write is fsynced before it is acknowledged.
	Interval time.Duration
}

// SyncMetadata is the key of the sync policy in the state service's metadata
// ($SRV.INFO), which doctor and the queue's clients read.
const SyncMetadata = queue.SyncMetadata

// SyncUsage says what --sync accepts.
const SyncUsage = "when JetStream's writes reach the disk, the sync `policy`: always (the default: each write is fsynced before it is acknowledged, " +
	"so acknowledged jobs and memory writes survive a power cut) or interval:D (acknowledge at once and fsync every D, e.g. interval:2m: " +
	"a power cut loses up to D of acknowledged writes)"

// ParseSyncPolicy reads "always" or "interval:D" (D a positive Go duration).
func ParseSyncPolicy(v string) (SyncPolicy, error) {
	if v == "always" {
		return SyncPolicy{}, nil
	}
	if d, ok := strings.CutPrefix(v, "interval:"); ok {
		iv, err := time.ParseDuration(d)
		if err != nil || iv <= 0 {
			return SyncPolicy{}, fmt.Errorf("the interval of interval:D must be a positive duration, e.g. interval:2m or interval:500ms")
		}
		return SyncPolicy{Interval: iv}, nil
	}
	return SyncPolicy{}, fmt.Errorf("want always or interval:D with D a positive duration (e.g. interval:2m)")
}

// Always reports whether every write is fsynced before it is acknowledged.
func (p SyncPolicy) Always() bool { return p.Interval <= 0 }

// String is the policy as ParseSyncPolicy reads it.
func (p SyncPolicy) String() string {
	if p.Always() {
		return "always"
	}
	return "interval:" + p.Interval.String()
}

// Set parses v into p: a SyncPolicy is a flag.Value.
func (p *SyncPolicy) Set(v string) error {
	q, err := ParseSyncPolicy(v)
	if err != nil {
		return err
	}
	*p = q
	return nil
}

// apply sets the policy on the server options: SyncAlways, or the interval
// of the background fsync. It overrides a sync setting of --nats-config.
// With barriers (one node, sync always: Barriers), JetStream acknowledges
// at once and syncs every barrierInterval in the background; what it
// acknowledged is made durable by the writers' barriers before anyone is
// told it succeeded.
func (p SyncPolicy) apply(opts *server.Options, barriers bool) {
	if barriers {
		opts.SyncAlways, opts.SyncInterval = false, barrierInterval
		return
	}
	if p.Always() {
		// The background flush still runs (as the config file's
		// `sync: always` sets it): at the server's default interval.
		opts.SyncAlways, opts.SyncInterval = true, defaultSyncInterval
		return
	}
	opts.SyncAlways, opts.SyncInterval = false, p.Interval
}

// Barriers reports whether a broker of cfg, whose server options are opts,
// keeps sync always with group sync barriers (package durable) rather than
// nats-server's sync of each write: a single node (no cluster routes) under
// sync always. A node of a cluster keeps nats-server's: there a write is
// acknowledged once a majority stored it, and each node's copy is synced
// by that node's server.
func Barriers(cfg Config, opts *server.Options) bool {
	return cfg.Sync.Always() && !cfg.Cluster.Enabled() && opts.Cluster.Port == 0
}

// barrierInterval is the background fsync of a broker with barriers: what
// no barrier covers (an acknowledgement's delete, a block compacted in
// place) reaches the disk within it.
const barrierInterval = time.Second

// defaultSyncInterval is nats-server's interval of its background fsync.
const defaultSyncInterval = 2 * time.Minute
