package durable

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// Mode is how the brokers make acknowledged writes durable, as their state
// service's metadata says.
type Mode int

const (
	// ModeUnknown: nothing said yet (no state service answered). Writers group
	// their writes and ask for a barrier, which is right whatever the mode.
	ModeUnknown Mode = iota
	// ModeAlways: JetStream syncs each write before it acknowledges it (a
	// cluster under sync always). No barrier is needed.
	ModeAlways
	// ModeBarrier: JetStream acknowledges at once, and a barrier makes what it
	// acknowledged durable (one broker under sync always).
	ModeBarrier
	// ModeInterval: JetStream acknowledges at once and syncs every D, as the
	// operator chose. No barrier is asked for.
	ModeInterval
)

// Metadata keys of the mode in the state service's metadata ($SRV.INFO).
const (
	// SyncMetadata is the operator's policy: "always" or "interval:D".
	SyncMetadata = "sync"
	// BarrierMetadata is "true" where "always" is kept with barriers.
	BarrierMetadata = "sync_barrier"
)

// ModeOf reads the mode from a state service's metadata.
func ModeOf(md map[string]string) Mode {
	switch p := md[SyncMetadata]; {
	case strings.HasPrefix(p, "interval:"):
		return ModeInterval
	case p == "always" && md[BarrierMetadata] == "true":
		return ModeBarrier
	case p == "always":
		return ModeAlways
	}
	return ModeUnknown
}

// Grouped reports whether writers group concurrent writes (atomic batches):
// where each write waits for its own sync.
func (m Mode) Grouped() bool { return m == ModeAlways || m == ModeUnknown }

// Fleet is the Barrier of the brokers a connection reaches: it asks them
// for a barrier only where their mode needs one (ModeBarrier, ModeUnknown). It
// reads the mode from their state service's metadata at first use and
// once every ModeEvery after: one caller reads it, on its path (one
// request, answered by the nearest state replica); the others use what was
// read last. A mode that cannot be read leaves the last one.
type Fleet struct {
	// Every is how often the mode is read again (zero: ModeEvery). Set it
	// before the first use.
	Every time.Duration

	nc      *nats.Conn
	info    string // the state service's $SRV.INFO subject
	subject string // where barriers are served
	barrier *Client

	mu      sync.Mutex // guards readAt, mode, streams, local
	readAt  time.Time
	mode    Mode
	streams map[string]*Client
	// local, when set (UseLocal), is the broker's own Barrier, in this
	// process: barriers go to it directly instead of over NATS.
	local Barrier
}

// UseLocal makes the fleet's barriers go to b, the Barrier of the broker
// running in this process that the fleet's connection reaches in process
// (the embedded default): a pass then costs its syncs, not also a request's
// round trip through the server and two goroutine hand-offs each way. The
// mode is still read from the state service, as for any fleet.
func (f *Fleet) UseLocal(b Barrier) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.local = b
}

// ModeEvery is how often a Fleet reads the brokers' mode.
const ModeEvery = time.Minute

// modeWait bounds the read of the mode.
const modeWait = time.Second

// NewFleet returns the Barrier of the brokers nc reaches: their state
// service is named service, their barriers are served on subject.
func NewFleet(nc *nats.Conn, service, subject string) *Fleet {
	return &Fleet{nc: nc, info: "$SRV.INFO." + service, subject: subject, barrier: NewClient(nc, subject), streams: map[string]*Client{}}
}

// Mode is the brokers' mode, read again when it was not for ModeEvery.
func (f *Fleet) Mode(ctx context.Context) Mode {
	f.mu.Lock()
	mode := f.mode
	stale := time.Since(f.readAt) >= cmp.Or(f.Every, ModeEvery)
	if stale {
		f.readAt = time.Now()
	}
	f.mu.Unlock()
	if !stale {
		return mode
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), modeWait)
	defer cancel()
	msg, err := f.nc.RequestWithContext(rctx, f.info, nil)
	if err != nil {
		return mode
	}
	var info micro.Info
	if json.Unmarshal(msg.Data, &info) != nil {
		return mode
	}
	mode = ModeOf(info.Metadata)
	f.mu.Lock()
	f.mode = mode
	f.mu.Unlock()
	return mode
}

// Sync returns once what the brokers acknowledged before the call is
// durable under their mode: at once where they sync each write (or sync on
// an interval, as the operator chose), after a barrier where they do not.
//
// Where the mode is unknown and nobody serves barriers, there is no
// broker of this version to ask (a bare nats-server, a broker older than
// barriers), and Sync returns nil: a broker with barriers serves them from
// before its first write, and says its mode once its state service is up.
func (f *Fleet) Sync(ctx context.Context) error { return f.syncWith(ctx, f.barrier) }

// Stream is the Barrier of the writes to one stream, as Sync decides:
// where a barrier is needed, its requests name the stream, and the broker
// syncs that stream's files alone (a lone call then waits for about one
// fsync, not a pass over the whole store).
func (f *Fleet) Stream(name string) Barrier {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.streams[name]
	if c == nil {
		c = NewStreamClient(f.nc, f.subject, name)
		f.streams[name] = c
	}
	return streamBarrier{f, c}
}

type streamBarrier struct {
	f *Fleet
	c *Client
}

func (b streamBarrier) Sync(ctx context.Context) error { return b.f.syncWith(ctx, b.c) }

// syncWith is Sync with barrier requests made by c (or, with a local
// barrier, the pass c's requests would ask for).
func (f *Fleet) syncWith(ctx context.Context, c *Client) error {
	m := f.Mode(ctx)
	if m == ModeAlways || m == ModeInterval {
		return nil
	}
	f.mu.Lock()
	local := f.local
	f.mu.Unlock()
	if local != nil {
		ctx, cancel := context.WithTimeout(ctx, requestWait) // as a request is bounded
		defer cancel()
		return notDurable(SyncStream(ctx, local, c.stream))
	}
	err := c.Sync(ctx)
	if m == ModeUnknown && errors.Is(err, nats.ErrNoResponders) {
		return nil
	}
	return err
}
