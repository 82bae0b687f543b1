package podnotice

import (
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/providers"
)

// t0 is the tests' start, as the agent's tests have it.
var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestWarningFor(t *testing.T) {
	deadline := t0.Add(120 * time.Second)
	w := plan.Window{Deadline: deadline, SafetyMargin: 5 * time.Second}
	spot := &providers.Notice{Provider: "aws", Kind: providers.KindSpotInterruption}
	planned := plan.Plan{EvictAt: t0.Add(25 * time.Second), Grace: 90 * time.Second}
	for _, tc := range []struct {
		name    string
		pl      plan.Plan
		w       plan.Window
		n       *providers.Notice
		want    Warning
		message string
	}{
		{name: "planned", pl: planned, w: w, n: spot,
			want:    Warning{Active: true, Reason: events.ReasonSpotInterruption, EvictAt: planned.EvictAt, Deadline: deadline},
			message: "Eviction planned at 2026-11-29T12:00:25Z with grace 1m30s; the machine is reclaimed at 2026-11-29T12:02:00Z (a aws spot-interruption notice)"},
		{name: "tolerates forever", pl: plan.Plan{Skip: plan.SkipTolerateForever}, w: w,
			n:       &providers.Notice{Provider: "azure", Kind: providers.KindPreemption},
			want:    Warning{Active: true, Reason: events.ReasonPreemption, Deadline: deadline},
			message: "Not evicted: the pod tolerates the interruption taint forever"},
		{name: "daemonset pod", pl: plan.Plan{Skip: plan.SkipDaemonSet}, w: w, n: spot},
		{name: "finished pod", pl: plan.Plan{Skip: plan.SkipFinished}, w: w, n: spot},
		{name: "no deadline (someone else's NoExecute taint)", pl: planned, w: plan.Window{SafetyMargin: 5 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := WarningFor(tc.pl, tc.w, tc.n)
			if !strings.HasPrefix(got.Message, tc.message) {
				t.Errorf("message %q, want it to start with %q", got.Message, tc.message)
			}
			got.Message = ""
			if got != tc.want {
				t.Errorf("WarningFor = %+v, want %+v", got, tc.want)
			}
		})
	}
}
