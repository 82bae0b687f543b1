package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestOverlappingHandlersSaid (issue 35 item 5): on a node that Karpenter launched, with
// aws-node-termination-handler's pod running on it, the agent says at start, as Warning events
// on the node, that both act on this node's interruptions too; a node with neither gets no such
// event. The real agent binary against the real API server, reading only its node and pods.
func TestOverlappingHandlersSaid(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const ns, node, plain = "overlaps", "overlaps-node", "overlaps-plain"
	setupNode(ctx, t, ns, node, map[string]string{"karpenter.sh/nodepool": "spot", "karpenter.sh/capacity-type": "spot"})
	if _, err := env.CreateNode(ctx, plain, map[string]string{"karpenter.sh/capacity-type": "spot"}); err != nil {
		t.Fatal(err)
	}
	// NTH's IMDS-mode DaemonSet pod, as its chart labels it, on the node; one on the other node
	// too, which must not count for this one.
	for _, on := range []string{node, "overlaps-elsewhere"} {
		if on != node {
			if _, err := env.CreateNode(ctx, on, nil); err != nil {
				t.Fatal(err)
			}
		}
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nth-" + on, Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/name": "aws-node-termination-handler"}},
			Spec: v1.PodSpec{NodeName: on, Containers: []v1.Container{{Name: "nth", Image: "nth"}}}}
		if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{node, plain} {
		p, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, n, "--kubeconfig="+agentKubeconfig, "--provider=none")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = p.Stop() }()
	}
	warnings := func(n, reason string) []v1.Event {
		evs, err := env.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + n + ",reason=" + reason})
		if err != nil {
			t.Fatal(err)
		}
		return evs.Items
	}
	waitFor(ctx, t, "the Karpenter and aws-node-termination-handler events", func() bool {
		return len(warnings(node, "KarpenterManaged")) > 0 && len(warnings(node, events.ReasonOverlappingHandler)) > 0
	})
	k, o := warnings(node, "KarpenterManaged")[0], warnings(node, events.ReasonOverlappingHandler)[0]
	if k.Type != v1.EventTypeWarning || !strings.Contains(k.Message, "karpenter.sh/nodepool=spot") {
		t.Errorf("KarpenterManaged %s %q: want a Warning naming the label", k.Type, k.Message)
	}
	if o.Type != v1.EventTypeWarning || !strings.Contains(o.Message, "aws-node-termination-handler also acts") ||
		!strings.Contains(o.Message, "pod "+ns+"/nth-"+node) || strings.Contains(o.Message, "overlaps-elsewhere") {
		t.Errorf("OverlappingHandler %s %q: want a Warning naming this node's NTH pod only", o.Type, o.Message)
	}
	// The other agent has started as long as this one: nothing to say on its node.
	if got := append(warnings(plain, "KarpenterManaged"), warnings(plain, events.ReasonOverlappingHandler)...); len(got) != 0 {
		t.Errorf("events on a node with no other handler: %+v", got)
	}
}
