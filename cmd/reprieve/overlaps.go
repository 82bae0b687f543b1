package main

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent/kube"
)

// ReasonKarpenterManaged is the node Event that says reprieve started on a node Karpenter
// manages.
const ReasonKarpenterManaged = "KarpenterManaged"

// karpenterLabels mark a node that Karpenter launched (v1: karpenter.sh/nodepool; v1beta1 and
// v1alpha5 before it: karpenter.sh/provisioner-name). karpenter.sh/capacity-type alone is not
// enough: users put it on node groups of their own to share selectors.
var karpenterLabels = []string{"karpenter.sh/nodepool", "karpenter.sh/provisioner-name"}

// noteKarpenterNode says, once at start, in the log and as an Event on the node, when the node
// is managed by Karpenter. With an interruption queue Karpenter drains and terminates such a
// node itself on a spot notice, on its own plan (docs/faq.md): the operator must pick one of the
// two. reprieve cannot see Karpenter's settings, so it warns rather than stands aside. An error
// writing the Event is logged and otherwise ignored: it must not stop the agent. start calls it
// in the background once getNode has read the node, so that a slow API server delays nothing.
func noteKarpenterNode(ctx context.Context, client kube.Interface, node *v1.Node, clk clock.Clock) {
	logger := klog.FromContext(ctx)
	nodeName := node.Name
	label, pool := "", ""
	for _, l := range karpenterLabels {
		if v, ok := node.Labels[l]; ok {
			label, pool = l, v
			break
		}
	}
	if label == "" {
		return
	}
	msg := fmt.Sprintf("Node is managed by Karpenter (%s=%s). If Karpenter has an interruption queue it also drains this node "+
		"on a spot notice, on its own plan: run Karpenter without one here, or keep reprieve off its nodes (docs/faq.md)", label, pool)
	logger.Info("Node is managed by Karpenter; Karpenter with an interruption queue also acts on spot notices", "node", klog.KObj(node), label, pool)
	now := metav1.NewTime(clk.Now())
	ev := &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: nodeName + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: v1.ObjectReference{Kind: "Node", Name: nodeName, UID: types.UID(nodeName)},
		Reason:         ReasonKarpenterManaged, Message: msg, Type: v1.EventTypeNormal,
		Source:         v1.EventSource{Component: "reprieve", Host: nodeName},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		logger.Error(err, "Recording the KarpenterManaged event", "node", klog.KObj(node))
	}
}
