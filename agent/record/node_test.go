package record

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/plan"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/providers"
)

// testTaintSet is the agent's default taints (config.DefaultConfig).
func testTaintSet(t *testing.T) plan.TaintSet {
	t.Helper()
	return plan.TaintSet{
		Interruption: v1.Taint{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute},
		Rebalance:    v1.Taint{Key: "reprieve.io/rebalance-recommended", Value: "true", Effect: v1.TaintEffectPreferNoSchedule},
		Maintenance:  v1.Taint{Key: "reprieve.io/scheduled-maintenance", Value: "true", Effect: v1.TaintEffectNoSchedule},
	}
}

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func fixedAddedAt(at time.Time) func(string) time.Time { return func(string) time.Time { return at } }

func interrupting(deadline time.Time) plan.Intent {
	return plan.Intent{Deadline: deadline, Interruption: &providers.Notice{Kind: providers.KindSpotInterruption, Deadline: deadline}}
}

// apply applies a change to a copy of node as the API server would apply the merge patch.
func apply(node *v1.Node, ch NodeChange) *v1.Node {
	n := node.DeepCopy()
	if ch.TaintsChanged {
		n.Spec.Taints = ch.Taints
	}
	for k, v := range ch.Labels {
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		if v == nil {
			delete(n.Labels, k)
		} else {
			n.Labels[k] = *v
		}
	}
	for k, v := range ch.Annotations {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		if v == nil {
			delete(n.Annotations, k)
		} else {
			n.Annotations[k] = *v
		}
	}
	return n
}

func TestComputeNodeChangeAddsAndUndoesOnlyItsOwn(t *testing.T) {
	ts := testTaintSet(t)
	deadline := t0.Add(2 * time.Minute)
	other := v1.Taint{Key: "dedicated", Value: "gpu", Effect: v1.TaintEffectNoSchedule}
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "7",
			Labels:      map[string]string{"team": "a"},
			Annotations: map[string]string{"keep": "me"}},
		Spec: v1.NodeSpec{Taints: []v1.Taint{other}},
	}
	d := NodeDesire{Intent: interrupting(deadline), Taints: ts, WriteDeadline: true, AddedAt: fixedAddedAt(t0)}
	ch := ComputeNodeChange(node, d)
	if ch.Empty() {
		t.Fatal("an interruption must change the node")
	}
	tainted := apply(node, ch)
	if len(tainted.Spec.Taints) != 2 || tainted.Spec.Taints[0] != other {
		t.Fatalf("taints = %+v, want the other writer's taint kept first plus reprieve's", tainted.Spec.Taints)
	}
	got := tainted.Spec.Taints[1]
	if got.Key != "cloud" || got.Value != "spot" || got.Effect != v1.TaintEffectNoExecute || got.TimeAdded == nil || !got.TimeAdded.Time.Equal(t0) {
		t.Fatalf("interruption taint = %+v, want cloud=spot:NoExecute with timeAdded %v", got, t0)
	}
	if tainted.Labels[LabelExcludeFromLB] != "true" || tainted.Labels["team"] != "a" {
		t.Errorf("labels = %v", tainted.Labels)
	}
	if tainted.Annotations[AnnotationReclaimDeadline] != "2026-11-29T12:02:00Z" || tainted.Annotations["keep"] != "me" {
		t.Errorf("annotations = %v", tainted.Annotations)
	}

	// Idempotent: the same desire on the written node changes nothing, even at a later time.
	d.AddedAt = fixedAddedAt(t0.Add(time.Hour))
	if ch := ComputeNodeChange(tainted, d); !ch.Empty() {
		t.Fatalf("second pass should be empty, got %+v", ch)
	}

	// Undo: the notice goes away; everything reprieve added goes, nothing else does.
	d.Intent = plan.Intent{}
	undone := apply(tainted, ComputeNodeChange(tainted, d))
	if len(undone.Spec.Taints) != 1 || undone.Spec.Taints[0] != other {
		t.Errorf("taints after undo = %+v, want only the other writer's", undone.Spec.Taints)
	}
	if _, ok := undone.Labels[LabelExcludeFromLB]; ok || undone.Labels["team"] != "a" {
		t.Errorf("labels after undo = %v", undone.Labels)
	}
	for _, k := range []string{AnnotationReclaimDeadline, AnnotationOwned} {
		if _, ok := undone.Annotations[k]; ok {
			t.Errorf("annotation %s left after undo: %v", k, undone.Annotations)
		}
	}
	if undone.Annotations["keep"] != "me" {
		t.Errorf("other annotation lost: %v", undone.Annotations)
	}
}

func TestComputeNodeChangeDoesNotClaimWhatWasThere(t *testing.T) {
	ts := testTaintSet(t)
	before := metav1.NewTime(t0.Add(-time.Hour))
	preexisting := v1.Taint{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute, TimeAdded: &before}
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{LabelExcludeFromLB: "yes"}},
		Spec:       v1.NodeSpec{Taints: []v1.Taint{preexisting}},
	}
	d := NodeDesire{Intent: interrupting(t0.Add(time.Minute)), Taints: ts, WriteDeadline: true, AddedAt: fixedAddedAt(t0)}
	ch := ComputeNodeChange(node, d)
	if ch.TaintsChanged {
		t.Errorf("an interruption taint already present (with its own timeAdded) must be left as is: %+v", ch.Taints)
	}
	if _, ok := ch.Labels[LabelExcludeFromLB]; ok {
		t.Error("a label already present must not be rewritten")
	}
	n := apply(node, ch)
	var own owned
	if err := json.Unmarshal([]byte(n.Annotations[AnnotationOwned]), &own); err != nil {
		t.Fatalf("ownership record: %v", err)
	}
	if len(own.Taints) != 0 || len(own.Labels) != 0 {
		t.Errorf("claimed what another writer put there: %+v", own)
	}
	// Undo leaves the other writer's taint and label.
	d.Intent = plan.Intent{}
	undone := apply(n, ComputeNodeChange(n, d))
	if len(undone.Spec.Taints) != 1 || undone.Labels[LabelExcludeFromLB] != "yes" {
		t.Errorf("undo removed another writer's work: taints %+v labels %v", undone.Spec.Taints, undone.Labels)
	}
}

func TestComputeNodeChangeProviderNoneLeavesAnnotation(t *testing.T) {
	ts := testTaintSet(t)
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{AnnotationReclaimDeadline: "2026-11-29T12:01:00Z"}}}
	d := NodeDesire{Intent: interrupting(t0.Add(time.Minute)), Taints: ts, WriteDeadline: false, AddedAt: fixedAddedAt(t0)}
	n := apply(node, ComputeNodeChange(node, d))
	d.Intent = plan.Intent{}
	// The operator removes the annotation; reprieve removes its taint and label only.
	delete(n.Annotations, AnnotationReclaimDeadline)
	undone := apply(n, ComputeNodeChange(n, d))
	if len(undone.Spec.Taints) != 0 || len(undone.Labels) != 0 || len(undone.Annotations) != 0 {
		t.Errorf("after undo: taints %+v labels %v annotations %v", undone.Spec.Taints, undone.Labels, undone.Annotations)
	}
}

func TestComputeNodeChangeSoftTaints(t *testing.T) {
	ts := testTaintSet(t)
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	d := NodeDesire{Intent: plan.Intent{SoftTaints: []v1.Taint{ts.Rebalance}}, Taints: ts, WriteDeadline: true, AddedAt: fixedAddedAt(t0)}
	n := apply(node, ComputeNodeChange(node, d))
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "reprieve.io/rebalance-recommended" || n.Spec.Taints[0].Effect != v1.TaintEffectPreferNoSchedule {
		t.Fatalf("taints = %+v", n.Spec.Taints)
	}
	if _, ok := n.Labels[LabelExcludeFromLB]; ok {
		t.Error("a rebalance recommendation must not take the node out of load balancers")
	}
	if _, ok := n.Annotations[AnnotationReclaimDeadline]; ok {
		t.Error("a rebalance recommendation has no deadline")
	}
}

func TestMergePatchCarriesResourceVersionAndWholeTaintList(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "42"}}
	b, err := mergePatch(node, NodeChange{TaintsChanged: true, Labels: map[string]*string{"a": nil}})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	meta := got["metadata"].(map[string]any)
	if meta["resourceVersion"] != "42" {
		t.Errorf("resourceVersion precondition missing: %s", b)
	}
	if l := meta["labels"].(map[string]any); l["a"] != nil {
		t.Errorf("label deletion must be null: %s", b)
	}
	taints, ok := got["spec"].(map[string]any)["taints"].([]any)
	if !ok || len(taints) != 0 {
		t.Errorf("an emptied taint list must be sent as [] (atomic list): %s", b)
	}
}

// TestComputeNodeChangeSwitchOfModeKeepsTimeAdded: an agent started with the other
// --interruption-eviction mid-window replaces reprieve's own interruption taint by the one of
// its mode's effect (NoExecute for NoSchedule, and back), in one write: one taint on the node,
// with the countdown's timeAdded, not the moment of the switch. A foreign taint of the same key
// is neither removed nor its time taken.
func TestComputeNodeChangeSwitchOfModeKeepsTimeAdded(t *testing.T) {
	kcm := testTaintSet(t)
	rp := kcm
	rp.Interruption.Effect = v1.TaintEffectNoSchedule
	deadline := t0.Add(2 * time.Minute)
	for _, step := range []struct {
		name     string
		from, to plan.TaintSet
	}{{"kube-controller-manager to reprieve", kcm, rp}, {"reprieve to kube-controller-manager", rp, kcm}} {
		t.Run(step.name, func(t *testing.T) {
			node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
			node = apply(node, ComputeNodeChange(node, NodeDesire{Intent: interrupting(deadline), Taints: step.from, AddedAt: fixedAddedAt(t0)}))
			// The next agent, 40 s later, of the other mode.
			ch := ComputeNodeChange(node, NodeDesire{Intent: interrupting(deadline), Taints: step.to, AddedAt: fixedAddedAt(t0.Add(40 * time.Second))})
			node = apply(node, ch)
			if len(node.Spec.Taints) != 1 {
				t.Fatalf("taints after the switch: %+v; want one", node.Spec.Taints)
			}
			got := node.Spec.Taints[0]
			if got.Effect != step.to.Interruption.Effect || got.TimeAdded == nil || !got.TimeAdded.Time.Equal(t0) {
				t.Errorf("taint after the switch %+v; want effect %s with timeAdded %v", got, step.to.Interruption.Effect, t0)
			}
			if len(ch.Removed) != 1 || len(ch.Added) != 1 {
				t.Errorf("removed %+v, added %+v; want one each", ch.Removed, ch.Added)
			}
			if !Owns(node, step.to.Interruption) || Owns(node, step.from.Interruption) {
				t.Errorf("owned %q; want only the new effect's", node.Annotations[AnnotationOwned])
			}
		})
	}
	// A foreign cloud=spot:NoExecute (kubectl's, not in the ownership record) stays beside the
	// reprieve mode's own taint, which counts from its own stamp.
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: v1.NodeSpec{Taints: []v1.Taint{
		{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute, TimeAdded: &metav1.Time{Time: t0.Add(-time.Hour)}}}}}
	ch := ComputeNodeChange(node, NodeDesire{Intent: interrupting(deadline), Taints: rp, AddedAt: fixedAddedAt(t0)})
	if len(ch.Taints) != 2 || len(ch.Removed) != 0 || len(ch.Added) != 1 || !ch.Added[0].TimeAdded.Time.Equal(t0) {
		t.Errorf("foreign taint: taints %+v, removed %+v, added %+v; want the foreign one kept and ours stamped %v", ch.Taints, ch.Removed, ch.Added, t0)
	}
}
