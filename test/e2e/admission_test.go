package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestAdmissionPolicyBindsTheAgentToItsNode applies the shipped ValidatingAdmissionPolicies
// (deploy/manifests/admission-policy.yaml) on the real API server, for a ServiceAccount with the
// shipped ClusterRole, and uses tokens bound to agent pods on two nodes, as the kubelet projects
// them: the agent of node A cannot change node B, cannot remove a taint it does not own, cannot
// change the node's other fields or labels or annotations, cannot delete a pod on node B, and
// a token bound to no pod can change no node; yet the real agent, with A's token, carries out an
// interruption on node A.
func TestAdmissionPolicyBindsTheAgentToItsNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, sa, nodeA, nodeB = "vap", "reprieve-vap", "vap-a", "vap-b"
	c := env.Client
	kubeA := boundAgents(ctx, t, ns, sa, nodeA, nodeB)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	// The workload the agent evicts at the end: it tolerates the interruption taint 2 s.
	if err := scenario.Create(ctx, c, ns, nodeA, taint, []scenario.Pod{{Name: "work", Kind: scenario.Plain, Tolerate: ptr64(2), Grace: ptr64(1)}}); err != nil {
		t.Fatal(err)
	}
	unboundKube, err := env.ServiceAccountKubeconfig(ctx, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	clientA, unbound := clientFor(t, kubeA), clientFor(t, unboundKube)

	patch := func(cl kubernetes.Interface, node string, p map[string]any) error {
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cl.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{})
		return err
	}
	taints := func(ts ...v1.Taint) map[string]any { return map[string]any{"spec": map[string]any{"taints": ts}} }
	spot := v1.Taint{Key: taint.Key, Value: taint.Value, Effect: taint.Effect, TimeAdded: &metav1.Time{Time: time.Now().Truncate(time.Second)}}
	// Policies take effect once the API server has loaded them.
	waitFor(ctx, t, "the policy in force", func() bool {
		err := patch(clientA, nodeB, taints(spot))
		return err != nil && strings.Contains(err.Error(), "reprieve may change only the node its token is bound to")
	})

	denied := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want it refused with %q", what, err, want)
		}
	}
	allowed := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v; want it allowed", what, err)
		}
	}
	denied("node A's agent tainting node B", patch(clientA, nodeB, taints(spot)), "bound to ("+nodeA+"), not "+nodeB)
	denied("a token bound to no pod tainting node A", patch(unbound, nodeA, taints(spot)), "this token is bound to no node")
	nodeTaints := func(node string) []v1.Taint {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Spec.Taints
	}
	denied("node A's agent dropping the taints it found", patch(clientA, nodeA, taints(spot)), "only its own taints")
	allowed("node A's agent tainting node A", patch(clientA, nodeA, taints(append(nodeTaints(nodeA), spot)...)))

	// Someone else's taint on node A: reprieve's agent may keep it, not remove it.
	n, err := c.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other := v1.Taint{Key: "example.com/other", Value: "x", Effect: v1.TaintEffectNoSchedule}
	patchNode(ctx, t, taints(append(n.Spec.Taints, other)...), nodeA)
	n, err = c.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var withoutOther []v1.Taint
	for _, tt := range n.Spec.Taints {
		if tt.Key != other.Key {
			withoutOther = append(withoutOther, tt)
		}
	}
	denied("removing a taint reprieve does not own", patch(clientA, nodeA, taints(withoutOther...)), "only its own taints")
	denied("adding a taint outside reprieve's keys", patch(clientA, nodeA, taints(append(n.Spec.Taints, v1.Taint{Key: "example.com/mine", Effect: v1.TaintEffectNoSchedule})...)), "only its own taints")
	allowed("adding reprieve.io/ taints next to the other one", patch(clientA, nodeA, taints(append(n.Spec.Taints, v1.Taint{Key: "reprieve.io/scheduled-maintenance", Value: "true", Effect: v1.TaintEffectNoSchedule})...)))
	denied("cordoning", patch(clientA, nodeA, map[string]any{"spec": map[string]any{"unschedulable": true}}), "spec other than taints")
	denied("a label of its own choosing", patch(clientA, nodeA, map[string]any{"metadata": map[string]any{"labels": map[string]any{"example.com/x": "y"}}}), "exclude-from-external-load-balancers label")
	denied("removing another label", patch(clientA, nodeA, map[string]any{"metadata": map[string]any{"labels": map[string]any{"type": nil}}}), "exclude-from-external-load-balancers label")
	allowed("the load-balancer exclusion label", patch(clientA, nodeA, map[string]any{"metadata": map[string]any{"labels": map[string]any{v1.LabelNodeExcludeBalancers: "true"}}}))
	denied("another annotation", patch(clientA, nodeA, map[string]any{"metadata": map[string]any{"annotations": map[string]any{"example.com/x": "y"}}}), "reprieve.io/ annotations")
	allowed("a reprieve.io/ annotation", patch(clientA, nodeA, map[string]any{"metadata": map[string]any{"annotations": map[string]any{"reprieve.io/test": "y"}}}))
	denied("deleting a pod on node B", clientA.CoreV1().Pods(ns).Delete(ctx, "victim-"+nodeB, metav1.DeleteOptions{}), "only pods on the node its token is bound to")
	allowed("deleting a pod on node A", clientA.CoreV1().Pods(ns).Delete(ctx, "victim-"+nodeA, metav1.DeleteOptions{}))

	// Node A's own agent, with A's token, through an interruption: every request it makes passes.
	// Back to the node's own taints and someone else's, without reprieve's.
	var before []v1.Taint
	for _, tt := range nodeTaints(nodeA) {
		if tt.Key != taint.Key && !strings.HasPrefix(tt.Key, "reprieve.io/") {
			before = append(before, tt)
		}
	}
	patchNode(ctx, t, taints(before...), nodeA)
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, nodeA, "--kubeconfig="+kubeA, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	setDeadline(ctx, t, nodeA, time.Now().Add(30*time.Second).UTC().Format(time.RFC3339))
	waitNode(ctx, t, nodeA, "the interruption taint next to the other one", func(n *v1.Node) bool {
		return hasTaint(n, taint.Key, taint.Effect) && hasTaint(n, other.Key, other.Effect) && n.Labels[v1.LabelNodeExcludeBalancers] == "true"
	})
	waitFor(ctx, t, "the workload on node A evicted", func() bool {
		p, err := c.CoreV1().Pods(ns).Get(ctx, "work", metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
	})
	if p, err := c.CoreV1().Pods(ns).Get(ctx, "agent-"+nodeA, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("the agent's own pod: %v, %v; want it left alone (its token is bound to it)", p, err)
	}
	if log := rp.LogTail(300); strings.Contains(log, "denied request") || strings.Contains(log, "ValidatingAdmissionPolicy") {
		t.Errorf("the agent met the policy on its own node:\n%s", log)
	}
	if p, err := c.CoreV1().Pods(ns).Get(ctx, "victim-"+nodeB, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("the pod on node B: %v, %v; want it untouched", p, err)
	}
}

func clientFor(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
