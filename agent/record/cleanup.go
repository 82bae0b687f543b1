package record

import (
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Cleanup is what `reprieve cleanup` removes from a node once reprieve is uninstalled: everything
// reprieve wrote there, and nothing another writer did.
type Cleanup struct {
	// Taints is the node's complete new taint list (spec.taints is replaced whole) and Removed
	// the taints it drops.
	Taints  []v1.Taint
	Removed []v1.Taint
	// Labels and Annotations are the keys to delete.
	Labels, Annotations []string
	// Conditions are the condition types to delete from the node's status.
	Conditions []v1.NodeConditionType
}

// Empty reports whether the node carries nothing of reprieve's.
func (c Cleanup) Empty() bool {
	return len(c.Removed) == 0 && len(c.Labels) == 0 && len(c.Annotations) == 0 && len(c.Conditions) == 0
}

// ComputeCleanup is pure: what to remove from node so that it carries nothing reprieve wrote:
//   - every taint whose key starts with reprieve.io/ (the pressure, maintenance and rebalance
//     taints, the default interruption taint), and every taint the owned record says reprieve
//     added (an interruption taint of another key, --interruption-taint);
//   - the load-balancer exclusion label, if the owned record says reprieve added it (a label an
//     operator or another tool set stays);
//   - every reprieve.io/ annotation (the record, the deadline, the owned record itself);
//   - the reprieve.io/Interruption condition, and a lifecycle condition (MaintenancePlanned,
//     DrainInProgress, Drained) only while it carries one of reprieve's reasons, as the writer
//     decides whose it is (ComputeConditionChange).
//
// A damaged owned record proves nothing was added: an interruption taint outside reprieve.io/
// and the label then stay, the safe side, as ComputeNodeChange treats it.
func ComputeCleanup(node *v1.Node) Cleanup {
	own := parseOwned(node)
	ownTaints, ownLabels := setOf(own.Taints), setOf(own.Labels)
	var c Cleanup
	for _, t := range node.Spec.Taints {
		if strings.HasPrefix(t.Key, Prefix) || ownTaints[TaintID(t)] {
			c.Removed = append(c.Removed, t)
			continue
		}
		c.Taints = append(c.Taints, t)
	}
	if _, ok := node.Labels[LabelExcludeFromLB]; ok && ownLabels[LabelExcludeFromLB] {
		c.Labels = append(c.Labels, LabelExcludeFromLB)
	}
	for _, k := range sortedKeys(node.Annotations) {
		if strings.HasPrefix(k, Prefix) {
			c.Annotations = append(c.Annotations, k)
		}
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == ConditionInterruption {
			c.Conditions = append(c.Conditions, cond.Type)
			continue
		}
		for _, typ := range LifecycleConditions {
			if cond.Type == typ && ownReason(cond.Reason) {
				c.Conditions = append(c.Conditions, cond.Type)
			}
		}
	}
	return c
}
