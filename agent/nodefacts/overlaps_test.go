package nodefacts

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestOverlaps(t *testing.T) {
	node := func(providerID string, labels map[string]string, taints ...string) *v1.Node {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: labels}, Spec: v1.NodeSpec{ProviderID: providerID}}
		for _, k := range taints {
			n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: k, Effect: v1.TaintEffectNoSchedule})
		}
		return n
	}
	nthPod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "aws-node-termination-handler-x1",
		Labels: map[string]string{"app.kubernetes.io/name": "aws-node-termination-handler"}}, Spec: v1.PodSpec{NodeName: "n1"}}
	elsewhere := nthPod.DeepCopy()
	elsewhere.Name, elsewhere.Spec.NodeName = "aws-node-termination-handler-x2", "n2"
	other := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "web-1", Labels: map[string]string{"app": "web"}}, Spec: v1.PodSpec{NodeName: "n1"}}
	for _, tc := range []struct {
		name     string
		node     *v1.Node
		pods     []*v1.Pod
		who      []string
		evidence string
	}{
		{"plain", node("aws:///us-east-1a/i-1", map[string]string{"karpenter.sh/capacity-type": "spot"}), []*v1.Pod{other, elsewhere}, nil, ""},
		{"karpenter", node("aws:///us-east-1a/i-1", map[string]string{"karpenter.sh/nodepool": "default"}), nil, []string{"Karpenter"}, "karpenter.sh/nodepool=default"},
		{"eks managed spot", node("aws:///us-east-1a/i-1", map[string]string{"eks.amazonaws.com/capacityType": "SPOT"}), nil, []string{"EKS managed node group"}, "capacityType=SPOT"},
		{"eks managed on-demand", node("aws:///us-east-1a/i-1", map[string]string{"eks.amazonaws.com/capacityType": "ON_DEMAND"}), nil, nil, ""},
		{"aks", node("azure:///subscriptions/s/resourceGroups/mc/providers/Microsoft.Compute/virtualMachineScaleSets/aks-spot-1/virtualMachines/0",
			map[string]string{"kubernetes.azure.com/agentpool": "spot"}), nil, []string{"AKS node auto-drain"}, "kubernetes.azure.com/agentpool"},
		{"aks draining", node("azure:///subscriptions/s/x", map[string]string{"kubernetes.azure.com/agentpool": "spot"}, "remediator.kubernetes.azure.com/unschedulable"),
			nil, []string{"AKS node auto-drain"}, "taint remediator.kubernetes.azure.com/unschedulable"},
		{"aks label elsewhere", node("aws:///us-east-1a/i-1", map[string]string{"kubernetes.azure.com/agentpool": "spot"}), nil, nil, ""},
		{"nth pod", node("aws:///us-east-1a/i-1", nil), []*v1.Pod{other, nthPod}, []string{"aws-node-termination-handler"}, "pod kube-system/aws-node-termination-handler-x1"},
		{"nth taint", node("aws:///us-east-1a/i-1", nil, "aws-node-termination-handler/spot-itn"), nil, []string{"aws-node-termination-handler"}, "taint aws-node-termination-handler/spot-itn"},
		{"karpenter and nth", node("aws:///us-east-1a/i-1", map[string]string{"karpenter.sh/nodepool": "default", "aws-node-termination-handler/action": "x"}), nil,
			[]string{"Karpenter", "aws-node-termination-handler"}, "label aws-node-termination-handler/action"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Overlaps(tc.node, tc.pods)
			var who []string
			all := ""
			for _, o := range got {
				who = append(who, o.Who)
				all += o.String() + "\n"
				if o.Advice == "" {
					t.Errorf("%s: no advice", o.Who)
				}
			}
			if strings.Join(who, ",") != strings.Join(tc.who, ",") {
				t.Errorf("Overlaps = %q, want %q", who, tc.who)
			}
			if !strings.Contains(all, tc.evidence) {
				t.Errorf("Overlaps say %q; want the evidence %q", all, tc.evidence)
			}
		})
	}
	if Overlaps(nil, nil) != nil {
		t.Error("Overlaps of no node: want none")
	}
}
