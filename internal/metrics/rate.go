package metrics

import (
	"sync"
	"sync/atomic"
	"time"
)

// rateEvery is the spacing of a rate's samples: its figures are exact to it.
const rateEvery = time.Second

// rate counts events and answers how many happened over the last minute,
// from samples of the count taken, at most every rateEvery, as events come
// and as it is asked (no goroutine of its own).
type rate struct {
	total  atomic.Uint64
	lastNS atomic.Int64 // when the last sample was taken (unix ns)

	mu      sync.Mutex // guards samples
	samples []rateSample
}

type rateSample struct {
	at    time.Time
	total uint64
}

// add counts one event at now (after the sample it may take: a sample is
// the count before the events of its instant).
func (r *rate) add(now time.Time) {
	if now.UnixNano()-r.lastNS.Load() >= int64(rateEvery) {
		r.sample(now)
	}
	r.total.Add(1)
}

// sample records the count at now, and forgets the samples a minute's
// figure no longer needs (keeping the last one before the minute: the count
// at its start).
func (r *rate) sample(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.samples); n > 0 && now.Sub(r.samples[n-1].at) < rateEvery {
		return
	}
	r.samples = append(r.samples, rateSample{at: now, total: r.total.Load()})
	r.lastNS.Store(now.UnixNano())
	cut := 0
	for cut+1 < len(r.samples) && !r.samples[cut+1].at.After(now.Add(-time.Minute)) {
		cut++
	}
	r.samples = r.samples[cut:]
}

// perMinute is the number of events over the minute up to now, to within
// rateEvery: an event is always within rateEvery of a sample, so the count
// at the oldest sample kept is the count at the minute's start (or before
// any event).
func (r *rate) perMinute(now time.Time) float64 {
	r.sample(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	total := r.total.Load()
	if len(r.samples) == 0 {
		return 0
	}
	if base := r.samples[0]; total > base.total {
		return float64(total - base.total)
	}
	return 0
}

// ProxyCallsPerMinute is the number of proxy calls this process answered
// over the last minute.
func (m *Metrics) ProxyCallsPerMinute() float64 {
	if m == nil {
		return 0
	}
	return m.proxyRate.perMinute(time.Now())
}
