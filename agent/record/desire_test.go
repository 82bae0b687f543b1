package record

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestDesireIsARead (issue 38): Desire looks like a read and is one. Called twice across a clock
// step before any wish is set, it gives the same desire and stamps nothing: a taint wanted later
// is stamped when it is wanted, not when someone last looked.
func TestDesireIsARead(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	w := NewWriter(WriterOptions{NodeName: "n1", Taints: testTaintSet(t), Clock: clk})
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	pressure := v1.Taint{Key: "reprieve.io/memory-pressure", Value: "true", Effect: v1.TaintEffectNoSchedule}

	d1 := w.Desire()
	ch1 := ComputeNodeChange(node, d1)
	// Ask for the timeAdded of every taint the writer may ever add, as a caller of
	// ComputeNodeChange would.
	for _, id := range []string{TaintID(testTaintSet(t).Interruption), TaintID(pressure)} {
		d1.AddedAt(id)
	}
	clk.Step(3 * time.Second)
	d2 := w.Desire()
	ch2 := ComputeNodeChange(node, d2)
	for _, id := range []string{TaintID(testTaintSet(t).Interruption), TaintID(pressure)} {
		d2.AddedAt(id)
	}
	if !ch1.Empty() || !ch2.Empty() {
		t.Errorf("changes %+v and %+v before any wish; want none", ch1, ch2)
	}
	if d1.Intent.Interrupting() != d2.Intent.Interrupting() || len(d1.Intent.SoftTaints)+len(d2.Intent.SoftTaints) != 0 ||
		d1.WriteDeadline != d2.WriteDeadline || d1.Record != d2.Record || d1.Drained != d2.Drained {
		t.Errorf("two reads gave %+v and %+v; want the same", d1, d2)
	}
	w.mu.Lock()
	stamped := len(w.addedAt)
	w.mu.Unlock()
	if stamped != 0 {
		t.Errorf("%d taints stamped by reading the desire; want none", stamped)
	}

	// The taint wanted now is stamped now (whole seconds), not when Desire was first read.
	clk.Step(1500 * time.Millisecond)
	w.SetPressure([]v1.Taint{pressure})
	clk.Step(time.Minute)
	ch := ComputeNodeChange(node, w.Desire())
	if len(ch.Added) != 1 || ch.Added[0].TimeAdded == nil || !ch.Added[0].TimeAdded.Time.Equal(t0.Add(4*time.Second)) {
		t.Errorf("added %+v; want the pressure taint with timeAdded %v (when it was wanted)", ch.Added, t0.Add(4*time.Second))
	}
}
