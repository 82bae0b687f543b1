package record

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/providers"
)

// applyConditions applies the status patch to a copy of node with the strategic merge the API
// server applies (status.conditions merges by type).
func applyConditions(t *testing.T, node *v1.Node, conds []v1.NodeCondition) *v1.Node {
	t.Helper()
	patch, err := conditionPatch(conds)
	if err != nil {
		t.Fatal(err)
	}
	orig, err := runtime.DefaultUnstructuredConverter.ToUnstructured(node)
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal(patch, &p); err != nil {
		t.Fatal(err)
	}
	out, err := strategicpatch.StrategicMergeMapPatch(orig, p, &v1.Node{})
	if err != nil {
		t.Fatal(err)
	}
	var n v1.Node
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(out, &n); err != nil {
		t.Fatal(err)
	}
	return &n
}

func spotDesire(deadline time.Time, lifecycle, drained bool) NodeDesire {
	n := &providers.Notice{Provider: "aws", Source: "instance-action", Kind: providers.KindSpotInterruption, ID: "spot-1", Deadline: deadline}
	return NodeDesire{Intent: plan.Intent{Deadline: deadline, Interruption: n}, Conditions: true, Lifecycle: lifecycle, Drained: drained}
}

func kubeletNode() *v1.Node {
	hb := metav1.NewTime(t0.Add(-time.Hour))
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: v1.NodeStatus{Conditions: []v1.NodeCondition{
		{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: hb, LastTransitionTime: hb},
		{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse, Reason: "KubeletHasSufficientMemory", LastHeartbeatTime: hb, LastTransitionTime: hb},
	}}}
}

func condOf(n *v1.Node, typ v1.NodeConditionType) *v1.NodeCondition { return findCondition(n, typ) }

// TestConditionFollowsTheInterruption: True at the notice with the notice's reason, the deadline
// (RFC 3339) and the source in the message; no rewrite while it says the same; False (not
// removed) once withdrawn, with a new transition time; the kubelet's conditions untouched.
func TestConditionFollowsTheInterruption(t *testing.T) {
	deadline := t0.Add(2 * time.Minute)
	node := kubeletNode()
	if got := ComputeConditionChange(node, NodeDesire{Conditions: true}, t0); got != nil {
		t.Fatalf("a quiet node with no condition of reprieve's got %v; want no write", got)
	}
	if got := ComputeConditionChange(node, NodeDesire{Intent: spotDesire(deadline, false, false).Intent}, t0); got != nil {
		t.Fatalf("with --node-conditions off: %v; want nothing", got)
	}

	ch := ComputeConditionChange(node, spotDesire(deadline, false, false), t0)
	if len(ch) != 1 {
		t.Fatalf("at the notice: %v; want reprieve.io/Interruption alone (lifecycle off)", ch)
	}
	node = applyConditions(t, node, ch)
	c := condOf(node, ConditionInterruption)
	if c == nil || c.Status != v1.ConditionTrue || c.Reason != "SpotInterruption" ||
		!strings.Contains(c.Message, deadline.Format(time.RFC3339)) || !strings.Contains(c.Message, "aws") ||
		!strings.Contains(c.Message, "instance-action") || !c.LastTransitionTime.Time.Equal(t0) || !c.LastHeartbeatTime.Time.Equal(t0) {
		t.Fatalf("condition at the notice = %+v", c)
	}
	if r := condOf(node, v1.NodeReady); r == nil || r.Status != v1.ConditionTrue || r.Reason != "KubeletReady" || len(node.Status.Conditions) != 3 {
		t.Fatalf("the kubelet's conditions changed: %+v", node.Status.Conditions)
	}
	if got := ComputeConditionChange(node, spotDesire(deadline, false, false), t0.Add(time.Minute)); got != nil {
		t.Fatalf("unchanged a minute later: %v; want no write", got)
	}
	// Heartbeat, as node-problem-detector: due after HeartbeatPeriod, transition time kept.
	hb := ComputeConditionChange(node, spotDesire(deadline, false, false), t0.Add(HeartbeatPeriod))
	if len(hb) != 1 || !hb[0].LastHeartbeatTime.Time.Equal(t0.Add(HeartbeatPeriod)) || !hb[0].LastTransitionTime.Time.Equal(t0) {
		t.Fatalf("heartbeat = %+v", hb)
	}
	// A moved deadline rewrites the message, keeps the transition time.
	moved := ComputeConditionChange(node, spotDesire(deadline.Add(-time.Minute), false, false), t0.Add(time.Second))
	if len(moved) != 1 || !strings.Contains(moved[0].Message, deadline.Add(-time.Minute).Format(time.RFC3339)) || !moved[0].LastTransitionTime.Time.Equal(t0) {
		t.Fatalf("moved deadline = %+v", moved)
	}

	later := t0.Add(30 * time.Second)
	off := ComputeConditionChange(node, NodeDesire{Conditions: true}, later)
	if len(off) != 1 || off[0].Status != v1.ConditionFalse || off[0].Reason != ReasonNoInterruption || !off[0].LastTransitionTime.Time.Equal(later) {
		t.Fatalf("at the withdrawal: %+v; want False, NoInterruption, transition now", off)
	}
	node = applyConditions(t, node, off)
	if got := ComputeConditionChange(node, NodeDesire{Conditions: true}, later.Add(time.Hour)); got != nil {
		t.Fatalf("a False condition is not refreshed: %v", got)
	}
}

// TestLifecycleConditions: MaintenancePlanned and DrainInProgress at the notice, Drained once
// the executor says so (and it stays), all False at the withdrawal; another writer's True
// condition (kubectl drain's reason) is neither claimed nor turned off.
func TestLifecycleConditions(t *testing.T) {
	deadline := t0.Add(2 * time.Minute)
	node := kubeletNode()
	node = applyConditions(t, node, ComputeConditionChange(node, spotDesire(deadline, true, false), t0))
	for typ, want := range map[v1.NodeConditionType]v1.ConditionStatus{ConditionInterruption: "True", v1.NodeMaintenancePlanned: "True",
		v1.NodeDrainInProgress: "True"} {
		if c := condOf(node, typ); c == nil || c.Status != want {
			t.Errorf("%s = %+v, want %s", typ, c, want)
		}
	}
	if c := condOf(node, v1.NodeDrained); c != nil {
		t.Errorf("Drained before the drain = %+v; want none yet (a condition reprieve never set is not written False)", c)
	}
	node = applyConditions(t, node, ComputeConditionChange(node, spotDesire(deadline, true, true), t0.Add(10*time.Second)))
	if c := condOf(node, v1.NodeDrained); c == nil || c.Status != v1.ConditionTrue || !c.LastTransitionTime.Time.Equal(t0.Add(10*time.Second)) {
		t.Errorf("Drained once drained = %+v", c)
	}
	if c := condOf(node, v1.NodeDrainInProgress); c == nil || c.Status != v1.ConditionFalse {
		t.Errorf("DrainInProgress once drained = %+v", c)
	}
	// The executor stops reporting a drain it approved (Azure): Drained stays.
	if got := ComputeConditionChange(node, spotDesire(deadline, true, false), t0.Add(20*time.Second)); got != nil {
		t.Errorf("after the approval: %v; want Drained kept", got)
	}
	off := ComputeConditionChange(node, NodeDesire{Conditions: true, Lifecycle: true}, t0.Add(time.Minute))
	node = applyConditions(t, node, off)
	for _, typ := range append([]v1.NodeConditionType{ConditionInterruption}, LifecycleConditions...) {
		if c := condOf(node, typ); c == nil || c.Status != v1.ConditionFalse {
			t.Errorf("%s after the withdrawal = %+v, want False", typ, c)
		}
	}

	// Another writer's.
	other := kubeletNode()
	other.Status.Conditions = append(other.Status.Conditions, v1.NodeCondition{Type: v1.NodeDrainInProgress, Status: v1.ConditionTrue, Reason: "KubectlDrain"})
	for _, c := range ComputeConditionChange(other, spotDesire(deadline, true, false), t0) {
		if c.Type == v1.NodeDrainInProgress {
			t.Errorf("claimed another writer's True DrainInProgress: %+v", c)
		}
	}
	for _, c := range ComputeConditionChange(other, NodeDesire{Conditions: true, Lifecycle: true}, t0) {
		if c.Type == v1.NodeDrainInProgress {
			t.Errorf("turned off another writer's DrainInProgress: %+v", c)
		}
	}
	// Lifecycle turned off later: reprieve's own lifecycle conditions go False.
	node = kubeletNode()
	node = applyConditions(t, node, ComputeConditionChange(node, spotDesire(deadline, true, false), t0))
	offNow := ComputeConditionChange(node, spotDesire(deadline, false, false), t0.Add(time.Second))
	if len(offNow) != 2 || offNow[0].Status != v1.ConditionFalse || offNow[1].Status != v1.ConditionFalse {
		t.Errorf("with --lifecycle-conditions turned off: %v; want reprieve's two lifecycle conditions False", offNow)
	}
}

// TestMaintenancePlannedFarAhead: a notice further away than the lead time plans maintenance
// without an interruption: MaintenancePlanned True, reprieve.io/Interruption not written.
func TestMaintenancePlannedFarAhead(t *testing.T) {
	d := t0.Add(48 * time.Hour)
	n := providers.Notice{Provider: "azure", Kind: providers.KindScheduledMaintenance, ID: "ev-1", Deadline: d}
	ch := ComputeConditionChange(kubeletNode(), NodeDesire{Intent: plan.Intent{FarAhead: []providers.Notice{n}}, Conditions: true, Lifecycle: true}, t0)
	if len(ch) != 1 || ch[0].Type != v1.NodeMaintenancePlanned || ch[0].Reason != "ScheduledMaintenance" || !strings.Contains(ch[0].Message, d.Format(time.RFC3339)) {
		t.Fatalf("far-ahead maintenance: %+v", ch)
	}
}
