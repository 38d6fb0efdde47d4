package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// DefaultFailureThreshold is how many infrastructure failures in a row make a
// worker stop taking jobs.
const DefaultFailureThreshold = 3

// health tracks whether the worker can run jobs. After threshold
// infrastructure failures in a row (no sandbox could be made) it is sick: it
// stops fetching jobs, says why, and probes its runtime with backoff until a
// probe succeeds. A queue whose sick worker kept pulling would turn every job
// into a failure faster than the healthy workers could take them.
type health struct {
	threshold int

	mu      sync.Mutex // guards fails, sick, reason, since, healthy
	fails   int
	sick    bool
	reason  string
	since   time.Time
	healthy chan struct{} // closed while healthy
	changed chan struct{} // poked when the worker turns sick
}

func newHealth(threshold int) *health {
	if threshold < 1 {
		threshold = DefaultFailureThreshold
	}
	h := &health{threshold: threshold, healthy: make(chan struct{}), changed: make(chan struct{}, 1), since: time.Now()}
	close(h.healthy)
	return h
}

// observe counts a delivery's outcome: an infrastructure failure before the
// code was sent counts against the worker, a job whose code ran for it.
func (h *health) observe(o outcome) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case o.kind == infraFailure && !o.started:
		h.fails++
		if h.fails >= h.threshold && !h.sick {
			h.sick, h.since = true, time.Now()
			h.reason = fmt.Sprintf("%d sandboxes in a row could not be started; the last error: %s", h.fails, errText(o.err))
			h.healthy = make(chan struct{})
			select {
			case h.changed <- struct{}{}:
			default:
			}
		}
	case o.started:
		h.fails = 0
	}
}

// recover marks the worker healthy again.
func (h *health) recover() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sick {
		h.sick, h.fails, h.reason, h.since = false, 0, "", time.Now()
		close(h.healthy)
	}
}

// wait returns once the worker is healthy (true) or ctx ends (false).
func (h *health) wait(ctx context.Context) bool {
	h.mu.Lock()
	ch := h.healthy
	h.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// state reports the worker's health.
func (h *health) state() (sick bool, reason string, since time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sick, h.reason, h.since
}

// Health reports nil when the worker takes jobs, else why not.
func (w *Worker) Health() error {
	if sick, reason, since := w.health.state(); sick {
		return fmt.Errorf("not taking jobs since %s: %s", since.UTC().Format(time.RFC3339), reason)
	}
	return nil
}

// probeLoop probes the runtime of a sick worker with backoff, and makes it
// healthy again when a probe succeeds.
func (w *Worker) probeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.health.changed:
		}
		delay := time.Second
		for {
			if sick, _, _ := w.health.state(); !sick {
				break
			}
			w.log.Warn("worker is not taking jobs: probing its runtime", "in", delay, "why", w.Health())
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			err := w.probe(ctx)
			if err == nil {
				w.log.Info("runtime probe succeeded: taking jobs again")
				w.health.recover()
				break
			}
			w.log.Warn("runtime probe failed", "err", err)
			delay = min(2*delay, 30*time.Second)
		}
	}
}

// probe checks the runtime can start a sandbox (when it can tell without a
// job; otherwise the next job is the probe).
func (w *Worker) probe(ctx context.Context) error {
	p, ok := w.rt.(sandbox.Prober)
	if !ok {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return p.Probe(pctx)
}

// answerStatus replies to a status request.
func (w *Worker) answerStatus(m *nats.Msg) {
	sick, reason, since := w.health.state()
	st := jobs.WorkerStatus{ID: w.cfg.ID, Pool: w.cfg.Pool, Languages: w.langs, Healthy: !sick, Reason: reason, Since: since.UTC(),
		Slots: w.cfg.Slots, Running: int(w.inFlight.Load()), Runtime: runtimeName(w.rt), Load1: load1(), At: time.Now().UTC()}
	if w.sess != nil {
		w.sess.mu.Lock()
		st.Sessions = len(w.sess.held)
		w.sess.mu.Unlock()
	}
	if sr, ok := w.rt.(sandbox.StatsReporter); ok {
		s := sr.Stats()
		st.Warm, st.Started, st.StartFailures = s.Warm, s.Started, s.StartFailures
	}
	data, _ := json.Marshal(st) // plain fields always encode
	_ = m.Respond(data)         // the asker may be gone
}

// runtimeName names a sandbox runtime by its package: podman, docker,
// process.
func runtimeName(rt sandbox.Runtime) string {
	name := strings.TrimPrefix(fmt.Sprintf("%T", rt), "*")
	return strings.TrimSuffix(name, ".Runtime")
}

// load1 is the host's load average over the last minute (0 where
// /proc/loadavg cannot be read).
func load1() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return v
}
