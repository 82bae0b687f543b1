package plan

import (
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/reprieve-dev/reprieve/providers"
)

// Intent is what reprieve wants on its node, derived from the notices in force.
type Intent struct {
	// Deadline is the earliest reclaim deadline of the interrupting notices; zero when none.
	Deadline time.Time
	// Interruption is the notice that decides Deadline.
	Interruption *providers.Notice
	// SoftTaints are reprieve's own non-evicting taints (rebalance, far-ahead maintenance).
	SoftTaints []v1.Taint
	// FarAhead lists the notices whose deadline is further away than the lead time.
	FarAhead []providers.Notice
}

// Interrupting reports whether an interruption is pending.
func (i Intent) Interrupting() bool { return !i.Deadline.IsZero() }

// TaintSet is the parsed form of the taint flags.
type TaintSet struct {
	Interruption, Rebalance, Maintenance v1.Taint
}

// Intend turns notices into an intent. A rebalance recommendation only adds its soft taint. A
// notice whose deadline is further away than lead (a scheduled event days ahead), or a
// maintenance notice without a deadline, only adds the maintenance taint: a NoExecute taint days
// ahead would empty the node days early; from lead on it interrupts.
func Intend(notices []providers.Notice, now time.Time, lead time.Duration, ts TaintSet) Intent {
	var in Intent
	rebalance, maintenance := false, false
	for i := range notices {
		n := notices[i]
		switch {
		case n.Kind == providers.KindRebalanceRecommendation:
			rebalance = true
			continue
		case n.Kind == providers.KindScheduledMaintenance && n.Deadline.IsZero():
			// Without a deadline at all (GCP live migration, Azure Freeze): keep new pods off
			// the node, evict nothing.
			maintenance = true
			continue
		case n.Deadline.IsZero():
			continue
		case n.Deadline.Sub(now) > lead:
			// Far ahead: a scheduled event days away, or a notice whose deadline makes no sense
			// for its kind (a spot notice a year out). A NoExecute taint now would empty the
			// node long before it goes; keep new pods off it until the lead time.
			maintenance = true
			in.FarAhead = append(in.FarAhead, n)
			continue
		}
		// Whole seconds, rounded down: that is what the deadline annotation can hold, so a
		// restarted agent (or an operator reading the node) plans with the same deadline, and
		// rounding down only ever leaves more room.
		if d := n.Deadline.Truncate(time.Second); in.Deadline.IsZero() || d.Before(in.Deadline) {
			in.Deadline = d
			in.Interruption = &notices[i]
		}
	}
	if rebalance {
		in.SoftTaints = append(in.SoftTaints, ts.Rebalance)
	}
	if maintenance {
		in.SoftTaints = append(in.SoftTaints, ts.Maintenance)
	}
	return in
}
