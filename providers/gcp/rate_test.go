package gcp

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/test/fakes/gcpmeta"
)

// TestMeasureWatchRequestRate measures what Watch costs the node-local metadata server with
// nothing changing: the requests per second by path, over REPRIEVE_MEASURE_WATCH_SECONDS of
// real time. It is a measurement, not a check, and runs only when that variable is set (the
// figures in docs/benchmarks.md come from it):
//
//	REPRIEVE_MEASURE_WATCH_SECONDS=120 go test -count=1 -run TestMeasureWatchRequestRate -v ./providers/gcp/
func TestMeasureWatchRequestRate(t *testing.T) {
	v := os.Getenv("REPRIEVE_MEASURE_WATCH_SECONDS")
	if v == "" {
		t.Skip("set REPRIEVE_MEASURE_WATCH_SECONDS to measure")
	}
	secs, err := strconv.Atoi(v)
	if err != nil || secs < 1 {
		t.Fatalf("REPRIEVE_MEASURE_WATCH_SECONDS=%q: want a number of seconds", v)
	}
	s := gcpmeta.New()
	if _, err := s.Start(""); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := New(Options{Endpoint: s.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second)
	defer cancel()
	updates := 0
	start := time.Now()
	_ = p.Watch(ctx, func([]providers.Notice, error) { updates++ })
	elapsed := time.Since(start).Seconds()
	total := 0
	for _, path := range []string{PathPreempted, PathMaintenanceEvent, PathUpcomingMaintenance, PathPreemptible, PathProvisioningModel, PathOnHostMaintenance} {
		n := s.Count(path)
		total += n
		t.Logf("%-40s %4d requests  %.3f/s", path, n, float64(n)/elapsed)
	}
	t.Logf("%-40s %4d requests  %.3f/s over %.0f s (%d updates)", "total", total, float64(total)/elapsed, elapsed, updates)
	if total == 0 {
		t.Error("no request measured")
	}
	fmt.Fprintf(os.Stderr, "watch request rate: %.3f/s (hanging GETs timeout_sec=%d, upcoming-maintenance every %v)\n", float64(total)/elapsed, waitSeconds, upcomingInterval)
}
