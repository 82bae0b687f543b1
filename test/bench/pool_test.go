package main

import (
	"math"
	"testing"
	"time"
)

// TestHistogramQuantile: as Prometheus's histogram_quantile reads cumulative buckets (linear
// within a bucket, the last finite bound past it), so that the pool's figure of the agents'
// lateness histogram is the one a dashboard shows.
func TestHistogramQuantile(t *testing.T) {
	b := map[float64]float64{1: 10, 5: 50, 10: 90, 30: 99, math.Inf(1): 100}
	for _, c := range []struct{ q, want float64 }{{0.05, 0.5}, {0.5, 5}, {0.7, 7.5}, {0.99, 30}, {0.995, 30}} {
		if got := histogramQuantile(b, c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("q %v: %v; want %v", c.q, got, c.want)
		}
	}
	if got := histogramQuantile(map[float64]float64{1: 0, math.Inf(1): 0}, 0.5); !math.IsNaN(got) {
		t.Errorf("no observations: %v; want NaN", got)
	}
}

func TestNearestRank(t *testing.T) {
	d := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if got := nearestRank(d, 0.5); got != 5 {
		t.Errorf("p50 %v; want 5", got)
	}
	if got := nearestRank(d, 0.99); got != 10 {
		t.Errorf("p99 %v; want 10", got)
	}
	if got := nearestRank(nil, 0.5); got != 0 {
		t.Errorf("none: %v; want 0", got)
	}
}
