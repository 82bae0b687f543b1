package providers

import (
	"slices"
	"testing"
	"time"
)

func TestHashID(t *testing.T) {
	a := HashID("aws", "spot/instance-action", "terminate", "2017-09-18T08:22:00Z")
	if b := HashID("aws", "spot/instance-action", "terminate", "2017-09-18T08:22:00Z"); a != b {
		t.Errorf("same parts gave %q and %q", a, b)
	}
	if len(a) != 16 {
		t.Errorf("ID %q: want 16 hex digits", a)
	}
	// Parts are separated: moving a boundary changes the ID.
	if HashID("ab", "c") == HashID("a", "bc") {
		t.Error(`HashID("ab", "c") == HashID("a", "bc")`)
	}
}

func TestSortAndInterrupts(t *testing.T) {
	at := func(m int) time.Time { return time.Date(2026, 11, 29, 10, m, 0, 0, time.UTC) }
	ns := []Notice{
		{Kind: KindRebalanceRecommendation, ID: "r"},
		{Kind: KindScheduledMaintenance, ID: "m2", Deadline: at(30)},
		{Kind: KindSpotInterruption, ID: "s", Deadline: at(2)},
		{Kind: KindScheduledMaintenance, ID: "m1", Deadline: at(30)},
		{Kind: KindSpotInterruption, ID: "s0", Deadline: at(30)},
	}
	Sort(ns)
	var ids []string
	for _, n := range ns {
		ids = append(ids, n.ID)
	}
	if want := []string{"s", "m1", "m2", "s0", "r"}; !slices.Equal(ids, want) {
		t.Errorf("sorted IDs %v, want %v (deadline, then kind, then ID; none last)", ids, want)
	}

	tests := []struct {
		n    Notice
		want bool
	}{
		{Notice{Kind: KindSpotInterruption, Deadline: at(2)}, true},
		{Notice{Kind: KindScheduledMaintenance, Deadline: at(2)}, true},
		{Notice{Kind: KindSpotInterruption}, false},
		{Notice{Kind: KindRebalanceRecommendation, Deadline: at(2)}, false},
		// Information about maintenance that does not stop the machine never interrupts,
		// even when a provider got a deadline into it by mistake.
		{Notice{Kind: KindMaintenanceInformation, Deadline: at(2)}, false},
	}
	for _, tc := range tests {
		if got := tc.n.Interrupts(); got != tc.want {
			t.Errorf("%+v.Interrupts() = %v, want %v", tc.n, got, tc.want)
		}
	}
}
