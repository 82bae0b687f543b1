package record

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	k8srecord "k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	"github.com/reprieve-dev/reprieve/agent/metrics"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/providers"
)

var memoryPressure = v1.Taint{Key: "reprieve.io/memory-pressure", Value: "true", Effect: v1.TaintEffectNoSchedule}

// writerFixture is a writer on a fake clientset (client-go's object tracker applies the merge
// patch as the API server does for these fields) and a fake clock, with its own recorder and
// metrics: no interruption loop.
type writerFixture struct {
	w       *Writer
	client  *fake.Clientset
	clock   *clocktesting.FakeClock
	events  *k8srecord.FakeRecorder
	metrics *metrics.Metrics
}

func newWriterFixture(t *testing.T, mutate func(*WriterOptions)) *writerFixture {
	t.Helper()
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	m, err := metrics.New(prometheus.NewRegistry(), "aws")
	if err != nil {
		t.Fatal(err)
	}
	f := &writerFixture{client: client, clock: clocktesting.NewFakeClock(t0), events: k8srecord.NewFakeRecorder(100), metrics: m}
	o := WriterOptions{Client: kubetest.Wrap(client), NodeName: "n1", Taints: testTaintSet(t), Clock: f.clock,
		Recorder: f.events, Metrics: m}
	if mutate != nil {
		mutate(&o)
	}
	f.w = NewWriter(o)
	return f
}

func (f *writerFixture) sync(t *testing.T) {
	t.Helper()
	if err := f.w.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (f *writerFixture) node(t *testing.T) *v1.Node {
	t.Helper()
	n, err := f.client.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// drainEvents returns the events recorded since the last call, as "Type Reason message".
func (f *writerFixture) drainEvents() []string {
	var out []string
	for {
		select {
		case e := <-f.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestWriterAnnouncesPressureTaint (issue 38): the writer says itself what its writes did; a
// pressure taint's TaintApplied and TaintRemoved come from the writer with no interruption loop
// anywhere, and a dry run says what it would have done, once.
func TestWriterAnnouncesPressureTaint(t *testing.T) {
	f := newWriterFixture(t, nil)
	f.w.SetPressure([]v1.Taint{memoryPressure})
	f.sync(t)
	if got, want := f.drainEvents(), []string{"Normal TaintApplied added taint reprieve.io/memory-pressure=true:NoSchedule"}; !slices.Equal(got, want) {
		t.Errorf("events after the pressure taint's write = %q; want %q", got, want)
	}
	f.sync(t) // nothing to change: nothing to say
	if got := f.drainEvents(); len(got) != 0 {
		t.Errorf("events after a write that changed nothing = %q; want none", got)
	}
	f.w.SetPressure(nil)
	f.sync(t)
	if got, want := f.drainEvents(), []string{"Normal TaintRemoved removed taint reprieve.io/memory-pressure=true:NoSchedule"}; !slices.Equal(got, want) {
		t.Errorf("events after the pressure taint's removal = %q; want %q", got, want)
	}
	if c := histogramCount(t, f.metrics.NoticeToTaint); c != 0 {
		t.Errorf("notice-to-taint observed %d times for a pressure taint; want only the interruption taint's", c)
	}

	dry := newWriterFixture(t, func(o *WriterOptions) { o.DryRun = true })
	dry.w.SetPressure([]v1.Taint{memoryPressure})
	dry.sync(t)
	dry.sync(t)
	if got, want := dry.drainEvents(), []string{"Normal TaintApplied Dry run: would have added taint reprieve.io/memory-pressure=true:NoSchedule"}; !slices.Equal(got, want) {
		t.Errorf("dry-run events = %q; want %q", got, want)
	}
	if n := dry.node(t); len(n.Spec.Taints) != 0 {
		t.Errorf("a dry run tainted the node: %v", n.Spec.Taints)
	}
}

// TestWriterObservesNoticeToTaint: the interruption taint's write observes how long it took from
// the notice, on the writer's clock, and says TaintApplied; the interruption loop is not asked.
func TestWriterObservesNoticeToTaint(t *testing.T) {
	f := newWriterFixture(t, nil)
	deadline := t0.Add(2 * time.Minute)
	n := &providers.Notice{Provider: "aws", Kind: providers.KindSpotInterruption, ID: "spot-1", Deadline: deadline, NoticeTime: t0}
	f.clock.Step(1500 * time.Millisecond)
	f.w.SetInterruption(Wish{Intent: plan.Intent{Deadline: deadline, Interruption: n}})
	f.sync(t)
	if got, want := f.drainEvents(), []string{"Normal TaintApplied added taint cloud=spot:NoExecute"}; !slices.Equal(got, want) {
		t.Errorf("events = %q; want %q", got, want)
	}
	if c, s := histogramCount(t, f.metrics.NoticeToTaint), histogramSum(t, f.metrics.NoticeToTaint); c != 1 || s != 1.5 {
		t.Errorf("notice-to-taint: %d observations summing %v s; want one of 1.5 s", c, s)
	}
	f.w.SetInterruption(Wish{})
	f.sync(t)
	if got, want := f.drainEvents(), []string{"Normal TaintRemoved removed taint cloud=spot:NoExecute"}; !slices.Equal(got, want) {
		t.Errorf("events after the withdrawal = %q; want %q", got, want)
	}
	if c := histogramCount(t, f.metrics.NoticeToTaint); c != 1 {
		t.Errorf("notice-to-taint observed %d times; want once (the removal is not a taint)", c)
	}
}

// TestSetReturnsTheStampedTaints (issue 38): the Set calls stamp timeAdded and return it. A taint
// keeps its stamp while it is wanted, whatever else changes; a taint no longer wanted is
// forgotten, and wanting it again stamps it afresh. The write carries the returned stamps.
func TestSetReturnsTheStampedTaints(t *testing.T) {
	f := newWriterFixture(t, nil)
	cpu := v1.Taint{Key: "reprieve.io/cpu-pressure", Value: "true", Effect: v1.TaintEffectNoExecute}
	at := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: t0.Add(d)} }
	stamped := func(tt v1.Taint, a *metav1.Time) v1.Taint { tt.TimeAdded = a; return tt }

	f.clock.Step(1500 * time.Millisecond)
	if got, want := f.w.SetPressure([]v1.Taint{memoryPressure}), []v1.Taint{stamped(memoryPressure, at(time.Second))}; !taintsEqual(got, want) {
		t.Errorf("SetPressure = %v; want %v (whole seconds)", got, want)
	}
	f.clock.Step(5 * time.Second)
	want := []v1.Taint{stamped(memoryPressure, at(time.Second)), stamped(cpu, at(6*time.Second))}
	if got := f.w.SetPressure([]v1.Taint{memoryPressure, cpu}); !taintsEqual(got, want) {
		t.Errorf("SetPressure = %v; want %v (the first keeps its stamp)", got, want)
	}
	ts := testTaintSet(t)
	f.clock.Step(time.Second)
	deadline := t0.Add(time.Hour)
	in := Wish{Intent: plan.Intent{Deadline: deadline, SoftTaints: []v1.Taint{ts.Rebalance},
		Interruption: &providers.Notice{Kind: providers.KindSpotInterruption, Deadline: deadline}}}
	if got, want := f.w.SetInterruption(in), []v1.Taint{stamped(ts.Interruption, at(7*time.Second)), stamped(ts.Rebalance, at(7*time.Second))}; !taintsEqual(got, want) {
		t.Errorf("SetInterruption = %v; want %v", got, want)
	}
	f.clock.Step(time.Minute)
	f.sync(t)
	written := f.node(t).Spec.Taints
	for _, w := range append(want, stamped(ts.Interruption, at(7*time.Second)), stamped(ts.Rebalance, at(7*time.Second))) {
		if !taintsContain(written, w) {
			t.Errorf("the node carries %v; want %v among them (the stamps returned)", written, w)
		}
	}

	// No longer wanted, then wanted again: a new taint.
	f.w.SetPressure([]v1.Taint{cpu})
	f.clock.Step(time.Second)
	if got := f.w.SetPressure([]v1.Taint{memoryPressure, cpu}); !taintsEqual(got, []v1.Taint{stamped(memoryPressure, at(68*time.Second)), stamped(cpu, at(6*time.Second))}) {
		t.Errorf("SetPressure after the taint went = %v; want memory-pressure stamped afresh at %v", got, t0.Add(68*time.Second))
	}
}

// TestSetPressureSignalsAChange: PressureChanged is signalled when the pressure wish changed
// (and only then), without blocking the pressure loop when nobody has read the last signal.
func TestSetPressureSignalsAChange(t *testing.T) {
	f := newWriterFixture(t, nil)
	signalled := func() bool {
		select {
		case <-f.w.PressureChanged():
			return true
		default:
			return false
		}
	}
	f.w.SetPressure([]v1.Taint{memoryPressure})
	f.w.SetPressure([]v1.Taint{memoryPressure, memoryPressure}) // changed again, unread: no block
	if !signalled() {
		t.Error("no signal after the pressure wish changed")
	}
	if signalled() {
		t.Error("two signals pending; one is enough")
	}
	f.w.SetPressure([]v1.Taint{memoryPressure, memoryPressure})
	if signalled() {
		t.Error("signalled though the pressure wish did not change")
	}
	f.w.SetInterruption(Wish{})
	if signalled() {
		t.Error("signalled for the interruption loop's own wish")
	}
	f.w.SetPressure(nil)
	if !signalled() {
		t.Error("no signal after the pressure taints went")
	}
}

// TestWriterCountsItsRefusals: the writer counts its refused patches itself (no callback); a
// timeout-like error counts nothing, a passing patch clears the run.
func TestWriterCountsItsRefusals(t *testing.T) {
	m, err := metrics.New(prometheus.NewRegistry(), "aws")
	if err != nil {
		t.Fatal(err)
	}
	refusals := NewRefusals(2, m)
	f := newWriterFixture(t, func(o *WriterOptions) { o.Refusals = refusals })
	refuse := true
	f.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse {
			// What the NodeRestriction admission plugin answers a token without the node claim.
			return true, nil, apierrors.NewForbidden(v1.Resource("nodes"), "n1", nil)
		}
		return false, nil, nil
	})
	f.w.SetPressure([]v1.Taint{memoryPressure})
	for range 2 {
		if err := f.w.Sync(context.Background()); err == nil {
			t.Fatal("a refused write succeeded")
		}
	}
	if why := refusals.NotReady(); !strings.Contains(why, "2 node writes refused in a row") {
		t.Errorf("NotReady = %q after two refused writes; want two in a row", why)
	}
	refuse = false
	f.sync(t)
	if why := refusals.NotReady(); why != "" {
		t.Errorf("NotReady = %q after a write passed; want ready", why)
	}
}

// TestWriterReadsTheLister: with the informer's lister the writer computes the change from its
// copy of the node: no GET before the patch.
func TestWriterReadsTheLister(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := indexer.Add(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "1"}}); err != nil {
		t.Fatal(err)
	}
	f := newWriterFixture(t, func(o *WriterOptions) { o.Nodes = corelisters.NewNodeLister(indexer) })
	f.client.ClearActions()
	f.w.SetPressure([]v1.Taint{memoryPressure})
	f.sync(t)
	var verbs []string
	for _, a := range f.client.Actions() {
		verbs = append(verbs, a.GetVerb())
	}
	if !slices.Equal(verbs, []string{"patch"}) {
		t.Errorf("API calls %q; want one patch (the node read from the lister)", verbs)
	}
}

// TestWishCarriesDrained: the Drained condition follows the drained state in the interruption
// loop's wish, only with lifecycle conditions and only while interrupting.
func TestWishCarriesDrained(t *testing.T) {
	deadline := t0.Add(time.Minute)
	spot := Wish{Intent: plan.Intent{Deadline: deadline, Interruption: &providers.Notice{Kind: providers.KindSpotInterruption, Deadline: deadline}}, Drained: true}
	for _, c := range []struct {
		name             string
		conds, lifecycle bool
		wish             Wish
		want             bool
	}{
		{"lifecycle, drained", true, true, spot, true},
		{"lifecycle, not drained", true, true, Wish{Intent: spot.Intent}, false},
		{"not interrupting", true, true, Wish{Drained: true}, false},
		{"no lifecycle conditions", true, false, spot, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newWriterFixture(t, func(o *WriterOptions) { o.NodeConditions, o.LifecycleConditions = c.conds, c.lifecycle })
			f.w.SetInterruption(c.wish)
			if got := f.w.Desire().Drained; got != c.want {
				t.Errorf("Desire().Drained = %v; want %v", got, c.want)
			}
		})
	}
}

func taintsEqual(a, b []v1.Taint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !taintsContain(a[i:i+1], b[i]) {
			return false
		}
	}
	return true
}

// taintsContain reports whether taints holds t with the same value and timeAdded.
func taintsContain(taints []v1.Taint, t v1.Taint) bool {
	for _, x := range taints {
		if x.MatchTaint(&t) && x.Value == t.Value && (x.TimeAdded == nil) == (t.TimeAdded == nil) &&
			(x.TimeAdded == nil || x.TimeAdded.Time.Equal(t.TimeAdded.Time)) {
			return true
		}
	}
	return false
}

func histogram(t *testing.T, h prometheus.Histogram) *dto.Histogram {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram()
}

func histogramCount(t *testing.T, h prometheus.Histogram) uint64 {
	return histogram(t, h).GetSampleCount()
}
func histogramSum(t *testing.T, h prometheus.Histogram) float64 {
	return histogram(t, h).GetSampleSum()
}
