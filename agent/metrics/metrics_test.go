package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestNewZeroInitialises: counters exist at zero for every label value before the first event,
// so that alerts and rates see them; the names lint clean; a second registration fails.
func TestNewZeroInitialises(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := New(reg, "aws")
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.EvictionRequestsTotal); n != 6 {
		t.Errorf("eviction request series = %d, want 6 (every result)", n)
	}
	if n := testutil.CollectAndCount(m.PollsTotal); n != 2 {
		t.Errorf("poll series = %d, want 2 (ok, error)", n)
	}
	if lint, err := testutil.GatherAndLint(reg); err != nil || len(lint) > 0 {
		t.Errorf("lint: %v %v", lint, err)
	}
	if _, err := New(reg, "aws"); err == nil {
		t.Error("registering twice on one registry succeeded")
	}
}
