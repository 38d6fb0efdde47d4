package metrics

import (
	"testing"
	"time"
)

func TestRatePerMinute(t *testing.T) {
	var r rate
	t0 := time.Unix(1_000_000, 0)
	if got := r.perMinute(t0); got != 0 {
		t.Fatalf("no events: %v", got)
	}
	// 30 events over the first 30 s.
	for i := range 30 {
		r.add(t0.Add(time.Duration(i) * time.Second))
	}
	if got := r.perMinute(t0.Add(30 * time.Second)); got != 30 {
		t.Fatalf("30 events in the first half minute: %v per minute", got)
	}
	// Quiet for ten minutes, then 60 events in the last minute: the old
	// ones are out of the window, and the idle gap does not dilute the new.
	t1 := t0.Add(10 * time.Minute)
	for i := range 60 {
		r.add(t1.Add(time.Duration(i) * 900 * time.Millisecond))
	}
	if got := r.perMinute(t1.Add(59 * time.Second)); got != 60 {
		t.Fatalf("60 events in the last minute after a quiet spell: %v per minute", got)
	}
	// A minute of quiet later: none.
	if got := r.perMinute(t1.Add(3 * time.Minute)); got != 0 {
		t.Fatalf("a quiet minute: %v per minute", got)
	}
	if n := len(r.samples); n > 3 {
		t.Fatalf("%d samples kept after a quiet minute", n)
	}
}

func TestNilMetricsRate(t *testing.T) {
	var m *Metrics
	if got := m.ProxyCallsPerMinute(); got != 0 {
		t.Fatal(got)
	}
}
