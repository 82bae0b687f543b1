package record

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/providers"
)

// ReasonNoInterruption is the reason of reprieve's conditions when no interruption is in force.
const ReasonNoInterruption = "NoInterruption"

// HeartbeatPeriod is how often a True condition's lastHeartbeatTime is refreshed, as
// node-problem-detector's condition manager forces a sync every --k8s-exporter-heartbeat-period
// (5 minutes by default): a True condition whose heartbeat is much older than this was left by
// an agent that is gone. The writer syncs at every poll of the interruption loop, so the
// refresh lands within a poll interval of being due. A False condition is not refreshed: it
// says nothing that goes stale, and a fleet of quiet nodes writes nothing.
const HeartbeatPeriod = 5 * time.Minute

// conditionWant is what reprieve wants a condition to say.
type conditionWant struct {
	typ     v1.NodeConditionType
	status  v1.ConditionStatus
	reason  string
	message string
}

// ownReason reports whether reason is one reprieve writes on its conditions: a notice's event
// reason (events.NoticeReason) or ReasonNoInterruption. A lifecycle condition with any other
// reason is another writer's.
func ownReason(reason string) bool {
	switch reason {
	case ReasonNoInterruption, events.ReasonSpotInterruption, events.ReasonScheduledMaintenance, events.ReasonPreemption,
		events.ReasonTermination, events.ReasonNoticeReceived:
		return true
	}
	return false
}

// noticeMessage says what a notice is, where it came from and when it ends.
func noticeMessage(what string, n *providers.Notice, deadline time.Time) string {
	var b strings.Builder
	b.WriteString(what)
	if n != nil {
		fmt.Fprintf(&b, ": %s notice from %s", strings.ToLower(events.NoticeReason(n.Kind)), n.Provider)
		if n.Source != "" {
			fmt.Fprintf(&b, " (source %s)", n.Source)
		}
		if n.ID != "" {
			fmt.Fprintf(&b, ", id %s", n.ID)
		}
	}
	if !deadline.IsZero() {
		fmt.Fprintf(&b, "; deadline %s", deadline.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// wantedConditions is what reprieve's conditions should say for d. The lifecycle conditions are
// wanted False (turning off reprieve's own, if any) when d.Lifecycle is off.
func wantedConditions(node *v1.Node, d NodeDesire) []conditionWant {
	off := func(typ v1.NodeConditionType, msg string) conditionWant {
		return conditionWant{typ, v1.ConditionFalse, ReasonNoInterruption, msg}
	}
	in := d.Intent
	var out []conditionWant
	reason := ""
	if in.Interrupting() {
		reason = events.NoticeReason(providers.KindSpotInterruption)
		if in.Interruption != nil {
			reason = events.NoticeReason(in.Interruption.Kind)
		}
		out = append(out, conditionWant{ConditionInterruption, v1.ConditionTrue, reason,
			noticeMessage("reprieve is draining the node", in.Interruption, in.Deadline)})
	} else {
		out = append(out, off(ConditionInterruption, "reprieve: no interruption notice in force"))
	}

	// MaintenancePlanned: an interruption, or a notice still further away than the lead time
	// (the node will stop then), or a maintenance without a deadline (GCP live migration, Azure
	// Freeze). A rebalance recommendation plans nothing.
	planned := conditionWant{typ: v1.NodeMaintenancePlanned}
	switch {
	case !d.Lifecycle:
	case in.Interrupting():
		planned = conditionWant{v1.NodeMaintenancePlanned, v1.ConditionTrue, reason,
			noticeMessage("the node will stop", in.Interruption, in.Deadline)}
	case len(in.FarAhead) > 0:
		n := in.FarAhead[0]
		planned = conditionWant{v1.NodeMaintenancePlanned, v1.ConditionTrue, events.NoticeReason(n.Kind),
			noticeMessage("the node will stop", &n, n.Deadline)}
	case HasTaint(in.SoftTaints, d.Taints.Maintenance):
		planned = conditionWant{v1.NodeMaintenancePlanned, v1.ConditionTrue, events.ReasonScheduledMaintenance,
			"maintenance is scheduled for the node, without a deadline"}
	}
	if planned.status == "" {
		planned = off(v1.NodeMaintenancePlanned, "reprieve: no maintenance notice in force")
	}
	if !d.Lifecycle {
		return append(out, planned, off(v1.NodeDrainInProgress, "reprieve: not draining"), off(v1.NodeDrained, "reprieve: not draining"))
	}
	out = append(out, planned)

	// Drained stays True for the rest of the interruption once reached: under the NoExecute taint
	// no pod reprieve evicts comes back, and the executor stops reporting a drain it has approved.
	drained := in.Interrupting() && d.Drained
	if cur := findCondition(node, v1.NodeDrained); in.Interrupting() && cur != nil && cur.Status == v1.ConditionTrue && cur.Reason == reason {
		drained = true
	}
	switch {
	case !in.Interrupting():
		out = append(out, off(v1.NodeDrainInProgress, "reprieve: not draining"), off(v1.NodeDrained, "reprieve: not draining"))
	case drained:
		out = append(out, conditionWant{v1.NodeDrainInProgress, v1.ConditionFalse, reason, "every pod reprieve evicts is gone"},
			conditionWant{v1.NodeDrained, v1.ConditionTrue, reason, noticeMessage("every pod reprieve evicts is gone", in.Interruption, in.Deadline)})
	default:
		out = append(out, conditionWant{v1.NodeDrainInProgress, v1.ConditionTrue, reason, noticeMessage("reprieve is evicting the node's pods", in.Interruption, in.Deadline)},
			conditionWant{v1.NodeDrained, v1.ConditionFalse, reason, "reprieve is still evicting"})
	}
	return out
}

func findCondition(node *v1.Node, typ v1.NodeConditionType) *v1.NodeCondition {
	if node == nil {
		return nil
	}
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == typ {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// ComputeConditionChange is pure: it returns the conditions of reprieve's that node must change
// to carry d at now, each complete as node-problem-detector sends them (its heartbeat now, its
// transition time now when the status changes, else kept); nil when nothing changes, or when
// d.Conditions is off. It never returns another writer's condition: not the kubelet's (other
// types), and not a lifecycle condition another writer set True. A condition reprieve never set
// is not written False (a quiet node gets no status write); one it set is turned False, not
// removed, as node-problem-detector does when a problem goes away, so that its
// lastTransitionTime says when the interruption ended.
func ComputeConditionChange(node *v1.Node, d NodeDesire, now time.Time) []v1.NodeCondition {
	if !d.Conditions {
		return nil
	}
	now = now.Truncate(time.Second) // metav1.Time is serialized in whole seconds
	var out []v1.NodeCondition
	for _, w := range wantedConditions(node, d) {
		cur := findCondition(node, w.typ)
		ours := cur != nil && (w.typ == ConditionInterruption || ownReason(cur.Reason))
		switch {
		case w.status != v1.ConditionTrue && (cur == nil || !ours):
			continue // never set by reprieve, or another writer's
		case w.status == v1.ConditionTrue && cur != nil && !ours && cur.Status == v1.ConditionTrue:
			continue // another writer already says so; leave it theirs
		case cur != nil && ours && cur.Status == w.status && cur.Reason == w.reason && cur.Message == w.message &&
			(w.status != v1.ConditionTrue || now.Sub(cur.LastHeartbeatTime.Time) < HeartbeatPeriod):
			continue // as wanted, and its heartbeat is fresh
		}
		c := v1.NodeCondition{Type: w.typ, Status: w.status, Reason: w.reason, Message: w.message,
			LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)}
		if cur != nil && cur.Status == w.status && !cur.LastTransitionTime.IsZero() {
			c.LastTransitionTime = cur.LastTransitionTime
		}
		out = append(out, c)
	}
	return out
}

// conditionPatch is the strategic merge patch of node status that sets conds, as the kubelet and
// node-problem-detector send theirs: status.conditions merges by type, so the patch carries only
// reprieve's conditions and every other writer's stay as they are. No resourceVersion: the merge
// cannot drop another writer's condition, so a stale read costs nothing.
func conditionPatch(conds []v1.NodeCondition) ([]byte, error) {
	b, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": conds}})
	if err != nil {
		return nil, fmt.Errorf("encoding node status patch: %w", err)
	}
	return b, nil
}
