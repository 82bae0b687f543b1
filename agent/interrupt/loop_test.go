package interrupt

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	k8srecord "k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/evict"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	"github.com/reprieve-dev/reprieve/agent/metrics"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/providers/providertest"
)

// loopFixture is an interruption loop with its writer and executor on a fake clientset and a
// fake clock, with no pods; the writer and the executor do not run.
type loopFixture struct {
	l    *Loop
	w    *record.Writer
	exec *evict.Executor
	cs   *fake.Clientset
	clk  *clocktesting.FakeClock
	prov *providertest.Fake
}

func newLoopFixture(t *testing.T, wo record.WriterOptions, pressure ...v1.Taint) *loopFixture {
	t.Helper()
	taints := plan.TaintSet{Interruption: v1.Taint{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute}}
	return newLoopFixtureOn(t, wo, taints, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, pressure...)
}

// newLoopFixtureOn is newLoopFixture with the given taints (the mode of --interruption-eviction)
// on node as it is found.
func newLoopFixtureOn(t *testing.T, wo record.WriterOptions, taints plan.TaintSet, node *v1.Node, pressure ...v1.Taint) *loopFixture {
	t.Helper()
	f := &loopFixture{cs: fake.NewClientset(node), clk: clocktesting.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)),
		prov: providertest.New("aws")}
	client := kubetest.Wrap(f.cs)
	m, err := metrics.New(prometheus.NewRegistry(), "aws")
	if err != nil {
		t.Fatal(err)
	}
	events := k8srecord.NewFakeRecorder(100)
	wo.Client, wo.NodeName, wo.Taints, wo.Clock = client, "n1", taints, f.clk
	f.w = record.NewWriter(wo)
	f.exec = evict.New(evict.Options{Client: client, Pods: corelisters.NewPodLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})),
		Clock: f.clk, Metrics: m, Recorder: events, NodeName: "n1"})
	f.l = New(Options{NodeName: "n1", Provider: f.prov, Clock: f.clk, Metrics: m, Recorder: events, Taints: taints,
		PressureTaints: pressure, PollInterval: time.Second, MaintenanceLead: 10 * time.Minute, Node: func() *v1.Node { return node }, Writer: f.w, Executor: f.exec})
	return f
}

// TestPressureWishReplans (issue 38): when the pressure loop's wish changes, the interruption
// loop re-plans the pods on the node as it is about to be, a NoExecute pressure taint included,
// before the taint is written and with no wiring beyond the writer both loops share. The clock
// never moves: neither the poll nor the loop's tick is what re-plans.
func TestPressureWishReplans(t *testing.T) {
	pressure := v1.Taint{Key: "reprieve.io/memory-pressure", Value: "true", Effect: v1.TaintEffectNoExecute}
	f := newLoopFixture(t, record.WriterOptions{}, pressure)
	l, w, exec, cs, clk := f.l, f.w, f.exec, f.cs, f.clk
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	defer func() { cancel(); <-done }()
	l.Reconcile(ctx)
	if v := exec.View(); len(v.Taints) != 0 {
		t.Fatalf("view before any pressure = %+v; want no NoExecute taint", v)
	}
	go func() { defer close(done); l.Run(ctx) }()

	w.SetPressure([]v1.Taint{pressure})
	// The loop runs on its own goroutine: wait for its re-plan, yielding, with a bound in
	// real time only to fail rather than hang.
	limit := time.Now().Add(10 * time.Second)
	for !hasTaint(exec.View().Taints, pressure) {
		if time.Now().After(limit) {
			t.Fatalf("the pods were not re-planned on the pressure taint: view %+v", exec.View())
		}
		runtime.Gosched()
	}
	got := exec.View().Taints
	if at := got[0].TimeAdded; at == nil || !at.Time.Equal(clk.Now().Truncate(time.Second)) {
		t.Errorf("pressure taint planned with timeAdded %v; want %v (stamped when wanted)", at, clk.Now())
	}
	if n, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil || len(n.Spec.Taints) != 0 {
		t.Errorf("node %v (%v); want it untouched: the writer is not running, the plan is made on its wish", n, err)
	}
}

func hasTaint(taints []v1.Taint, t v1.Taint) bool {
	for _, x := range taints {
		if x.MatchTaint(&t) && x.Value == t.Value {
			return true
		}
	}
	return false
}

// TestReconcileHandsTheWriterDrained (issue 38): the interruption loop reads the executor's
// drained state at each reconcile and hands it to the writer in its wish; with no pod to evict
// the node is drained at the notice, in the same reconcile.
func TestReconcileHandsTheWriterDrained(t *testing.T) {
	f := newLoopFixture(t, record.WriterOptions{NodeConditions: true, LifecycleConditions: true})
	ctx := context.Background()
	f.l.Reconcile(ctx)
	if f.w.Desire().Drained {
		t.Error("drained with no interruption")
	}
	f.prov.Set(providers.Notice{Provider: "aws", Kind: providers.KindSpotInterruption, ID: "spot-1", Deadline: f.clk.Now().Add(2 * time.Minute)})
	f.l.PollOnce(ctx)
	f.l.Reconcile(ctx)
	if d := f.w.Desire(); !d.Intent.Interrupting() || !d.Drained {
		t.Errorf("after the notice's reconcile: interrupting %v, drained %v; want both (no pod to evict)", d.Intent.Interrupting(), d.Drained)
	}
	f.prov.Set()
	f.l.PollOnce(ctx)
	f.l.Reconcile(ctx)
	if f.w.Desire().Drained {
		t.Error("drained after the notice was withdrawn")
	}
}

// TestReprieveEvictionPlansTheNoScheduleTaint: with --interruption-eviction=reprieve the
// writer wants the interruption taint NoSchedule, and the executor's view counts from it read
// as NoExecute, stamped when the notice was first wanted (the fake clock's now), so that every
// pod is planned on upstream's NoExecute schedule.
func TestReprieveEvictionPlansTheNoScheduleTaint(t *testing.T) {
	rp := plan.TaintSet{Interruption: v1.Taint{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoSchedule}}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	f := newLoopFixtureOn(t, record.WriterOptions{}, rp, node)
	ctx := context.Background()
	f.clk.Step(700 * time.Millisecond)
	f.prov.Set(providers.Notice{Provider: "aws", Kind: providers.KindSpotInterruption, ID: "spot-1", Deadline: f.clk.Now().Add(2 * time.Minute)})
	f.l.PollOnce(ctx)
	f.l.Reconcile(ctx)
	written := record.ComputeNodeChange(node, f.w.Desire()).Taints
	if len(written) != 1 || written[0].Effect != v1.TaintEffectNoSchedule || written[0].Key != "cloud" {
		t.Fatalf("taints to write %+v; want cloud=spot:NoSchedule alone", written)
	}
	v := f.exec.View()
	stamp := f.clk.Now().Truncate(time.Second)
	if len(v.Taints) != 1 || v.Taints[0].Effect != v1.TaintEffectNoExecute || v.Taints[0].TimeAdded == nil || !v.Taints[0].TimeAdded.Time.Equal(stamp) {
		t.Errorf("the plan's taints %+v; want cloud=spot read as NoExecute from %v", v.Taints, stamp)
	}
	if v.Window.Taint.Effect != v1.TaintEffectNoExecute || !v.Window.HasDeadline() {
		t.Errorf("the plan's window %+v; want the deadline and the interruption taint as NoExecute", v.Window)
	}
	// An hour later (the notice withdrawn), the NoSchedule taint still on the node until the
	// writer runs is no countdown.
	f.clk.Step(time.Hour)
	f.prov.Set()
	f.l.PollOnce(ctx)
	f.l.Reconcile(ctx)
	if v := f.exec.View(); len(v.Taints) != 0 {
		t.Errorf("after the notice: the plan counts from %+v; want nothing", v.Taints)
	}
}

// TestRestoreAcrossASwitchOfMode: an agent of the default mode wrote cloud=spot:NoExecute and the
// deadline annotation, and left no readable record; the next agent runs with
// --interruption-eviction=reprieve. It restores the notice from the other effect's taint, keeps
// its timeAdded as the countdown's start, and wants one taint, NoSchedule, with that timeAdded.
func TestRestoreAcrossASwitchOfMode(t *testing.T) {
	rp := plan.TaintSet{Interruption: v1.Taint{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoSchedule}}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	started := now.Add(-40 * time.Second)
	deadline := now.Add(80 * time.Second)
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{
			record.AnnotationReclaimDeadline: deadline.Format(time.RFC3339),
			record.AnnotationOwned:           `{"taints":["cloud:NoExecute"],"annotations":["reprieve.io/reclaim-deadline"]}`,
		}},
		Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute, TimeAdded: &metav1.Time{Time: started}}}},
	}
	f := newLoopFixtureOn(t, record.WriterOptions{}, rp, node)
	// The provider has not answered yet: what the node holds stands.
	f.l.Reconcile(context.Background())
	d := f.w.Desire()
	if !d.Intent.Interrupting() || !d.Intent.Deadline.Equal(deadline) {
		t.Fatalf("restored intent %+v; want the deadline %v from the node", d.Intent, deadline)
	}
	if n := d.Intent.Interruption; n == nil || !n.NoticeTime.Equal(started) {
		t.Errorf("restored notice %+v; want its notice time %v, the other effect's timeAdded", n, started)
	}
	ch := record.ComputeNodeChange(node, d)
	if len(ch.Taints) != 1 || ch.Taints[0].Effect != v1.TaintEffectNoSchedule || !ch.Taints[0].TimeAdded.Time.Equal(started) {
		t.Errorf("taints to write %+v; want one, cloud=spot:NoSchedule with timeAdded %v", ch.Taints, started)
	}
	v := f.exec.View()
	if len(v.Taints) != 1 || v.Taints[0].Effect != v1.TaintEffectNoExecute || !v.Taints[0].TimeAdded.Time.Equal(started) {
		t.Errorf("the plan's taints %+v; want cloud=spot as NoExecute from %v", v.Taints, started)
	}
}

// slowRecorder is an event recorder whose Eventf takes step of the fake clock: the notice's
// announcement, between the reconcile's reading of the clock and its wish to the writer.
type slowRecorder struct {
	k8srecord.EventRecorder
	clk  *clocktesting.FakeClock
	step time.Duration
}

func (r slowRecorder) Eventf(obj kruntime.Object, eventtype, reason, messageFmt string, args ...any) {
	r.clk.Step(r.step)
	r.EventRecorder.Eventf(obj, eventtype, reason, messageFmt, args...)
}

// TestOwnTaintCountsFromTheTimeAddedItWrites: the reconcile reads the clock at 12:00:00.7, its
// announcement of the notice takes it to 12:00:01.1, and the writer stamps the interruption
// taint 12:00:01, the timeAdded the node will carry. Upstream's taint-eviction controller counts
// every toleration from that timeAdded, so must the plan, in either mode; counting from
// 12:00:00 evicted a pod tolerating 10 s a second early (a loaded e2e run, 2026-12-06).
func TestOwnTaintCountsFromTheTimeAddedItWrites(t *testing.T) {
	for _, effect := range []v1.TaintEffect{v1.TaintEffectNoExecute, v1.TaintEffectNoSchedule} {
		t.Run(string(effect), func(t *testing.T) {
			ts := plan.TaintSet{Interruption: v1.Taint{Key: "cloud", Value: "spot", Effect: effect}}
			node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
			f := newLoopFixtureOn(t, record.WriterOptions{}, ts, node)
			f.l.o.Recorder = slowRecorder{EventRecorder: f.l.o.Recorder, clk: f.clk, step: 400 * time.Millisecond}
			ctx := context.Background()
			f.clk.Step(700 * time.Millisecond)
			f.prov.Set(providers.Notice{Provider: "aws", Kind: providers.KindSpotInterruption, ID: "spot-1", Deadline: f.clk.Now().Add(2 * time.Minute)})
			f.l.PollOnce(ctx)
			f.l.Reconcile(ctx)
			written := record.ComputeNodeChange(node, f.w.Desire()).Taints
			if len(written) != 1 || written[0].TimeAdded == nil {
				t.Fatalf("taints to write %+v; want cloud=spot alone, with timeAdded", written)
			}
			stamp := written[0].TimeAdded.Time
			if want := time.Date(2026, 11, 29, 12, 0, 1, 0, time.UTC); !stamp.Equal(want) {
				t.Fatalf("the writer stamped %v; want %v (the test's premise: the announcement crossed a second)", stamp, want)
			}
			v := f.exec.View()
			if len(v.Taints) != 1 || v.Taints[0].TimeAdded == nil || !v.Taints[0].TimeAdded.Time.Equal(stamp) {
				t.Errorf("the plan counts from %+v; want cloud=spot from %v, the timeAdded written", v.Taints, stamp)
			}
		})
	}
}
