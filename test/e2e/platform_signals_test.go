package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/interrupt"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestPlatformSignals (issue 21 item 3): each platform's own signal on the node, alone (the
// agent runs with --provider none and no deadline annotation), taints the node and evicts a pod
// that does not tolerate the interruption; the signal's withdrawal withdraws what it raised.
// Karpenter's disruption taint is reported and never acted on.
func TestPlatformSignals(t *testing.T) {
	t.Parallel()
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	type signal struct {
		name       string
		set, unset func(ctx context.Context, t *testing.T, node string)
		acts       bool
		// providerID puts the node on the signal's platform: reprieve reads GKE's signals only
		// on gce:// nodes and AKS's only on azure:// ones (issue 39 item 5).
		providerID string
	}
	labelSignal := func(key string, value func() string) (func(context.Context, *testing.T, string), func(context.Context, *testing.T, string)) {
		return func(ctx context.Context, t *testing.T, node string) {
				patchNode(ctx, t, map[string]any{"metadata": map[string]any{"labels": map[string]any{key: value()}}}, node)
			}, func(ctx context.Context, t *testing.T, node string) {
				patchNode(ctx, t, map[string]any{"metadata": map[string]any{"labels": map[string]any{key: nil}}}, node)
			}
	}
	taintSignal := func(key string) (func(context.Context, *testing.T, string), func(context.Context, *testing.T, string)) {
		return func(ctx context.Context, t *testing.T, node string) {
				now := metav1.NewTime(time.Now())
				addTaint(ctx, t, node, v1.Taint{Key: key, Effect: v1.TaintEffectNoSchedule, TimeAdded: &now})
			}, func(ctx context.Context, t *testing.T, node string) {
				removeTaint(ctx, t, node, key)
			}
	}
	in40 := func() string { return strconv.FormatInt(time.Now().Add(40*time.Second).Unix(), 10) }
	gkeMaintSet, gkeMaintUnset := labelSignal(interrupt.LabelGKEScheduledMaintenance, in40)
	gkeOngoingSet, gkeOngoingUnset := labelSignal(interrupt.LabelGKEActiveMaintenance, func() string { return "ONGOING" })
	gkeTermSet, gkeTermUnset := taintSignal(interrupt.TaintGKEImpendingTermination)
	karpSet, karpUnset := taintSignal(interrupt.TaintKarpenterDisrupted)
	signals := []signal{
		{name: "gke-maintenance", set: gkeMaintSet, unset: gkeMaintUnset, acts: true, providerID: "gce://reprieve-e2e/us-central1-a/"},
		{name: "gke-ongoing", set: gkeOngoingSet, unset: gkeOngoingUnset, acts: true, providerID: "gce://reprieve-e2e/us-central1-a/"},
		{name: "gke-termination", set: gkeTermSet, unset: gkeTermUnset, acts: true, providerID: "gce://reprieve-e2e/us-central1-a/"},
		{name: "aks-vmevent", acts: true, providerID: "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/",
			set: func(ctx context.Context, t *testing.T, node string) {
				at := time.Now().Add(40 * time.Second).UTC().Format("Mon, 02 Jan 2006 15:04:05 GMT")
				setCondition(ctx, t, node, v1.NodeCondition{Type: interrupt.ConditionAKSVMEventScheduled, Status: v1.ConditionTrue,
					Reason: "VMEventScheduled", Message: "Preempt Scheduled: " + at + ". EventId: 6C1D3F5E-E2E",
					LastTransitionTime: metav1.Now(), LastHeartbeatTime: metav1.Now()})
			},
			unset: func(ctx context.Context, t *testing.T, node string) {
				setCondition(ctx, t, node, v1.NodeCondition{Type: interrupt.ConditionAKSVMEventScheduled, Status: v1.ConditionFalse,
					Reason: "NoVMEventScheduled", Message: "VM has no scheduled event", LastTransitionTime: metav1.Now(), LastHeartbeatTime: metav1.Now()})
			}},
		{name: "karpenter", set: karpSet, unset: karpUnset, acts: false},
	}
	for _, s := range signals {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			ns, node := "signal-"+s.name, "signal-"+s.name+"-node"
			setupNode(ctx, t, ns, node, nil)
			if s.providerID != "" {
				patchNode(ctx, t, map[string]any{"spec": map[string]any{"providerID": s.providerID + node}}, node)
			}
			pods := []scenario.Pod{{Name: "evictee", Kind: scenario.Plain, Grace: ptr64(2)}}
			if err := scenario.Create(ctx, env.Client, ns, node, taint, pods); err != nil {
				t.Fatal(err)
			}
			rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = rp.Stop() }()
			s.set(ctx, t, node)
			if !s.acts {
				// Reported once it is seen, and nothing else.
				waitFor(ctx, t, "the signal in the agent's log", func() bool {
					return strings.Contains(rp.LogTail(400), interrupt.SourceKarpenterDisrupted)
				})
				if n, _ := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); hasTaint(n, taint.Key, taint.Effect) {
					t.Fatal("Karpenter's disruption taint made reprieve taint the node: it must leave the drain to Karpenter")
				}
				if p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "evictee", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
					t.Fatalf("a pod was evicted for Karpenter's disruption taint (%v)", err)
				}
				return
			}
			n := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
			if n.Annotations[record.AnnotationReclaimDeadline] != "" {
				t.Errorf("with --provider none the deadline annotation is the operator's: reprieve wrote %q", n.Annotations[record.AnnotationReclaimDeadline])
			}
			waitFor(ctx, t, "the pod evicted", func() bool {
				p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "evictee", metav1.GetOptions{})
				return err != nil || p.DeletionTimestamp != nil
			})
			s.unset(ctx, t, node)
			waitNode(ctx, t, node, "the interruption taint removed with the signal", func(n *v1.Node) bool { return !hasTaint(n, taint.Key, taint.Effect) })
		})
	}
}

func addTaint(ctx context.Context, t *testing.T, node string, taint v1.Taint) {
	t.Helper()
	n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	patchNode(ctx, t, map[string]any{"metadata": map[string]any{"resourceVersion": n.ResourceVersion},
		"spec": map[string]any{"taints": append(n.Spec.Taints, taint)}}, node)
}

func removeTaint(ctx context.Context, t *testing.T, node, key string) {
	t.Helper()
	n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	taints := []v1.Taint{}
	for _, x := range n.Spec.Taints {
		if x.Key != key {
			taints = append(taints, x)
		}
	}
	patchNode(ctx, t, map[string]any{"metadata": map[string]any{"resourceVersion": n.ResourceVersion},
		"spec": map[string]any{"taints": taints}}, node)
}

// setCondition sets one node condition through the status subresource, as node-problem-detector
// does (a strategic merge patch keyed by type).
func setCondition(ctx context.Context, t *testing.T, node string, c v1.NodeCondition) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []v1.NodeCondition{c}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(fmt.Errorf("patching the %s condition of node %s: %w", c.Type, node, err))
	}
}
