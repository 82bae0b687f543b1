package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

func nodeCondition(n *v1.Node, typ v1.NodeConditionType) *v1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func conditionIs(n *v1.Node, typ v1.NodeConditionType, status v1.ConditionStatus) bool {
	c := nodeCondition(n, typ)
	return c != nil && c.Status == status
}

// TestNodeConditionFollowsTheTaint: with the defaults, the node condition reprieve.io/Interruption
// appears with the interruption taint (True, the notice's reason, the deadline and the source in
// its message) and goes with it (False, NoInterruption), through the agent's own token and the
// shipped RBAC; the kubelet's Ready stays as kwok keeps it, and no lifecycle condition is written.
func TestNodeConditionFollowsTheTaint(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const ns, node = "nodecond", "nodecond-node"
	setupNode(ctx, t, ns, node, nil)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	deadline := time.Now().Add(40 * time.Second).UTC().Truncate(time.Second).Format(time.RFC3339)
	setDeadline(ctx, t, node, deadline)
	n := waitNode(ctx, t, node, "the taint and the condition", func(n *v1.Node) bool {
		return hasTaint(n, taint.Key, taint.Effect) && conditionIs(n, record.ConditionInterruption, v1.ConditionTrue)
	})
	c := nodeCondition(n, record.ConditionInterruption)
	if c.Reason != "SpotInterruption" || !strings.Contains(c.Message, deadline) || !strings.Contains(c.Message, "none") ||
		!strings.Contains(c.Message, "annotation") || c.LastHeartbeatTime.IsZero() || c.LastTransitionTime.IsZero() {
		t.Errorf("condition = %+v; want reason SpotInterruption, the deadline %s and the source none/annotation in the message", c, deadline)
	}
	if !conditionIs(n, v1.NodeReady, v1.ConditionTrue) {
		t.Errorf("the kubelet's Ready changed: %+v", n.Status.Conditions)
	}
	if nodeCondition(n, v1.NodeMaintenancePlanned) != nil {
		t.Errorf("MaintenancePlanned written without --lifecycle-conditions: %+v", n.Status.Conditions)
	}

	setDeadline(ctx, t, node, "")
	n = waitNode(ctx, t, node, "the taint gone and the condition False", func(n *v1.Node) bool {
		return !hasTaint(n, taint.Key, taint.Effect) && conditionIs(n, record.ConditionInterruption, v1.ConditionFalse)
	})
	if c := nodeCondition(n, record.ConditionInterruption); c.Reason != record.ReasonNoInterruption || !c.LastTransitionTime.After(time.Now().Add(-20*time.Second)) {
		t.Errorf("after the withdrawal: %+v; want NoInterruption with a new transition time", c)
	}
	if !conditionIs(n, v1.NodeReady, v1.ConditionTrue) {
		t.Errorf("the kubelet's Ready changed: %+v", n.Status.Conditions)
	}
}

// testNodeLifecycleConditions: the API server's NodeLifecycleConditions gate changes nothing it
// stores (KEP-5683: "When the feature gate is disabled: No changes"): the shared API server, gate
// off, keeps a MaintenancePlanned condition like any other, so no write can tell the agent the
// gate's state, and --lifecycle-conditions is the operator's. Then, on a second kube-apiserver with
// --feature-gates=NodeLifecycleConditions=true on the same etcd, an agent with
// --lifecycle-conditions sets MaintenancePlanned and DrainInProgress at the notice, Drained (and
// DrainInProgress False) once its pods are gone, and turns all of them False with the withdrawal.
func testNodeLifecycleConditions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "lifecycle", "lifecycle-node"
	setupNode(ctx, t, ns, node, nil)
	c := env.Client

	// Gate off: stored anyway.
	probe, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []v1.NodeCondition{{Type: v1.NodeMaintenancePlanned,
		Status: v1.ConditionTrue, Reason: "AdminRequested", LastTransitionTime: metav1.Now(), LastHeartbeatTime: metav1.Now()}}}})
	n, err := c.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, probe, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
	if err != nil || !conditionIs(n, v1.NodeMaintenancePlanned, v1.ConditionTrue) {
		t.Fatalf("gate off: MaintenancePlanned %v, %v; want stored as any condition", err, n.Status.Conditions)
	}

	peer, err := env.StartPeerAPIServer(ctx, "kube-apiserver-lifecycle", "--feature-gates=NodeLifecycleConditions=true")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = peer.Stop() }()
	peerKubeconfig := repoint(t, agentKubeconfig, peer.Host)

	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	// Tolerating the taint 3 s keeps the drain in progress that long.
	if err := scenario.Create(ctx, c, ns, node, taint, []scenario.Pod{{Name: "evictee", Kind: scenario.Plain, Tolerate: ptr64(3), Grace: ptr64(1)}}); err != nil {
		t.Fatal(err)
	}
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+peerKubeconfig, "--provider=none", "--lifecycle-conditions")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	setDeadline(ctx, t, node, time.Now().Add(40*time.Second).UTC().Truncate(time.Second).Format(time.RFC3339))
	waitNode(ctx, t, node, "MaintenancePlanned and DrainInProgress", func(n *v1.Node) bool {
		return conditionIs(n, record.ConditionInterruption, v1.ConditionTrue) && conditionIs(n, v1.NodeMaintenancePlanned, v1.ConditionTrue) &&
			conditionIs(n, v1.NodeDrainInProgress, v1.ConditionTrue)
	})
	n = waitNode(ctx, t, node, "Drained once the pod is gone", func(n *v1.Node) bool {
		return conditionIs(n, v1.NodeDrained, v1.ConditionTrue) && conditionIs(n, v1.NodeDrainInProgress, v1.ConditionFalse)
	})
	if _, err := c.CoreV1().Pods(ns).Get(ctx, "evictee", metav1.GetOptions{}); err == nil {
		t.Error("Drained while the evicted pod still exists")
	}
	if d := nodeCondition(n, v1.NodeDrained); d.Reason != "SpotInterruption" {
		t.Errorf("Drained = %+v; want the notice's reason", d)
	}

	setDeadline(ctx, t, node, "")
	waitNode(ctx, t, node, "every condition False with the withdrawal", func(n *v1.Node) bool {
		for _, typ := range append([]v1.NodeConditionType{record.ConditionInterruption}, record.LifecycleConditions...) {
			if !conditionIs(n, typ, v1.ConditionFalse) {
				return false
			}
		}
		return !hasTaint(n, taint.Key, taint.Effect)
	})
}
