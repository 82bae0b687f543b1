package agent

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/reprieve-dev/reprieve/providers"
)

// Tests for issue 12: the deadline promise under adversity. Each one failed on the code before
// its fix.

// TestWindowSummaryWhileEvictionsComplete (item 9): the window summary runs on the node loop
// while eviction workers record the pods they acted on. Run with -race: before the fix the
// summary iterated the acted set after releasing the lock (a concurrent map read and write).
func TestWindowSummaryWhileEvictionsComplete(t *testing.T) {
	deadline := t0.Add(40 * time.Second)
	var objs []runtime.Object
	objs = append(objs, testNode())
	for i := range 20 {
		objs = append(objs, testPod(fmt.Sprintf("p%d", i), 5))
	}
	h := newHarness(t, nil, objs...)
	h.notice(deadline)
	for i := range 20 {
		h.a.markActed(fmt.Sprintf("ns/p%d", i))
	}
	h.clock.SetTime(deadline.Add(-5 * time.Second))
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			h.a.markActed(fmt.Sprintf("ns/late%d", i%1000))
		}
	}()
	h.a.summarizeWindow(h.ctx, h.clock.Now())
	h.a.maybeApprove(h.ctx)
	close(stop)
	<-done
	if !hasEvent(h.drainEvents(), "Warning InterruptionHandled") {
		t.Error("no summary at the window's end")
	}
}

// TestRestartDuringMetadataOutageKeepsTheInterruption (item 2): an agent restarted while the
// metadata service fails must not read the failure as "no notice": the taint keeps its
// timeAdded, the deadline annotation and the load-balancer label stay, and the restarted agent
// plans with the deadline it reads back from the annotation.
func TestRestartDuringMetadataOutageKeepsTheInterruption(t *testing.T) {
	deadline := t0.Add(40 * time.Second)
	first := newHarness(t, nil, testNode())
	first.notice(deadline)
	before := first.node()
	spot := before.Spec.Taints[0]

	// Five seconds later the agent restarts; the metadata service is down.
	node := before.DeepCopy()
	node.ResourceVersion = ""
	h := newHarness(t, nil, node, testPod("tol10", 5, spotToleration(secs(10))), testPod("forever", 5, spotToleration(nil)))
	h.clock.SetTime(t0.Add(5 * time.Second))
	h.a.provider = failing{}
	h.step()

	after := h.node()
	if len(after.Spec.Taints) != 1 || !after.Spec.Taints[0].TimeAdded.Equal(spot.TimeAdded) {
		t.Fatalf("taints after a restart during an outage = %+v, want %+v unchanged", after.Spec.Taints, spot)
	}
	if after.Annotations[AnnotationReclaimDeadline] != before.Annotations[AnnotationReclaimDeadline] || after.Labels[LabelExcludeFromLB] != "true" {
		t.Fatalf("annotations %v labels %v after the restart", after.Annotations, after.Labels)
	}
	if v := h.a.currentView(); !v.window.Deadline.Equal(deadline) {
		t.Fatalf("restarted agent plans with deadline %v, want %v from the annotation", v.window.Deadline, deadline)
	}
	if d := h.a.syncPod(h.ctx, "ns/tol10"); d != 5*time.Second {
		t.Errorf("tolerating 10s: requeue %v, want 5s (counting from the original timeAdded)", d)
	}

	// The service answers again with the same notice: nothing is rewritten.
	h.a.provider = h.prov
	h.prov.Set(providerNotice("spot-1", deadline))
	patches := len(h.actions("patch", "nodes", ""))
	h.clock.Step(time.Second)
	h.step()
	if got := len(h.actions("patch", "nodes", "")); got != patches {
		t.Errorf("the node was patched again when the service came back: %+v", h.node().Spec.Taints)
	}
	if ta := h.node().Spec.Taints[0].TimeAdded; !ta.Equal(spot.TimeAdded) {
		t.Errorf("timeAdded moved to %v", ta)
	}

	// Only a positive answer withdraws it.
	h.prov.Set()
	h.step()
	if n := h.node(); len(n.Spec.Taints) != 0 || n.Annotations[AnnotationReclaimDeadline] != "" {
		t.Errorf("the notice's withdrawal left %+v %v", n.Spec.Taints, n.Annotations)
	}
}

func providerNotice(id string, deadline time.Time) providers.Notice {
	return providers.Notice{Provider: "aws", Kind: providers.KindSpotInterruption, ID: id, Deadline: deadline, Action: "terminate"}
}

var _ = metav1.Now
var _ v1.Pod
