// Package nodefacts is what the agent reads from a Node beyond its own record: the other
// interruption handlers it shows (Overlaps), the clouds' spot-pool labels (SpotPoolSelectors)
// and its accelerators (Accelerator). It is pure.
package nodefacts

import (
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Overlap is another program that acts on this node's interruptions too, as far as the node
// and its pods show it: each drains on its own plan, and two plans for one window fight
// (docs/faq.md, "Who should handle what").
type Overlap struct {
	// Who names the program ("Karpenter", "AKS node auto-drain", ...).
	Who string
	// Evidence is what on the node or its pods showed it.
	Evidence string
	// Advice says what to do about it.
	Advice string
}

// String is the overlap as one line, for the event, the log and doctor.
func (o Overlap) String() string {
	return fmt.Sprintf("%s also acts on this node's interruptions (%s): %s", o.Who, o.Evidence, o.Advice)
}

// nthName is aws-node-termination-handler's app.kubernetes.io/name (its chart's _helpers.tpl);
// nthPrefix the prefix of the labels and taints it writes on a node it handles
// (pkg/node/node.go: aws-node-termination-handler/{event-id,action,action-time} and, with
// --taint-node, the taints spot-itn, scheduled-maintenance, asg-lifecycle-termination and
// rebalance-recommendation).
const (
	nthName   = "aws-node-termination-handler"
	nthPrefix = nthName + "/"
)

// OverlapPodSelectors are the label selectors of the pods Overlaps looks at: a caller that reads
// the node's pods for it lists these only (with the node's field selector), never every pod of
// the node whole, which a tenant's pods can make hundreds of MiB (issue 39 item 3).
var OverlapPodSelectors = []string{"app.kubernetes.io/name=" + nthName, "app=" + nthName}

// aksAutoDrainTaints are the taint AKS node auto-drain puts on a node it cordons, in the
// current spelling and an older one (AKS docs, "Node auto-drain").
var aksAutoDrainTaints = []string{"remediator.kubernetes.azure.com/unschedulable", "remediator.aks.microsoft.com/unschedulable"}

// Overlaps lists the other interruption handlers that node and its pods show. It reads only
// what the agent already has (its own node and that node's pods) and is pure. Karpenter's
// interruption queue and AKS's auto-drain are settings of their controllers, which no node
// shows: a node they manage is reported, with what to check.
func Overlaps(node *v1.Node, pods []*v1.Pod) []Overlap {
	if node == nil {
		return nil
	}
	var out []Overlap
	for _, l := range []string{"karpenter.sh/nodepool", "karpenter.sh/provisioner-name"} {
		if v, ok := node.Labels[l]; ok {
			out = append(out, Overlap{Who: "Karpenter", Evidence: fmt.Sprintf("label %s=%s", l, v),
				Advice: "with an interruption queue (its settings.interruptionQueue, INTERRUPTION_QUEUE) Karpenter drains and terminates this node on a spot notice on its own plan; run Karpenter without one, or leave its nodes to it with the chart value excludeNodes: [karpenter.sh/nodepool] (docs/install.md, \"Other handlers of the same notice\")"})
			break
		}
	}
	if node.Labels["eks.amazonaws.com/capacityType"] == "SPOT" {
		out = append(out, Overlap{Who: "EKS managed node group", Evidence: "label eks.amazonaws.com/capacityType=SPOT",
			Advice: "a managed node group with Capacity Rebalancing drains a spot node itself on a rebalance recommendation (EKS, \"Managed node groups: capacity types\"); reprieve only taints PreferNoSchedule then, and handles the interruption notice"})
	}
	if strings.HasPrefix(node.Spec.ProviderID, "azure://") {
		if _, aks := node.Labels["kubernetes.azure.com/agentpool"]; aks {
			ev := "an AKS node (label kubernetes.azure.com/agentpool)"
			for _, t := range node.Spec.Taints {
				for _, k := range aksAutoDrainTaints {
					if t.Key == k {
						ev = "taint " + k + " on the node"
					}
				}
			}
			out = append(out, Overlap{Who: "AKS node auto-drain", Evidence: ev,
				Advice: "AKS cordons and drains a node on a Preempt or Redeploy scheduled event by default (AKS, \"Node auto-drain\"), in parallel with reprieve's plan: budgets and each pod's timing are then AKS's, not reprieve's"})
		}
	}
	var nth []string
	for _, p := range pods {
		if p.Spec.NodeName != node.Name {
			continue // not this node's (a caller's list that no field selector narrowed)
		}
		if p.Labels["app.kubernetes.io/name"] == nthName || p.Labels["app"] == nthName {
			nth = append(nth, "pod "+p.Namespace+"/"+p.Name)
		}
	}
	for k := range node.Labels {
		if strings.HasPrefix(k, nthPrefix) {
			nth = append(nth, "label "+k)
		}
	}
	for _, t := range node.Spec.Taints {
		if strings.HasPrefix(t.Key, nthPrefix) {
			nth = append(nth, "taint "+t.Key)
		}
	}
	if len(nth) > 0 {
		sort.Strings(nth)
		out = append(out, Overlap{Who: nthName, Evidence: strings.Join(nth, ", "),
			Advice: "it cordons and drains this node on the same notices, at once and with one grace for all; run one of the two on a node (docs/migrating-from-nth.md), or leave NTH's nodes to it with the chart value excludeNodes (a label only they carry)"})
	}
	return out
}
