package plan

import (
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// TaintSet is the parsed form of the taint flags. Interruption is the interruption taint as
// it is written on the node: NoExecute (EvictionKubeControllerManager) or NoSchedule
// (EvictionReprieve); the plan reads it as NoExecute either way (Evicting).
type TaintSet struct {
	Interruption, Rebalance, Maintenance v1.Taint
}

// Eviction says who deletes the pods of an interruption (--interruption-eviction).
type Eviction string

const (
	// EvictionKubeControllerManager writes the interruption taint NoExecute, as upstream's
	// taint-based eviction reads it: kube-controller-manager's taint-eviction controller
	// deletes each pod once its toleration runs out (at once for a pod without one), with its
	// full grace and past any PodDisruptionBudget; reprieve evicts, through the Eviction API,
	// only the pods the deadline needs earlier.
	EvictionKubeControllerManager Eviction = "kube-controller-manager"
	// EvictionReprieve writes the interruption taint NoSchedule, which the taint-eviction
	// controller ignores: reprieve alone evicts each pod at the moment the NoExecute taint
	// would have made it due, through the Eviction API, so that budgets hold until the
	// pod's last safe moment.
	EvictionReprieve Eviction = "reprieve"
)

// Evictions lists the values of --interruption-eviction, the default first.
var Evictions = []Eviction{EvictionReprieve, EvictionKubeControllerManager}

// Eviction is who deletes the pods of an interruption, from the effect of the taint written.
func (ts TaintSet) Eviction() Eviction {
	if ts.Interruption.Effect == v1.TaintEffectNoSchedule {
		return EvictionReprieve
	}
	return EvictionKubeControllerManager
}

// Evicting is the interruption taint as the plan reads it: NoExecute whatever the effect
// written on the node, without timeAdded. Pods are planned from their tolerations of it.
func (ts TaintSet) Evicting() v1.Taint {
	t := ts.Interruption
	t.Effect, t.TimeAdded = v1.TaintEffectNoExecute, nil
	return t
}

// IsInterruption reports whether t is the interruption taint in either mode's effect (the
// same key and value, NoExecute or NoSchedule): a node written by an agent of the other mode
// carries it too, and its timeAdded is the same countdown.
func (ts TaintSet) IsInterruption(t v1.Taint) bool {
	return t.Key == ts.Interruption.Key && t.Value == ts.Interruption.Value &&
		(t.Effect == v1.TaintEffectNoExecute || t.Effect == v1.TaintEffectNoSchedule)
}

// EvictingTaints returns the taints the plan counts from, out of the node's taints as they are
// about to be: every NoExecute taint and, while interrupting with EvictionReprieve, the
// NoSchedule interruption taint read as NoExecute (the schedule is upstream's NoExecute
// schedule in both modes; only who carries it out differs). Outside an interruption a
// NoSchedule taint of that key evicts nothing. The interruption taint appears once: where the
// node carries it in both effects (a switch of mode mid-window, before the writer replaced
// one), the earlier timeAdded stands, as the countdown began then. It is pure.
func EvictingTaints(taints []v1.Taint, ts TaintSet, interrupting bool) []v1.Taint {
	var out []v1.Taint
	it := -1
	for _, t := range taints {
		switch {
		case t.Effect == v1.TaintEffectNoExecute && !ts.IsInterruption(t):
			out = append(out, t)
			continue
		case !ts.IsInterruption(t):
			continue
		case t.Effect == v1.TaintEffectNoSchedule && (!interrupting || ts.Eviction() != EvictionReprieve):
			continue
		}
		t.Effect = v1.TaintEffectNoExecute
		if it < 0 {
			it = len(out)
			out = append(out, t)
			continue
		}
		if prev := out[it].TimeAdded; prev == nil || (t.TimeAdded != nil && t.TimeAdded.Before(prev)) {
			out[it].TimeAdded = t.TimeAdded
		}
	}
	return out
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

// CountdownTaints is the taints the plan counts from, each with its countdown's anchor in
// TimeAdded: EvictingTaints of the node's taints as they are about to be (planned), then each
// anchored on the earlier of its timeAdded and when the caller first saw it (seen). A taint
// written without timeAdded (kubectl never sets it) counts from when it was first seen, as
// upstream anchors every taint; a timeAdded in the future (a writer with a fast clock) does not
// delay a pod upstream would evict at once. seen returns zero for a taint whose timeAdded is
// trusted as it is (what-if's imagined notice); such a taint without one counts from now.
//
// With EvictionReprieve, a NoSchedule taint of the interruption's key and value that someone
// else put on the node before (foreign: a spot pool's own taint) is not reprieve's countdown:
// its timeAdded, maybe days old, would make every pod due at once. It then counts from stamp,
// when reprieve wanted its own taint.
//
// The reconcile loop and the what-if plan both call it. It is pure.
func CountdownTaints(planned []v1.Taint, ts TaintSet, interrupting, foreign bool, stamp, now time.Time, seen func(v1.Taint) time.Time) []v1.Taint {
	if interrupting && foreign && ts.Eviction() == EvictionReprieve {
		planned = slices.Clone(planned)
		for i, t := range planned {
			if t.Key == ts.Interruption.Key && t.Effect == ts.Interruption.Effect {
				planned[i].TimeAdded = &metav1.Time{Time: stamp}
			}
		}
	}
	var out []v1.Taint
	for _, t := range EvictingTaints(planned, ts, interrupting) {
		at := seen(t)
		if at.IsZero() && t.TimeAdded == nil {
			at = now
		}
		if t.TimeAdded == nil || (!at.IsZero() && at.Before(t.TimeAdded.Time)) {
			t.TimeAdded = &metav1.Time{Time: at}
		}
		out = append(out, t)
	}
	return out
}
