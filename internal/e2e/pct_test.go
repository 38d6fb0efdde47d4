package e2e

import (
	"testing"
	"time"
)

// TestPercentileIsNearestRank: the tables' p50 and p90 are nearest-rank
// percentiles, so that a p90 of ten samples is not their maximum.
func TestPercentileIsNearestRank(t *testing.T) {
	t.Parallel()
	ten := samples{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
	fifty := make(samples, 50)
	for i := range fifty {
		fifty[i] = time.Duration(50 - i)
	}
	for _, c := range []struct {
		s    samples
		p    int
		want time.Duration
	}{
		{ten, 90, 9}, {ten, 50, 5}, {ten, 100, 10}, {ten, 1, 1}, {ten, 0, 1},
		{fifty, 90, 45}, {fifty, 50, 25},
		{samples{7}, 90, 7}, {nil, 90, 0},
	} {
		if got := c.s.pct(c.p); got != c.want {
			t.Errorf("p%d of %d samples: %v, want %v", c.p, len(c.s), got, c.want)
		}
	}
}
