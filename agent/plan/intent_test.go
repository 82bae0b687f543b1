package plan

import (
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/providers"
	v1 "k8s.io/api/core/v1"
)

func TestIntend(t *testing.T) {
	ts := TaintSet{
		Interruption: v1.Taint{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute},
		Rebalance:    v1.Taint{Key: "reprieve.io/rebalance-recommended", Value: "true", Effect: v1.TaintEffectPreferNoSchedule},
		Maintenance:  v1.Taint{Key: "reprieve.io/scheduled-maintenance", Value: "true", Effect: v1.TaintEffectNoSchedule},
	}
	lead := 10 * time.Minute
	spot := providers.Notice{Kind: providers.KindSpotInterruption, ID: "s", Deadline: t0.Add(2 * time.Minute)}
	rebalance := providers.Notice{Kind: providers.KindRebalanceRecommendation, ID: "r"}
	farMaint := providers.Notice{Kind: providers.KindScheduledMaintenance, ID: "m", Deadline: t0.Add(48 * time.Hour)}
	nearMaint := providers.Notice{Kind: providers.KindScheduledMaintenance, ID: "m2", Deadline: t0.Add(9 * time.Minute)}

	if in := Intend(nil, t0, lead, ts); in.Interrupting() || len(in.SoftTaints) != 0 {
		t.Errorf("no notices: %+v", in)
	}
	if in := Intend([]providers.Notice{rebalance}, t0, lead, ts); in.Interrupting() || len(in.SoftTaints) != 1 || in.SoftTaints[0].Key != ts.Rebalance.Key {
		t.Errorf("rebalance: %+v", in)
	}
	in := Intend([]providers.Notice{farMaint}, t0, lead, ts)
	if in.Interrupting() || len(in.SoftTaints) != 1 || in.SoftTaints[0].Effect != v1.TaintEffectNoSchedule {
		t.Errorf("far maintenance must only add the NoSchedule maintenance taint: %+v", in)
	}
	// The same event, once the lead time is reached, interrupts.
	if in := Intend([]providers.Notice{farMaint}, farMaint.Deadline.Add(-lead), lead, ts); !in.Interrupting() || !in.Deadline.Equal(farMaint.Deadline) {
		t.Errorf("maintenance at the lead time must interrupt: %+v", in)
	}
	soft := providers.Notice{Kind: providers.KindScheduledMaintenance, ID: "freeze"}
	if in := Intend([]providers.Notice{soft}, t0, lead, ts); in.Interrupting() || len(in.SoftTaints) != 1 {
		t.Errorf("maintenance without a deadline is a soft notice: %+v", in)
	}
	preempt := providers.Notice{Kind: providers.KindPreemption, ID: "p", Deadline: t0.Add(30 * time.Second)}
	if in := Intend([]providers.Notice{preempt}, t0, lead, ts); !in.Interrupting() || !in.Deadline.Equal(preempt.Deadline) {
		t.Errorf("a preemption interrupts at once: %+v", in)
	}
	// A spot notice whose deadline is a year away is not believed to interrupt now.
	yearOut := providers.Notice{Kind: providers.KindSpotInterruption, ID: "y", Deadline: t0.Add(365 * 24 * time.Hour)}
	if in := Intend([]providers.Notice{yearOut}, t0, lead, ts); in.Interrupting() || len(in.SoftTaints) != 1 || len(in.FarAhead) != 1 {
		t.Errorf("a deadline a year out must only keep new pods off: %+v", in)
	}
	// A deadline already past still interrupts (at once, with the shortest graces).
	past := providers.Notice{Kind: providers.KindSpotInterruption, ID: "p", Deadline: t0.Add(-time.Minute)}
	if in := Intend([]providers.Notice{past}, t0, lead, ts); !in.Interrupting() || !in.Deadline.Equal(past.Deadline) {
		t.Errorf("a past deadline: %+v", in)
	}
	in = Intend([]providers.Notice{nearMaint, spot, rebalance}, t0, lead, ts)
	if !in.Deadline.Equal(spot.Deadline) || in.Interruption.ID != "s" || len(in.SoftTaints) != 1 {
		t.Errorf("earliest deadline wins: %+v", in)
	}
}
