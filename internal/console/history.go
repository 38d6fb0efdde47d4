package console

import (
	"context"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// History samples a Prometheus registry (the process's own metrics) every
// Interval and keeps an hour of samples: what the console's charts draw,
// without a Prometheus server.
type History struct {
	reg      prometheus.Gatherer
	interval time.Duration
	keep     int

	mu      sync.Mutex // guards samples
	samples []sample   // oldest first, at most keep

	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	started atomic.Bool
}

// sample is one reading of the registry.
type sample struct {
	at       time.Time
	finished map[string]float64 // cumulative jobs finished, by status
	depth    float64            // queue depth (NaN: not in this process)
	buckets  []bucket           // cumulative job latency histogram
}

type bucket struct {
	le    float64
	count float64
}

// NewHistory returns a history of reg sampled every interval (5 s when ≤ 0),
// keeping one hour. Start it; Stop ends its goroutine.
func NewHistory(reg prometheus.Gatherer, interval time.Duration) *History {
	if interval <= 0 {
		interval = 5 * time.Second
	}
	return &History{reg: reg, interval: interval, keep: int(time.Hour / interval), stop: make(chan struct{}), done: make(chan struct{})}
}

// Start samples now and then every interval until Stop or ctx ends.
func (h *History) Start(ctx context.Context) {
	h.started.Store(true)
	h.Sample()
	go func() {
		defer close(h.done)
		t := time.NewTicker(h.interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				h.Sample()
			case <-h.stop:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
}

// Stop ends the sampling and waits for it. Idempotent, and safe before
// Start (which then must not be called).
func (h *History) Stop() {
	h.once.Do(func() { close(h.stop) })
	if h.started.Load() {
		<-h.done
	}
}

// Sample reads the registry once.
func (h *History) Sample() {
	mfs, err := h.reg.Gather()
	if err != nil && len(mfs) == 0 {
		return
	}
	s := sample{at: time.Now(), finished: map[string]float64{}, depth: math.NaN()}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "mcpexec_jobs_finished_total":
			for _, m := range mf.GetMetric() {
				s.finished[label(m, "status")] += m.GetCounter().GetValue()
			}
		case "mcpexec_queue_depth":
			for _, m := range mf.GetMetric() {
				s.depth = m.GetGauge().GetValue()
			}
		case "mcpexec_job_total_seconds":
			byLE := map[float64]float64{} // summed over the label sets
			for _, m := range mf.GetMetric() {
				for _, b := range m.GetHistogram().GetBucket() {
					byLE[b.GetUpperBound()] += float64(b.GetCumulativeCount())
				}
				byLE[math.Inf(1)] += float64(m.GetHistogram().GetSampleCount())
			}
			for le, c := range byLE {
				s.buckets = append(s.buckets, bucket{le: le, count: c})
			}
			sort.Slice(s.buckets, func(i, j int) bool { return s.buckets[i].le < s.buckets[j].le })
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.samples = append(h.samples, s)
	if len(h.samples) > h.keep {
		h.samples = append(h.samples[:0:0], h.samples[len(h.samples)-h.keep:]...)
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Series is the answer of GET /api/console/metrics: one point per sample
// after the first. Rates are per second over the sample's interval;
// latencies (seconds) over the last minute, null when no job ended in it.
type Series struct {
	IntervalSeconds float64              `json:"interval_seconds"`
	At              []time.Time          `json:"at"`
	JobsPerSecond   map[string][]float64 `json:"jobs_per_second"` // by status
	QueueDepth      []*float64           `json:"queue_depth"`
	P50             []*float64           `json:"p50_seconds"`
	P90             []*float64           `json:"p90_seconds"`
}

// Series returns the samples as chart series.
func (h *History) Series() Series {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := Series{IntervalSeconds: h.interval.Seconds(), At: []time.Time{}, JobsPerSecond: map[string][]float64{}, QueueDepth: []*float64{}, P50: []*float64{}, P90: []*float64{}}
	window := max(1, int(time.Minute/h.interval))
	for i := 1; i < len(h.samples); i++ {
		prev, cur := h.samples[i-1], h.samples[i]
		dt := cur.at.Sub(prev.at).Seconds()
		if dt <= 0 {
			continue
		}
		n := len(out.At)
		out.At = append(out.At, cur.at)
		for st := range cur.finished {
			if _, ok := out.JobsPerSecond[st]; !ok {
				out.JobsPerSecond[st] = make([]float64, n, len(h.samples))
			}
		}
		for st := range out.JobsPerSecond {
			out.JobsPerSecond[st] = append(out.JobsPerSecond[st], math.Max(0, (cur.finished[st]-prev.finished[st])/dt))
		}
		out.QueueDepth = append(out.QueueDepth, num(cur.depth))
		old := h.samples[max(0, i-window)]
		out.P50 = append(out.P50, num(quantile(0.5, old.buckets, cur.buckets)))
		out.P90 = append(out.P90, num(quantile(0.9, old.buckets, cur.buckets)))
	}
	return out
}

func num(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// quantile estimates the q-quantile of the observations between two
// readings of one cumulative histogram, as Prometheus's histogram_quantile
// does (linear within the bucket); NaN when none.
func quantile(q float64, old, cur []bucket) float64 {
	if len(cur) == 0 {
		return math.NaN()
	}
	d := make([]bucket, len(cur))
	for i, b := range cur {
		d[i] = b
		if len(old) == len(cur) {
			d[i].count -= old[i].count
		}
	}
	sort.Slice(d, func(i, j int) bool { return d[i].le < d[j].le })
	total := d[len(d)-1].count
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	lower, prevCount := 0.0, 0.0
	for _, b := range d {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return lower
			}
			if b.count == prevCount {
				return b.le
			}
			return lower + (b.le-lower)*(rank-prevCount)/(b.count-prevCount)
		}
		lower, prevCount = b.le, b.count
	}
	return lower
}
