package guard

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/record"
)

// reckonBed is an index with a reckoner whose node reads come from the pods the test says are
// on the API server (server), which may differ from what the index's watch has delivered.
type reckonBed struct {
	t       *testing.T
	clock   *testingclock.FakeClock
	index   *PodIndex
	rec     *Reckoner
	metrics *ReckonMetrics
	server  map[string][]v1.Pod
	listErr error
	lists   int
}

func newReckonBed(t *testing.T, start time.Time) *reckonBed {
	b := &reckonBed{t: t, clock: testingclock.NewFakeClock(start), index: NewPodIndex(nil), server: map[string][]v1.Pod{}}
	m, err := NewReckonMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	b.metrics = m
	b.rec = NewReckoner(func(_ context.Context, node string) ([]v1.Pod, error) {
		b.lists++
		if b.listErr != nil {
			return nil, b.listErr
		}
		return b.server[node], nil
	}, m, b.clock)
	b.index.Reckon(b.rec)
	return b
}

// marked is a pod as the agent's pod notice leaves it: evict-at and the node's deadline.
func marked(name, node string, evictAt, deadline time.Time) *v1.Pod {
	p := indexPod("team", name, "u-"+name, node)
	p.Annotations = map[string]string{record.AnnotationEvictAt: evictAt.UTC().Format(time.RFC3339),
		record.AnnotationReclaimDeadline: deadline.UTC().Format(time.RFC3339)}
	return p
}

// step moves the clock by d and reckons, as Run does each second.
func (b *reckonBed) step(d time.Duration) {
	b.clock.Step(d)
	b.rec.Reckon(context.Background())
}

func (b *reckonBed) want(what string, clear, outlivedReclaims, unknown, pods float64) {
	b.t.Helper()
	got := [4]float64{testutil.ToFloat64(b.metrics.Reclaims.WithLabelValues(ReckonClear)),
		testutil.ToFloat64(b.metrics.Reclaims.WithLabelValues(ReckonOutlived)),
		testutil.ToFloat64(b.metrics.Reclaims.WithLabelValues(ReckonUnknown)), testutil.ToFloat64(b.metrics.Outlived)}
	if got != [4]float64{clear, outlivedReclaims, unknown, pods} {
		b.t.Errorf("%s: reclaims clear/pods_outlived/unknown and pods outlived = %v; want %v", what, got, [4]float64{clear, outlivedReclaims, unknown, pods})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestReckonerCountsThePodsThatOutliveTheReclaim: a node's planned pods, one gone in time and
// one still there at the deadline; the pods reprieve does not plan (no evict-at) are not counted
// whether or not they stay; each pod once.
func TestReckonerCountsThePodsThatOutliveTheReclaim(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	d := t0.Add(2 * time.Minute)
	b := newReckonBed(t, t0)
	gone := marked("gone", "node-a", t0.Add(time.Minute), d)
	stuck := marked("stuck", "node-a", t0.Add(time.Minute), d) // a finalizer holds it, say
	forever := indexPod("team", "forever", "u-forever", "node-a")
	forever.Annotations = map[string]string{record.AnnotationReclaimDeadline: d.Format(time.RFC3339)} // tolerates forever: no evict-at
	daemon := indexPod("team", "daemon", "u-daemon", "node-a")                                        // not planned: no mark at all
	other := indexPod("team", "web", "u-web", "node-b")                                               // another node, no interruption
	for _, p := range []*v1.Pod{gone, stuck, forever, daemon, other} {
		must(t, b.index.Add(p))
	}
	b.server["node-a"] = []v1.Pod{*stuck, *forever, *daemon}
	must(t, b.index.Delete(gone))

	b.step(2*time.Minute + DefaultReckonSettle - time.Second)
	b.want("a second before the deadline settles", 0, 0, 0, 0)
	if b.lists != 0 {
		t.Errorf("the node's pods were read %d times before the deadline settled; want 0", b.lists)
	}
	b.step(time.Second)
	b.want("once the deadline settled", 0, 1, 0, 1)
	if b.lists != 1 {
		t.Errorf("the node's pods were read %d times; want once", b.lists)
	}
	// The node's orphaned pod is updated after the reclaim (podgc marks it): counted once only.
	must(t, b.index.Update(stuck))
	b.step(time.Minute)
	b.want("a minute later, after an update of the pod", 0, 1, 0, 1)
	must(t, b.index.Replace([]any{stuck, forever, daemon, other}, "2"))
	b.step(time.Second)
	b.want("after a relist", 0, 1, 0, 1)
}

// TestReckonerClearWhenAllGone: the index's watch missed a delete (it still holds the pod), and
// the node's pods read at the deadline show it gone: clear, not outlived.
func TestReckonerClearWhenAllGone(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	d := t0.Add(30 * time.Second)
	b := newReckonBed(t, t0)
	must(t, b.index.Add(marked("a", "node-a", t0, d)))
	done := marked("job", "node-a", t0, d)
	must(t, b.index.Add(done))
	done.Status.Phase = v1.PodSucceeded
	b.server["node-a"] = []v1.Pod{*done} // a finished pod stays as an object, its work done
	b.step(30*time.Second + DefaultReckonSettle)
	b.want("all gone or finished", 1, 0, 0, 0)
}

// TestReckonerClearWithoutARead: every marked pod deleted before the deadline, as the agent
// ends them: the reclaim is clear, and the node's pods need no read.
func TestReckonerClearWithoutARead(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	d := t0.Add(30 * time.Second)
	b := newReckonBed(t, t0)
	a, c := marked("a", "node-a", t0, d), marked("c", "node-a", t0, d)
	must(t, b.index.Add(a))
	must(t, b.index.Add(c))
	must(t, b.index.Delete(a))
	b.step(10 * time.Second)
	// A relist that no longer holds c: deleted while the watch was down.
	must(t, b.index.Replace([]any{indexPod("team", "web", "u-web", "node-b")}, "5"))
	b.step(20*time.Second + DefaultReckonSettle)
	b.want("every marked pod deleted in time", 1, 0, 0, 0)
	if b.lists != 0 {
		t.Errorf("the node's pods were read %d times; want none", b.lists)
	}
	b.step(time.Minute)
	b.want("a minute later", 1, 0, 0, 0)
}

// TestReckonerWithdrawnAndMovedDeadlines: a notice withdrawn (the marks removed) reckons
// nothing; a deadline moved later reckons at the new one.
func TestReckonerWithdrawnAndMovedDeadlines(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	b := newReckonBed(t, t0)
	p := marked("a", "node-a", t0, t0.Add(time.Minute))
	must(t, b.index.Add(p))
	b.server["node-a"] = []v1.Pod{*p}
	must(t, b.index.Update(indexPod("team", "a", "u-a", "node-a"))) // withdrawn
	b.step(2 * time.Minute)
	b.want("withdrawn", 0, 0, 0, 0)

	q := marked("b", "node-a", t0, t0.Add(3*time.Minute))
	must(t, b.index.Add(q))
	must(t, b.index.Update(marked("b", "node-a", t0, t0.Add(4*time.Minute))))
	b.server["node-a"] = []v1.Pod{*q}
	b.step(time.Minute + DefaultReckonSettle) // the first deadline, settled
	b.want("at the first deadline, moved since", 0, 0, 0, 0)
	b.step(time.Minute)
	b.want("at the moved deadline", 0, 1, 0, 1)
}

// TestReckonerListErrors: a node whose pods cannot be read is retried, and counted unknown
// (never clear) once Stale has passed.
func TestReckonerListErrors(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	d := t0.Add(time.Minute)
	b := newReckonBed(t, t0)
	p := marked("a", "node-a", t0, d)
	must(t, b.index.Add(p))
	b.server["node-a"] = []v1.Pod{*p}
	b.listErr = errors.New("the server is currently unable to handle the request")
	b.step(time.Minute + DefaultReckonSettle)
	b.step(time.Second)
	b.want("while the reads fail", 0, 0, 0, 0)
	if b.lists != 2 {
		t.Errorf("%d reads; want 2 (one a second)", b.lists)
	}
	b.listErr = nil
	b.step(time.Second)
	b.want("the read answers", 0, 1, 0, 1)

	q := marked("b", "node-b", t0, d.Add(time.Minute))
	must(t, b.index.Add(q))
	b.listErr = errors.New("timeout")
	b.step(time.Minute)
	b.step(DefaultReckonStale)
	b.want("past Stale", 0, 1, 1, 1)
}

// TestReckonerLateSight: a mark first seen more than Stale after its deadline (the guard
// started late) is not counted; one seen within it is.
func TestReckonerLateSight(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	b := newReckonBed(t, t0)
	old := marked("old", "node-a", t0.Add(-5*time.Minute), t0.Add(-DefaultReckonStale-time.Second))
	recent := marked("recent", "node-b", t0.Add(-time.Minute), t0.Add(-time.Minute))
	b.server["node-a"], b.server["node-b"] = []v1.Pod{*old}, []v1.Pod{*recent}
	must(t, b.index.Replace([]any{old, recent}, "1"))
	b.step(time.Second)
	b.want("after a start", 0, 1, 0, 1)
}

// TestMarkOf: what counts as reprieve's mark.
func TestMarkOf(t *testing.T) {
	d := time.Date(2026, 12, 5, 12, 2, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		pod  func(*v1.Pod)
		ok   bool
	}{
		{"marked", func(*v1.Pod) {}, true},
		{"no evict-at", func(p *v1.Pod) { delete(p.Annotations, record.AnnotationEvictAt) }, false},
		{"no deadline", func(p *v1.Pod) { delete(p.Annotations, record.AnnotationReclaimDeadline) }, false},
		{"a deadline that does not parse", func(p *v1.Pod) { p.Annotations[record.AnnotationReclaimDeadline] = "soon" }, false},
		{"failed (finished: counts as gone)", func(p *v1.Pod) { p.Status.Phase = v1.PodFailed }, true},
		{"not bound", func(p *v1.Pod) { p.Spec.NodeName = "" }, false},
		{"terminating", func(p *v1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: d} }, true},
	} {
		p := marked("a", "node-a", d.Add(-time.Minute), d)
		c.pod(p)
		m, ok := markOf(p)
		if ok != c.ok || (ok && (!m.deadline.Equal(d) || m.node != "node-a" || m.name != "team/a" || m.finished != (p.Status.Phase == v1.PodFailed))) {
			t.Errorf("%s: markOf = %+v, %v; want ok %v", c.name, m, ok, c.ok)
		}
	}
}
