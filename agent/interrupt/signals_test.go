package interrupt

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/providers"
)

func TestNodeSignals(t *testing.T) {
	seen := t0.Add(time.Minute)
	first := func(string) time.Time { return seen }
	added := metav1.NewTime(t0)
	for _, tc := range []struct {
		name     string
		node     v1.Node
		kind     providers.Kind
		source   string
		deadline time.Time // zero: none
		fromSeen bool
		bad      string
	}{
		{name: "GKE scheduled maintenance", node: v1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
			LabelGKEScheduledMaintenance: "1795953600"}}},
			kind: providers.KindScheduledMaintenance, source: SourceGKEScheduledMaintenance, deadline: time.Unix(1795953600, 0)},
		{name: "GKE maintenance label that does not parse", node: v1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
			LabelGKEScheduledMaintenance: "tomorrow"}}}, bad: LabelGKEScheduledMaintenance},
		{name: "GKE maintenance ongoing", node: v1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
			LabelGKEActiveMaintenance: "ONGOING"}}},
			kind: providers.KindScheduledMaintenance, source: SourceGKEActiveMaintenance, deadline: seen.Add(60 * time.Second), fromSeen: true},
		{name: "GKE impending termination with timeAdded", node: v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{
			{Key: TaintGKEImpendingTermination, Effect: v1.TaintEffectNoSchedule, TimeAdded: &added}}}},
			kind: providers.KindTermination, source: SourceGKEImpendingTermination, deadline: t0.Add(30 * time.Second)},
		{name: "GKE impending termination without timeAdded", node: v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{
			{Key: TaintGKEImpendingTermination, Effect: v1.TaintEffectNoSchedule}}}},
			kind: providers.KindTermination, source: SourceGKEImpendingTermination, deadline: seen.Add(30 * time.Second), fromSeen: true},
		{name: "Karpenter disruption is information only", node: v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{
			{Key: TaintKarpenterDisrupted, Effect: v1.TaintEffectNoSchedule}}}},
			kind: providers.KindMaintenanceInformation, source: SourceKarpenterDisrupted},
		{name: "AKS preempt", node: aksNode(v1.ConditionTrue, "Preempt Scheduled: Sun, 29 Nov 2026 12:00:30 GMT. EventId: 6C1D3F5E"),
			kind: providers.KindPreemption, source: SourceAKSScheduledEvent, deadline: t0.Add(30 * time.Second)},
		{name: "AKS reboot", node: aksNode(v1.ConditionTrue, "Reboot Scheduled: Sun, 29 Nov 2026 12:20:00 GMT"),
			kind: providers.KindScheduledMaintenance, source: SourceAKSScheduledEvent, deadline: t0.Add(20 * time.Minute)},
		{name: "AKS preempt without a time is due at once", node: aksNode(v1.ConditionTrue, "Preempt Scheduled: soon"),
			kind: providers.KindPreemption, source: SourceAKSScheduledEvent, deadline: t0},
		{name: "AKS freeze keeps pods off, no deadline", node: aksNode(v1.ConditionTrue, "Freeze Scheduled: Sun, 29 Nov 2026 12:00:30 GMT"),
			kind: providers.KindScheduledMaintenance, source: SourceAKSScheduledEvent},
		{name: "AKS condition False raises nothing", node: aksNode(v1.ConditionFalse, "VM has no scheduled event")},
		{name: "AKS message of no known event type", node: aksNode(v1.ConditionTrue, "something else"), bad: ConditionAKSVMEventScheduled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns, bad := NodeSignals(&tc.node, first)
			if tc.bad != "" {
				if _, ok := bad[tc.bad]; !ok || len(ns) != 0 {
					t.Fatalf("notices %+v bad %v: want nothing raised and %s reported", ns, bad, tc.bad)
				}
				return
			}
			if tc.kind == "" {
				if len(ns) != 0 {
					t.Fatalf("notices %+v, want none", ns)
				}
				return
			}
			if len(ns) != 1 {
				t.Fatalf("notices %+v, want one", ns)
			}
			n := ns[0]
			if n.Kind != tc.kind || n.Source != tc.source || !n.Deadline.Equal(tc.deadline) || n.FromFirstSeen != tc.fromSeen {
				t.Fatalf("notice %+v: want kind %s source %s deadline %v fromFirstSeen %v", n, tc.kind, tc.source, tc.deadline, tc.fromSeen)
			}
		})
	}
}

func aksNode(status v1.ConditionStatus, msg string) v1.Node {
	return v1.Node{Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: ConditionAKSVMEventScheduled, Status: status,
		Reason: "VMEventScheduled", Message: msg, LastTransitionTime: metav1.NewTime(t0)}}}}
}
