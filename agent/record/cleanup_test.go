package record

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/agent/events"
)

func TestComputeCleanup(t *testing.T) {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Labels: map[string]string{LabelExcludeFromLB: "true", "pool": "spot"},
			Annotations: map[string]string{
				AnnotationOwned:           `{"taints":["example.com/reclaim:NoExecute","reprieve.io/memory-pressure:NoSchedule"],"labels":["` + LabelExcludeFromLB + `"]}`,
				AnnotationInterruption:    `{}`,
				AnnotationReclaimDeadline: "2026-12-04T12:00:00Z",
				"example.com/owner":       "platform",
			},
		},
		Spec: v1.NodeSpec{Taints: []v1.Taint{
			{Key: "example.com/reclaim", Effect: v1.TaintEffectNoExecute},
			{Key: "reprieve.io/memory-pressure", Value: "true", Effect: v1.TaintEffectNoSchedule},
			{Key: "reprieve.io/scheduled-maintenance", Value: "true", Effect: v1.TaintEffectNoSchedule},
			{Key: "reprieve.io/rebalance-recommended", Value: "true", Effect: v1.TaintEffectPreferNoSchedule},
			{Key: "dedicated", Value: "gpu", Effect: v1.TaintEffectNoSchedule},
			{Key: "example.com/reclaim", Effect: v1.TaintEffectNoSchedule}, // not reprieve's: another effect
		}},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{
			{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady"},
			{Type: ConditionInterruption, Status: v1.ConditionFalse, Reason: ReasonNoInterruption},
			{Type: v1.NodeMaintenancePlanned, Status: v1.ConditionTrue, Reason: events.ReasonSpotInterruption},
			// kubectl drain --report-node-conditions': another writer's.
			{Type: v1.NodeDrained, Status: v1.ConditionTrue, Reason: "KubectlDrain"},
		}},
	}
	c := ComputeCleanup(node)
	if want := []v1.Taint{node.Spec.Taints[4], node.Spec.Taints[5]}; !reflect.DeepEqual(c.Taints, want) {
		t.Errorf("taints kept %v; want %v", c.Taints, want)
	}
	if len(c.Removed) != 4 {
		t.Errorf("taints removed %v; want reprieve's four", c.Removed)
	}
	if !reflect.DeepEqual(c.Labels, []string{LabelExcludeFromLB}) {
		t.Errorf("labels %v; want the load-balancer label reprieve added", c.Labels)
	}
	if want := []string{AnnotationInterruption, AnnotationOwned, AnnotationReclaimDeadline}; !reflect.DeepEqual(c.Annotations, want) {
		t.Errorf("annotations %v; want %v", c.Annotations, want)
	}
	if want := []v1.NodeConditionType{ConditionInterruption, v1.NodeMaintenancePlanned}; !reflect.DeepEqual(c.Conditions, want) {
		t.Errorf("conditions %v; want %v", c.Conditions, want)
	}
	if c.Empty() {
		t.Error("Empty on a node with reprieve's marks")
	}

	// A label someone else set, and a damaged owned record: both stay, as do taints outside
	// reprieve.io/ that the record cannot prove reprieve added.
	node.Annotations[AnnotationOwned] = "{damaged"
	c = ComputeCleanup(node)
	if len(c.Labels) != 0 || len(c.Taints) != 3 {
		t.Errorf("with a damaged owned record: labels %v, kept taints %v; want the label and example.com/reclaim kept", c.Labels, c.Taints)
	}

	clean := &v1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelExcludeFromLB: "true"}},
		Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "dedicated", Effect: v1.TaintEffectNoSchedule}}}}
	if c := ComputeCleanup(clean); !c.Empty() {
		t.Errorf("a node without reprieve's marks: %+v; want nothing to remove", c)
	}
}
