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

func TestReanchor(t *testing.T) {
	at := func(s int) time.Time { return time.Date(2026, 11, 29, 10, 0, s, 0, time.UTC) }
	preempt := Notice{Kind: KindPreemption, ID: "p", NoticeTime: at(10), Deadline: at(40), FromFirstSeen: true, Source: "instance/preempted"}
	spot := Notice{Kind: KindSpotInterruption, ID: "s", NoticeTime: at(10), Deadline: at(120)}
	tests := []struct {
		name      string
		n         Notice
		firstSeen time.Time
		want      Notice
	}{
		// A restart 10 s into a preemption: the deadline stays at T+30 s, not T+40 s.
		{"first-seen deadline moves with an earlier sighting", preempt, at(0),
			Notice{Kind: KindPreemption, ID: "p", NoticeTime: at(0), Deadline: at(30), FromFirstSeen: true, Source: "instance/preempted"}},
		{"the payload's deadline stays", spot, at(0),
			Notice{Kind: KindSpotInterruption, ID: "s", NoticeTime: at(0), Deadline: at(120)}},
		{"a later sighting changes nothing", preempt, at(20), preempt},
		{"the same sighting changes nothing", preempt, at(10), preempt},
		{"no sighting changes nothing", preempt, time.Time{}, preempt},
		{"a notice without a notice time takes the sighting", Notice{ID: "z", Deadline: at(50)}, at(5),
			Notice{ID: "z", NoticeTime: at(5), Deadline: at(50)}},
		// Deadline - NoticeTime is undefined without a notice time: the deadline stays.
		{"first-seen without a notice time keeps its deadline", Notice{ID: "z", Deadline: at(50), FromFirstSeen: true}, at(5),
			Notice{ID: "z", NoticeTime: at(5), Deadline: at(50), FromFirstSeen: true}},
		{"first-seen without a deadline keeps none", Notice{ID: "m", NoticeTime: at(10), FromFirstSeen: true}, at(0),
			Notice{ID: "m", NoticeTime: at(0), FromFirstSeen: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.n.Reanchor(tc.firstSeen)
			if got != tc.want {
				t.Errorf("Reanchor(%s) = %+v, want %+v", tc.firstSeen.Format(time.RFC3339), got, tc.want)
			}
		})
	}
}
