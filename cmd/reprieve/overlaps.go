package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/nodefacts"
)

// ReasonKarpenterManaged is the node Event that says reprieve started on a node Karpenter
// manages; ReasonOverlappingHandler the one for any other handler that acts on the same notices.
const (
	ReasonKarpenterManaged   = "KarpenterManaged"
	ReasonOverlappingHandler = events.ReasonOverlappingHandler
)

// noteOverlaps says, once at start, in the log and as a Warning Event on the node, which other
// programs also act on this node's interruptions (nodefacts.Overlaps: Karpenter, an EKS managed
// node group's rebalancing, AKS node auto-drain, aws-node-termination-handler), each on its
// own plan: the operator must pick one per node (docs/faq.md). pods are the node's pods, read
// once (nil when they could not be read). reprieve cannot see the other programs' settings, so
// it warns rather than stands aside. An error writing an Event is logged and otherwise ignored:
// it must not stop the agent. start calls it in the background once getNode has read the node,
// so that a slow API server delays nothing.
func noteOverlaps(ctx context.Context, client kube.Interface, node *v1.Node, pods []*v1.Pod, clk clock.Clock) {
	logger := klog.FromContext(ctx)
	for _, o := range nodefacts.Overlaps(node, pods) {
		reason := ReasonOverlappingHandler
		if o.Who == "Karpenter" {
			reason = ReasonKarpenterManaged
		}
		msg := o.String() + " (docs/faq.md)"
		logger.Info("Another handler acts on this node's interruptions too", "node", klog.KObj(node), "who", o.Who, "evidence", o.Evidence, "advice", o.Advice)
		now := metav1.NewTime(clk.Now())
		ev := &v1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: node.Name + ".", Namespace: metav1.NamespaceDefault},
			InvolvedObject: v1.ObjectReference{Kind: "Node", Name: node.Name, UID: types.UID(node.Name)},
			Reason:         reason, Message: msg, Type: v1.EventTypeWarning,
			Source:         v1.EventSource{Component: "reprieve", Host: node.Name},
			FirstTimestamp: now, LastTimestamp: now, Count: 1,
		}
		if _, err := client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			logger.Error(err, "Recording the event", "reason", reason, "node", klog.KObj(node))
		}
	}
}

// nodePods reads the node's pods that Overlaps looks at (nodefacts.OverlapPodSelectors, with a
// field selector on the node's name): never the whole cluster, nor every pod of the node whole,
// which a tenant's pods can make hundreds of MiB. nil when they cannot be read.
func nodePods(ctx context.Context, client kube.Interface, nodeName string) []*v1.Pod {
	out := []*v1.Pod{} // read, none found: not nil
	seen := map[types.UID]bool{}
	for _, sel := range nodefacts.OverlapPodSelectors {
		list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: sel,
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", nodeName).String()})
		if err != nil {
			klog.FromContext(ctx).Error(err, "Reading the node's pods to look for other interruption handlers", "node", nodeName)
			return nil
		}
		for i := range list.Items {
			if p := &list.Items[i]; !seen[p.UID] {
				seen[p.UID] = true
				out = append(out, p)
			}
		}
	}
	return out
}
