package evict

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	"github.com/reprieve-dev/reprieve/agent/metrics"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/providers"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

var spot = v1.Taint{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute}

// fixture is one executor on a fake clientset whose pods the test puts in the lister's store
// itself, as the informer would (or, to model its lag, does not).
type fixture struct {
	e      *Executor
	client *fake.Clientset
	store  cache.Indexer
	clock  *clocktesting.FakeClock
	events *record.FakeRecorder
	evict  func(context.Context, *policyv1.Eviction) error
	mu     sync.Mutex
	sent   []string
}

func newFixture(t *testing.T, pods ...*v1.Pod) *fixture {
	t.Helper()
	f := &fixture{client: fake.NewClientset(), clock: clocktesting.NewFakeClock(t0), events: record.NewFakeRecorder(1000),
		store: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})}
	for _, p := range pods {
		if err := f.store.Add(p); err != nil {
			t.Fatal(err)
		}
		if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	m, err := metrics.New(prometheus.NewRegistry(), "aws")
	if err != nil {
		t.Fatal(err)
	}
	f.e = New(Options{Client: kubetest.Wrap(f.client), Pods: corelisters.NewPodLister(f.store), Clock: f.clock, Metrics: m, Recorder: f.events,
		NodeName: "n1", SafetyMargin: 5 * time.Second, InterruptionTaint: spot,
		Evict: func(ctx context.Context, ev *policyv1.Eviction) error {
			f.mu.Lock()
			f.sent = append(f.sent, ev.Namespace+"/"+ev.Name)
			hook := f.evict
			f.mu.Unlock()
			if hook != nil {
				return hook(ctx, ev)
			}
			return nil
		}})
	return f
}

func (f *fixture) evictions() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sent)
}

func testPod(name string, grace int64) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)},
		Spec:   v1.PodSpec{NodeName: "n1", TerminationGracePeriodSeconds: &grace},
		Status: v1.PodStatus{Phase: v1.PodRunning}}
}

func view(deadline time.Time) View {
	t := spot
	t.TimeAdded = &metav1.Time{Time: t0}
	return View{Taints: []v1.Taint{t}, Window: plan.Window{Deadline: deadline, SafetyMargin: 5 * time.Second, Taint: spot},
		Notice: &providers.Notice{Provider: "aws", Kind: providers.KindSpotInterruption, ID: "spot-1", Deadline: deadline}}
}

// TestDeadlineMovesWhileEvictionInFlight (issue 20, case 10): a deadline that moves while a
// pod's eviction request is in flight starts a new drain; the accepted request must count in it,
// or the next sync (before the informer shows the pod's deletionTimestamp) evicts it again.
func TestDeadlineMovesWhileEvictionInFlight(t *testing.T) {
	f := newFixture(t, testPod("p", 5))
	f.e.SetView(view(t0.Add(60 * time.Second)))
	inFlight, release := make(chan struct{}), make(chan struct{})
	f.evict = func(context.Context, *policyv1.Eviction) error {
		close(inFlight)
		<-release
		return nil
	}
	done := make(chan struct{})
	go func() { defer close(done); f.e.SyncPod(context.Background(), "ns/p") }()
	<-inFlight
	f.mu.Lock()
	f.evict = nil
	f.mu.Unlock()
	// The deadline moves earlier while the request is held.
	f.e.SetView(view(t0.Add(50 * time.Second)))
	close(release)
	<-done
	f.e.SyncPod(context.Background(), "ns/p") // the informer has not seen the eviction yet
	if n := f.evictions(); n != 1 {
		t.Fatalf("evictions = %d after the deadline moved while the first was in flight, want 1", n)
	}
}

// TestWindowSummaryWhileEvictionsComplete: the window summary runs on the interruption loop
// while eviction workers record the pods they acted on. Run with -race: the summary must not
// iterate the acted set after releasing the lock (a concurrent map read and write).
func TestWindowSummaryWhileEvictionsComplete(t *testing.T) {
	deadline := t0.Add(40 * time.Second)
	var pods []*v1.Pod
	for i := range 20 {
		pods = append(pods, testPod(fmt.Sprintf("p%d", i), 5))
	}
	f := newFixture(t, pods...)
	f.e.SetView(view(deadline))
	for i := range 20 {
		f.e.markActed(fmt.Sprintf("ns/p%d", i))
	}
	f.clock.SetTime(deadline.Add(-5 * time.Second))
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			f.e.markActed(fmt.Sprintf("ns/late%d", i%1000))
		}
	}()
	if !f.e.Summarize(context.Background(), f.clock.Now()) {
		t.Error("Summarize at the window's end reported no summary")
	}
	f.e.Drained()
	close(stop)
	<-done
	found := false
	for len(f.events.Events) > 0 {
		if e := <-f.events.Events; strings.HasPrefix(e, "Warning InterruptionHandled") {
			found = true
		}
	}
	if !found {
		t.Error("no summary at the window's end")
	}
}

// evictionAt is one eviction request as the fake server saw it.
type evictionAt struct {
	pod   string
	grace int64
	at    time.Time // on the fake clock
}

// recordEvictions makes f's server answer with answer (nil: accepted) and records each request.
func (f *fixture) recordEvictions(answer func(ctx context.Context, n int) error) *[]evictionAt {
	var got []evictionAt
	f.evict = func(ctx context.Context, ev *policyv1.Eviction) error {
		f.mu.Lock()
		got = append(got, evictionAt{pod: ev.Name, grace: *ev.DeleteOptions.GracePeriodSeconds, at: f.clock.Now()})
		n := len(got)
		f.mu.Unlock()
		if answer != nil {
			return answer(ctx, n)
		}
		return nil
	}
	return &got
}

func (f *fixture) sentSoFar(got *[]evictionAt) []evictionAt {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]evictionAt(nil), *got...)
}

// TestMostUrgentPodGoesFirst (issue 24): with one request in flight at a time, the pods due at
// the notice go in the order of their last safe moment (the longest grace first), not in the
// order they became due or were queued. A pod whose eviction can wait (a short grace) never
// takes a seat while one whose deadline is nearer waits.
func TestMostUrgentPodGoesFirst(t *testing.T) {
	graces := []int64{1, 30, 5, 20, 10, 25}
	var pods []*v1.Pod
	for _, g := range graces {
		pods = append(pods, testPod(fmt.Sprintf("g%d", g), g))
	}
	f := newFixture(t, pods...)
	f.e.gate = newGate(f.clock, 1, func() float64 { return 0 })
	release := make(chan struct{})
	got := f.recordEvictions(func(_ context.Context, n int) error {
		if n == 1 {
			<-release // the first request holds the only seat until every other pod waits
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.e.Run(ctx, len(pods))
	f.e.SetView(view(t0.Add(40 * time.Second)))
	until(t, "every other pod to wait for its turn", func() bool { _, _, w, _ := f.e.gate.state(); return w == len(pods)-1 })
	close(release)
	until(t, "every eviction", func() bool { return len(f.sentSoFar(got)) == len(pods) })
	sent := f.sentSoFar(got)
	for i := 2; i < len(sent); i++ {
		if sent[i-1].grace < sent[i].grace {
			t.Fatalf("order %v: %s (grace %d s, its last safe moment later) went before %s (grace %d s)",
				sent, sent[i-1].pod, sent[i-1].grace, sent[i].pod, sent[i].grace)
		}
	}
}

// TestEvictionHonoursRetryAfter (issue 24): the API server's own 429 (no DisruptionBudget
// cause) with Retry-After: 2 holds the pod's next request, and every other pod's, for 2 s; the
// next request carries the grace recomputed when it leaves.
func TestEvictionHonoursRetryAfter(t *testing.T) {
	f := newFixture(t, testPod("a", 34), testPod("b", 10))
	f.e.gate = newGate(f.clock, 8, func() float64 { return 0 })
	got := f.recordEvictions(func(_ context.Context, n int) error {
		if n == 1 {
			return apierrors.NewTooManyRequests("Too many requests, please try again later.", 2)
		}
		return nil
	})
	f.e.SetView(decideView()) // window ends at t0+36s
	if after := f.e.SyncPod(context.Background(), "ns/a"); after <= 0 || after > time.Millisecond {
		t.Fatalf("after a throttling answer the pod is looked at again in %s, want at once (the gate paces it)", after)
	}
	done := make(chan struct{}, 2)
	for _, k := range []string{"ns/a", "ns/b"} {
		go func() { f.e.SyncPod(context.Background(), k); done <- struct{}{} }()
	}
	until(t, "both pods to wait out the pause", func() bool { _, _, w, _ := f.e.gate.state(); return w == 2 && f.clock.HasWaiters() })
	f.clock.Step(2*time.Second - time.Millisecond)
	if n := len(f.sentSoFar(got)); n != 1 {
		t.Fatalf("%d requests before Retry-After ended, want 1", n)
	}
	f.clock.Step(time.Millisecond)
	<-done
	<-done
	sent := f.sentSoFar(got)
	if len(sent) != 3 {
		t.Fatalf("requests %v, want 3", sent)
	}
	for _, s := range sent[1:] {
		if s.at.Before(t0.Add(2 * time.Second)) {
			t.Errorf("%s sent at %s, before Retry-After ended", s.pod, s.at)
		}
		// a's grace is recomputed at the send, 2 s later: 36 - 2.25 less the kubelet's 1 s
		// reaction = 32 s, not the 34 s of t0.
		if s.pod == "a" && s.grace != 32 {
			t.Errorf("a sent again with grace %d s, want 32 (recomputed at the send)", s.grace)
		}
	}
}

// TestQueuedRequestResentWithGraceRecomputed (issue 24): a request that waits in the API
// server's queue for all the slack its grace leaves is cancelled and sent again with a grace
// recomputed then, so that the pod still ends by the window's end.
func TestQueuedRequestResentWithGraceRecomputed(t *testing.T) {
	f := newFixture(t, testPod("a", 34))
	var bounds []time.Duration
	got := f.recordEvictions(func(ctx context.Context, n int) error {
		if d, ok := ctx.Deadline(); ok {
			bounds = append(bounds, time.Until(d))
		}
		if n == 1 {
			// The server's queue holds it until the client gives up.
			<-ctx.Done()
			return fmt.Errorf("posting the eviction: %w", ctx.Err())
		}
		return nil
	})
	// The window ends at t0+36s; a 34 s grace and the kubelet's 1 s reaction leave 1 s.
	f.e.SetView(decideView())
	if after := f.e.SyncPod(context.Background(), "ns/a"); after > time.Millisecond {
		t.Fatalf("after waiting its slack in the queue the pod is looked at again in %s, want at once", after)
	}
	if len(bounds) != 1 || bounds[0] > time.Second || bounds[0] < 750*time.Millisecond {
		t.Fatalf("the request could wait %v, want the 1 s its grace left (36 s to the window's end, 34 s grace, 1 s reaction)", bounds)
	}
	f.clock.Step(800 * time.Millisecond)
	f.e.SyncPod(context.Background(), "ns/a")
	sent := f.sentSoFar(got)
	if len(sent) != 2 || sent[1].grace != 33 {
		t.Fatalf("requests %v, want a second with the grace recomputed (33 s)", sent)
	}
}

// TestEnqueueAllMostUrgentFirst (issue 24): a new window queues the node's pods by their last
// safe moment, so that the first requests of a notice (sent before any waiter is there to be
// ordered) are the most urgent; pods left alone come last.
func TestEnqueueAllMostUrgentFirst(t *testing.T) {
	forever := testPod("forever", 60)
	forever.Spec.Tolerations = []v1.Toleration{{Key: spot.Key, Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute}}
	f := newFixture(t, testPod("a5", 5), forever, testPod("b30", 30), testPod("c1", 1), testPod("d20", 20))
	f.e.SetView(view(t0.Add(40 * time.Second)))
	var got []string
	for f.e.queue.Len() > 0 {
		k, _ := f.e.queue.Get()
		got = append(got, k)
		f.e.queue.Done(k)
	}
	want := []string{"ns/b30", "ns/d20", "ns/a5", "ns/c1", "ns/forever"}
	if !slices.Equal(got, want) {
		t.Fatalf("queued %v, want %v", got, want)
	}
}

// TestThrottledPastForcePointWaitsRetryAfter (issue 24): a pod past its force point that the
// server throttles is looked at again only after the server's Retry-After, not at the 100 ms of
// a failed delete: a pool's lost pods must not take the seats the others still need.
func TestThrottledPastForcePointWaitsRetryAfter(t *testing.T) {
	f := newFixture(t, testPod("a", 30))
	f.e.gate = newGate(f.clock, 8, func() float64 { return 0 })
	f.recordEvictions(func(context.Context, int) error {
		return apierrors.NewTooManyRequests("Too many requests, please try again later.", 3)
	})
	f.e.SetView(view(t0.Add(40 * time.Second))) // latest t0+5s
	f.clock.SetTime(t0.Add(5 * time.Second))    // past the force point
	if after := f.e.SyncPod(context.Background(), "ns/a"); after < 3*time.Second {
		t.Fatalf("looked at again in %s after Retry-After 3 s past the force point, want 3 s at least", after)
	}
}

// TestThrottledPastForcePointGoesAtItsLastChance (issue 52): a pause after a 429 (Retry-After
// 30 s) that outlasts the pod's last chance does not keep the pod out of the gate until it ends:
// the pod is looked at again by its last chance and goes then, past the pause, with a grace
// that ends by the window's end. In make test such a pod went at the pause's end, 3.7 s past the
// window's, while the pods beside it went at their last chance.
func TestThrottledPastForcePointGoesAtItsLastChance(t *testing.T) {
	f := newFixture(t, testPod("a", 30))
	f.e.gate = newGate(f.clock, 8, func() float64 { return 0 })
	got := f.recordEvictions(func(_ context.Context, n int) error {
		if n == 1 {
			return apierrors.NewTooManyRequests("Too many requests, please try again later.", 30)
		}
		return nil
	})
	v := view(t0.Add(40 * time.Second)) // window end t0+35 s; latest t0+5 s
	f.e.SetView(v)
	f.clock.SetTime(t0.Add(5 * time.Second)) // past the force point
	after := f.e.SyncPod(context.Background(), "ns/a")
	if left := f.e.gate.pauseLeft(); left < 30*time.Second {
		t.Fatalf("pause %v after Retry-After 30 s, want 30 s at least", left)
	}
	if pause := f.e.gate.pauseLeft(); after >= pause {
		t.Fatalf("looked at again in %v, at the pause's end (%v): the pod is not in the gate at its last chance", after, pause)
	}
	f.clock.Step(after)
	done := make(chan struct{})
	go func() { defer close(done); f.e.SyncPod(context.Background(), "ns/a") }()
	// Back in the gate, it waits out the pause to its last chance.
	until(t, "the pod's wait in the gate", func() bool { _, _, w, _ := f.e.gate.state(); return w == 1 && f.clock.HasWaiters() })
	if sent := f.sentSoFar(got); len(sent) != 1 {
		t.Fatalf("requests %v before its last chance, during the pause; want only the throttled one", sent)
	}
	f.e.gate.mu.Lock()
	next := f.e.gate.timerAt
	f.e.gate.mu.Unlock()
	f.clock.SetTime(next) // the gate's next moment: the pod's last chance
	<-done
	sent := f.sentSoFar(got)
	if len(sent) != 2 {
		t.Fatalf("requests %v; want the throttled one and one more, at the last chance (looked at again after %v)", sent, after)
	}
	if end := sent[1].at.Add(time.Duration(sent[1].grace) * time.Second); end.After(v.Window.End()) || sent[1].grace < 2 {
		t.Errorf("sent again at T%+.1fs with %d s: ends at T%+.1fs, want at least 2 s ending by the window's end T%+.1fs",
			sent[1].at.Sub(t0).Seconds(), sent[1].grace, end.Sub(t0).Seconds(), v.Window.End().Sub(t0).Seconds())
	}
}

// TestLastChanceRequestNotCut: a pod sent at its last chance asks for the least grace (2 s, the
// kubelet's floor: issue 38, case 2),
// and a resend could ask for no less: the request may take the request timeout, not the 250 ms
// allowance, which cut every resend in turn while the server answered more slowly than that.
func TestLastChanceRequestNotCut(t *testing.T) {
	f := newFixture(t, testPod("a", 30))
	var grace int64
	var bound time.Duration
	f.evict = func(ctx context.Context, ev *policyv1.Eviction) error {
		grace = *ev.DeleteOptions.GracePeriodSeconds
		if d, ok := ctx.Deadline(); ok {
			bound = time.Until(d)
		}
		return nil
	}
	f.e.SetView(view(t0.Add(40 * time.Second)))       // window ends at t0+35s
	f.clock.SetTime(t0.Add(32200 * time.Millisecond)) // 2.8 s before it: only the least grace fits
	f.e.SyncPod(context.Background(), "ns/a")
	if n := f.evictions(); n != 1 || grace != 2 {
		t.Fatalf("%d evictions, grace %d s; want one, with 2 s", n, grace)
	}
	if bound < RequestTimeout-time.Second {
		t.Errorf("the last-chance request may wait %s, want about %s (a resend could ask for no less grace)", bound, RequestTimeout)
	}
}

// TestDeadlineBoundSendRemeasuresTheMargin: a deadline-bound pod planned while the server
// answered at once waits until RemeasureLead before its send, not until the send itself; when
// answers slowed meanwhile (the margin grew from 0 to 0.27 s), the send moves earlier by the
// new margin and the pod keeps its whole grace. Woken at the send time of the plan, it would
// have been sent with 9 s of its 10 (TestSpotInterruption once saw this under load). The send
// margin is that answer's time, not RFC 6298's 3R of a first measurement (gate.sendMargin):
// 0.81 s earlier, such a pod was evicted 1.2 s before its plan (TestRecordRestartGCPPreemption).
func TestDeadlineBoundSendRemeasuresTheMargin(t *testing.T) {
	pod := testPod("p", 10)
	tolerate := int64(600) // due long after the window: the deadline decides
	pod.Spec.Tolerations = []v1.Toleration{{Key: spot.Key, Operator: v1.TolerationOpExists, Effect: spot.Effect, TolerationSeconds: &tolerate}}
	f := newFixture(t, pod)
	deadline := t0.Add(60 * time.Second) // window end t0+55 s; latest start t0+44 s (its grace and the kubelet's reaction)
	f.e.SetView(view(deadline))
	send := t0.Add(45*time.Second - plan.KubeletReaction - plan.EvictionLead)
	d := f.e.SyncPod(context.Background(), "ns/p")
	if want := send.Add(-RemeasureLead).Sub(t0); d != want {
		t.Fatalf("first wait %v, want %v (RemeasureLead before the send at %v)", d, want, send)
	}
	// A slow answer meanwhile: srtt 270 ms, rttvar 135 ms, so the estimate is 810 ms; the send
	// margin is the answer's own 270 ms.
	f.e.gate.mu.Lock()
	f.e.gate.observe(270 * time.Millisecond)
	f.e.gate.mu.Unlock()
	if m := f.e.gate.queueMargin(); m != 810*time.Millisecond {
		t.Fatalf("margin %v, want 810ms", m)
	}
	if m := f.e.gate.sendMargin(); m != 270*time.Millisecond {
		t.Fatalf("send margin %v, want 270ms (the one answer's time)", m)
	}
	f.clock.SetTime(t0.Add(d))
	d2 := f.e.SyncPod(context.Background(), "ns/p")
	if n := f.evictions(); n != 0 {
		t.Fatalf("%d evictions at the remeasure, want none yet", n)
	}
	if want := send.Add(-270 * time.Millisecond).Sub(f.clock.Now()); d2 != want {
		t.Fatalf("second wait %v, want %v (the send moved earlier by the margin)", d2, want)
	}
	f.clock.Step(d2)
	var grace int64 = -1
	f.evict = func(_ context.Context, ev *policyv1.Eviction) error {
		grace = *ev.DeleteOptions.GracePeriodSeconds
		return nil
	}
	f.e.SyncPod(context.Background(), "ns/p")
	if grace != 10 {
		t.Errorf("evicted with grace %ds, want the whole 10s", grace)
	}
}

// TestEnqueueAllLostBudgetLast (issue 24): a pod whose budget the window can never meet (its
// grace longer than the window: its last safe moment has passed at the notice) is queued after
// the pods whose budget can still be kept, as the gate orders them, so that the notice's probe
// (the first request, gate.go) is a pod that can still keep its grace.
func TestEnqueueAllLostBudgetLast(t *testing.T) {
	f := newFixture(t, testPod("a5", 5), testPod("b45", 45), testPod("c30", 30))
	f.e.SetView(view(t0.Add(40 * time.Second))) // window ends at t0+35s: b45's moment has passed
	var got []string
	for f.e.queue.Len() > 0 {
		k, _ := f.e.queue.Get()
		got = append(got, k)
		f.e.queue.Done(k)
	}
	want := []string{"ns/c30", "ns/a5", "ns/b45"}
	if !slices.Equal(got, want) {
		t.Fatalf("queued %v, want %v", got, want)
	}
}

// TestSetViewStartsNoticeCold (issue 24): a new window with a deadline starts the gate cold
// (gate.go): the restart limit, and a probe before the node's other pods.
func TestSetViewStartsNoticeCold(t *testing.T) {
	f := newFixture(t, testPod("a", 5))
	if l, _, _, _ := f.e.gate.state(); l == gateRestartLimit {
		t.Fatalf("limit %d before any notice", l)
	}
	f.e.SetView(view(t0.Add(40 * time.Second)))
	if l, _, _, _ := f.e.gate.state(); l != gateRestartLimit {
		t.Fatalf("limit %d after a notice, want %d", l, gateRestartLimit)
	}
}

// TestLateUrgentPodOvertakesWaitingPods (issue 38, case 1): a pod that becomes due later in
// the window, but whose last safe moment is nearer than the waiting pods', goes before them;
// the pods the gate holds hold no worker. Scaled down from the review: 2 workers, 20 pods with
// a 10 s grace, 4 s per answer, and a 60 s pod that tolerates the taint 20 s (due T+20, last
// safe moment T+55). With the workers blocked by the gate it was sent at T+80, with 30 s.
func TestLateUrgentPodOvertakesWaitingPods(t *testing.T) {
	var pods []*v1.Pod
	for i := range 20 {
		pods = append(pods, testPod(fmt.Sprintf("p%02d", i), 10))
	}
	late := testPod("late", 60)
	tol := int64(20)
	late.Spec.Tolerations = []v1.Toleration{{Key: spot.Key, Operator: v1.TolerationOpExists, Effect: spot.Effect, TolerationSeconds: &tol}}
	pods = append(pods, late)
	f := newFixture(t, pods...)
	f.e.gate = newGate(f.clock, 2, func() float64 { return 0 })
	// answers holds the fake-clock moment each request out is answered at, until its answer
	// has been given.
	answers := map[int]time.Time{}
	got := f.recordEvictions(func(ctx context.Context, n int) error {
		// Every answer takes 4 s on the fake clock.
		f.mu.Lock()
		at := f.clock.Now().Add(4 * time.Second)
		answers[n] = at
		ch := f.clock.After(4 * time.Second)
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		f.mu.Lock()
		delete(answers, n)
		f.mu.Unlock()
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.e.Run(ctx, 2)
	f.e.SetView(view(t0.Add(120 * time.Second))) // window end T+115: the 60 s pod's last safe moment T+55
	quiet := func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		_, inflight, _, _ := f.e.gate.state()
		// Every due pod was taken from the queue (a worker held by a waiting request leaves
		// them there), and every request out waits for an answer still to come.
		for _, at := range answers {
			if !at.After(f.clock.Now()) {
				return false
			}
		}
		return f.e.queue.Len() == 0 && len(answers) == inflight
	}
	var sentLate *evictionAt
	for step := 0; step < 1200 && sentLate == nil; step++ {
		until(t, "the workers to take every due pod and each request out to wait for its answer", quiet)
		f.clock.Step(100 * time.Millisecond)
		for _, s := range f.sentSoFar(got) {
			if s.pod == "late" {
				s := s
				sentLate = &s
			}
		}
	}
	if sentLate == nil {
		t.Fatal("the late pod was never sent within 120 s")
	}
	// By its last safe moment; its grace recomputed then may lose a second or two to a
	// queueing margin that grew while it waited (4 s answers), not half of it.
	if last := t0.Add(55 * time.Second); sentLate.at.After(last) || sentLate.grace < 55 {
		t.Fatalf("the pod due at T+20 with its last safe moment at T+55 was sent at T+%s with grace %d s; want by T+55 with at least 55 s of its 60 s",
			sentLate.at.Sub(t0), sentLate.grace)
	}
	cancel()
}

// TestDrainedWaitsForShortenedPods (issue 38, case 4): a pod that tolerates the interruption
// forever but was deleted by someone else with 600 s is shortened by reprieve to end by the
// window's end; the node is not drained (Azure's event is not approved) while it still runs:
// approving at once started the event and cut the grace reprieve had just given it.
func TestDrainedWaitsForShortenedPods(t *testing.T) {
	p := testPod("leaving", 600)
	p.Spec.Tolerations = []v1.Toleration{{Key: spot.Key, Operator: v1.TolerationOpExists, Effect: spot.Effect}}
	p.DeletionTimestamp = &metav1.Time{Time: t0.Add(600 * time.Second)}
	f := newFixture(t, p)
	f.e.SetView(view(t0.Add(60 * time.Second)))
	f.e.SyncPod(context.Background(), "ns/leaving")
	if d := f.client.Actions(); len(d) == 0 {
		t.Fatal("the terminating pod was not shortened")
	}
	if _, _, ok := f.e.Drained(); ok {
		t.Fatal("drained while a pod reprieve just shortened still runs: the approval would cut its grace")
	}
	if err := f.store.Delete(p); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := f.e.Drained(); !ok {
		t.Fatal("not drained once the shortened pod is gone")
	}
}

// TestVolumeAtRisk (issue 40, item 1): a pod with a claim must be gone 16 s before a deadline
// 40 s away (T+24). At the notice its 30 s grace is cut to end there, and its volume is not at
// risk; looked at only at T+23 (the agent late), even the least grace no longer ends by T+24:
// it is reported at risk once (an event, the metric) and the window's summary names it, never
// as handled. A pod without a volume, evicted in time, counts as handled.
func TestVolumeAtRisk(t *testing.T) {
	vol := testPod("db-0", 30)
	vol.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data-db-0"}}}}
	f := newFixture(t, vol, testPod("web", 5))
	vw := view(t0.Add(40 * time.Second))
	vw.Window.VolumeRelease = 16 * time.Second
	f.e.SetView(vw)
	a := decide(decision{pod: vol, view: vw, now: t0, minKill: minKill})
	if a.volumeAtRisk || !a.pl.Volume {
		t.Fatalf("at the notice: volume rule %v, at risk %v; want the rule, not at risk (its grace is cut to the release)", a.pl.Volume, a.volumeAtRisk)
	}
	if s := sendGrace(actEvict, a, time.Time{}, t0, 0); s.grace != 22*time.Second {
		t.Fatalf("at the notice the grace is %s, want 22s (to end by the release at T+24, less the allowance and the kubelet's reaction)", s.grace)
	}
	f.clock.SetTime(t0.Add(23 * time.Second))
	f.e.SyncPod(context.Background(), "ns/db-0")
	f.e.SyncPod(context.Background(), "ns/db-0")
	f.e.SyncPod(context.Background(), "ns/web")
	if got := testutil.ToFloat64(f.e.o.Metrics.VolumeAtRiskTotal); got != 1 {
		t.Fatalf("reprieve_evictions_volume_at_risk_total = %v, want 1 (once per pod and window)", got)
	}
	var atRisk int
	for len(f.events.Events) > 0 {
		if e := <-f.events.Events; strings.HasPrefix(e, "Warning VolumeAtRisk") {
			atRisk++
		}
	}
	if atRisk != 1 {
		t.Fatalf("%d VolumeAtRisk events, want 1", atRisk)
	}
	for _, p := range []string{"db-0", "web"} {
		obj, _, _ := f.store.GetByKey("ns/" + p)
		if err := f.store.Delete(obj); err != nil {
			t.Fatal(err)
		}
		if err := f.client.CoreV1().Pods("ns").Delete(context.Background(), p, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.e.Summarize(context.Background(), t0.Add(35*time.Second))
	var summary string
	for len(f.events.Events) > 0 {
		if e := <-f.events.Events; strings.Contains(e, "InterruptionHandled") {
			summary = e
		}
	}
	if !strings.HasPrefix(summary, "Warning") || !strings.Contains(summary, "1 gone before") || !strings.Contains(summary, "1 with a volume at risk") || !strings.Contains(summary, "ns/db-0") {
		t.Fatalf("summary %q: want a warning, 1 handled (web), 1 volume at risk naming ns/db-0", summary)
	}
}

// TestVolumesReleasedInTheSummary (issue 40, item 2): the window's summary says which of the
// volumes the node listed in status.volumesInUse during the window were released (gone from
// the list) by its end, and which were still in use, by name; nothing is tracked outside a
// window with a deadline.
func TestVolumesReleasedInTheSummary(t *testing.T) {
	f := newFixture(t)
	f.e.ObserveVolumes([]v1.UniqueVolumeName{"pre-window-volume"}, t0) // no deadline yet: not tracked
	vw := view(t0.Add(40 * time.Second))
	vw.Window.VolumeRelease = 16 * time.Second // the volume rule on
	f.e.SetView(vw)
	a, b := v1.UniqueVolumeName("kubernetes.io/csi/ebs.csi.aws.com^vol-a"), v1.UniqueVolumeName("kubernetes.io/csi/ebs.csi.aws.com^vol-b")
	f.e.ObserveVolumes([]v1.UniqueVolumeName{a, b}, t0.Add(time.Second))
	f.e.ObserveVolumes([]v1.UniqueVolumeName{b}, t0.Add(20*time.Second))
	f.e.Summarize(context.Background(), t0.Add(35*time.Second))
	var summary string
	for len(f.events.Events) > 0 {
		if e := <-f.events.Events; strings.Contains(e, "InterruptionHandled") {
			summary = e
		}
	}
	if !strings.HasPrefix(summary, "Warning") || !strings.Contains(summary, "1 released") || !strings.Contains(summary, "1 still in use") ||
		!strings.Contains(summary, string(b)) || strings.Contains(summary, "pre-window-volume") {
		t.Fatalf("summary %q: want a warning, %s released, %s still in use, nothing from before the window", summary, a, b)
	}
	// No pod was planned with the volume rule: these volumes are of pods reprieve left alone,
	// and reprieve_window_volumes_total, which the ReprieveVolumeStillInUse alert reads, does
	// not count them (TestVolumesReleasedPerPodInTheSummary counts the planned pods').
	for _, result := range []string{metrics.VolumeReleased, metrics.VolumeStillInUse} {
		if got := testutil.ToFloat64(f.e.o.Metrics.WindowVolumes.WithLabelValues(result)); got != 0 {
			t.Errorf("reprieve_window_volumes_total{result=%q} = %v, want 0: no planned pod's volume", result, got)
		}
	}
}

// TestVolumesReleasedPerPodInTheSummary (issue 40, item 2): the window's summary says, for each
// pod planned with a volume that needs attaching, when each of its volumes (read from the API
// once, when the pod is first planned in the window) left the node's volumesInUse, relative to
// the deadline, or that it was still in use when counted (at the deadline); a pod whose volumes could not
// be read is "unknown", never left out; a pod without such a volume is not listed; the
// node-level figures stay.
func TestVolumesReleasedPerPodInTheSummary(t *testing.T) {
	withClaim := func(name string) *v1.Pod {
		p := testPod(name, 10)
		p.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data-" + name}}}}
		return p
	}
	a, b := v1.UniqueVolumeName("kubernetes.io/csi/ebs.csi.aws.com^vol-a"), v1.UniqueVolumeName("kubernetes.io/csi/ebs.csi.aws.com^vol-b")
	for _, c := range []struct {
		name   string
		reader bool
		want   []string
	}{
		{name: "read from the API server", reader: true, want: []string{
			"ns/db-0: volume " + string(a) + " released at D-7.7s",
			"ns/db-1: volume " + string(b) + " still in use at D+0.0s",
			`ns/db-2: volumes unknown (persistentvolumeclaims "data-db-2" is forbidden)`,
			"ns/db-3: volume data (PersistentVolume pv-nfs, nfs) attaches to no node",
		}},
		{name: "no reader", want: []string{
			"ns/db-0: volumes unknown (" + errNoPodVolumes.Error() + ")",
			"ns/db-1: volumes unknown (" + errNoPodVolumes.Error() + ")",
			"ns/db-2: volumes unknown (" + errNoPodVolumes.Error() + ")",
			"ns/db-3: volumes unknown (" + errNoPodVolumes.Error() + ")",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, withClaim("db-0"), withClaim("db-1"), withClaim("db-2"), withClaim("db-3"), testPod("web", 5))
			reads := map[types.UID]int{}
			if c.reader {
				var mu sync.Mutex
				f.e.o.PodVolumes = func(_ context.Context, pod *v1.Pod) (VolumesOf, error) {
					mu.Lock()
					defer mu.Unlock()
					reads[pod.UID]++
					switch pod.UID {
					case "uid-db-0":
						return VolumesOf{Attach: []v1.UniqueVolumeName{a}}, nil
					case "uid-db-1":
						return VolumesOf{Attach: []v1.UniqueVolumeName{b}}, nil
					case "uid-db-3":
						return VolumesOf{NoAttach: []string{"volume data (PersistentVolume pv-nfs, nfs)"}}, nil
					}
					return VolumesOf{}, fmt.Errorf("persistentvolumeclaims \"data-db-2\" is forbidden")
				}
			}
			f.e.ObserveVolumes([]v1.UniqueVolumeName{a, b}, t0) // before the notice: not tracked
			vw := view(t0.Add(40 * time.Second))
			vw.Window.VolumeRelease = 16 * time.Second
			f.e.SetView(vw)
			f.e.ObserveVolumes([]v1.UniqueVolumeName{a, b}, t0.Add(time.Second))
			for _, p := range []string{"db-0", "db-1", "db-2", "db-3", "web"} {
				f.e.SyncPod(context.Background(), "ns/"+p) // planned: evicted at D-26 s
			}
			f.clock.SetTime(t0.Add(14 * time.Second))
			for _, p := range []string{"db-0", "db-1", "db-2", "db-3", "web"} {
				f.e.SyncPod(context.Background(), "ns/"+p)
			}
			f.e.reads.Wait() // the reads run off the eviction's path
			if c.reader {
				for _, uid := range []types.UID{"uid-db-0", "uid-db-1", "uid-db-2", "uid-db-3"} {
					if reads[uid] != 1 {
						t.Errorf("pod %s's volumes read %d times, want once per window", uid, reads[uid])
					}
				}
				if reads["uid-web"] != 0 {
					t.Errorf("web, without a volume that needs attaching, had its volumes read")
				}
			}
			f.e.ObserveVolumes([]v1.UniqueVolumeName{b}, t0.Add(32300*time.Millisecond))
			// b is still listed at the window's end: its release is due only by the deadline,
			// when the summary counts it (issue 50, case 6).
			if f.e.Summarize(context.Background(), t0.Add(35*time.Second)) {
				t.Error("summarized at the window's end with a planned pod's volume still listed")
			}
			f.e.Summarize(context.Background(), t0.Add(40*time.Second))
			var summary string
			for len(f.events.Events) > 0 {
				if e := <-f.events.Events; strings.Contains(e, "InterruptionHandled") {
					summary = e
				}
			}
			if !strings.HasPrefix(summary, "Warning") || !strings.Contains(summary, "1 released") || !strings.Contains(summary, "1 still in use") {
				t.Errorf("summary %q: want a warning with the node-level figures (1 released, 1 still in use)", summary)
			}
			for _, w := range c.want {
				if !strings.Contains(summary, w) {
					t.Errorf("summary %q: want %q", summary, w)
				}
			}
			if strings.Contains(summary, "ns/web:") {
				t.Errorf("summary %q: web, without a volume that needs attaching, must not be listed", summary)
			}
			// The planned pods' volumes in reprieve_window_volumes_total (without a reader
			// every volume in use counts: it cannot tell whose they are), once per window.
			f.e.Summarize(context.Background(), t0.Add(41*time.Second))
			for result, want := range map[string]float64{metrics.VolumeReleased: 1, metrics.VolumeStillInUse: 1} {
				if got := testutil.ToFloat64(f.e.o.Metrics.WindowVolumes.WithLabelValues(result)); got != want {
					t.Errorf("reprieve_window_volumes_total{result=%q} = %v, want %v", result, got, want)
				}
			}
		})
	}
}

// TestPodVolumesKeptWhenTheDeadlineMoves: a deadline that moves within one interruption starts
// a new drain, which keeps what was read of the pods' volumes (the claim may be
// gone by then): no second read, and the summary still names the pod's volume.
func TestPodVolumesKeptWhenTheDeadlineMoves(t *testing.T) {
	p := testPod("db-0", 10)
	p.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data-db-0"}}}}
	f := newFixture(t, p)
	a := v1.UniqueVolumeName("kubernetes.io/csi/ebs.csi.aws.com^vol-a")
	reads := 0
	f.e.o.PodVolumes = func(context.Context, *v1.Pod) (VolumesOf, error) {
		reads++
		if reads > 1 {
			return VolumesOf{}, fmt.Errorf("torn down")
		}
		return VolumesOf{Attach: []v1.UniqueVolumeName{a}}, nil
	}
	vw := view(t0.Add(60 * time.Second))
	vw.Window.VolumeRelease = 16 * time.Second
	f.e.SetView(vw)
	f.e.ObserveVolumes([]v1.UniqueVolumeName{a}, t0)
	f.e.SyncPod(context.Background(), "ns/db-0")
	f.e.reads.Wait()
	vw = view(t0.Add(40 * time.Second))
	vw.Window.VolumeRelease = 16 * time.Second
	f.e.SetView(vw)
	f.e.SyncPod(context.Background(), "ns/db-0")
	f.e.reads.Wait()
	f.e.ObserveVolumes(nil, t0.Add(30*time.Second))
	f.e.Summarize(context.Background(), t0.Add(35*time.Second))
	var summary string
	for len(f.events.Events) > 0 {
		if e := <-f.events.Events; strings.Contains(e, "InterruptionHandled") {
			summary = e
		}
	}
	if reads != 1 {
		t.Errorf("db-0's volumes read %d times across the moved deadline, want once", reads)
	}
	if want := "ns/db-0: volume " + string(a) + " released at D-10.0s"; !strings.Contains(summary, want) {
		t.Errorf("summary %q: want %q", summary, want)
	}
}

// TestPodVolumesReadOffTheEvictionPath: the read of a pod's volumes (GETs of its claims and
// volumes) never holds up its eviction: the pod is evicted while the read still waits on the
// API server. A read that ends after the deadline moved lands in the new drain; one still
// under way at the window's end is "unknown" in the summary, with that reason.
func TestPodVolumesReadOffTheEvictionPath(t *testing.T) {
	p := testPod("db-0", 10)
	p.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data-db-0"}}}}
	a := v1.UniqueVolumeName("kubernetes.io/csi/ebs.csi.aws.com^vol-a")
	summaryOf := func(f *fixture) string {
		var summary string
		for len(f.events.Events) > 0 {
			if e := <-f.events.Events; strings.Contains(e, "InterruptionHandled") {
				summary = e
			}
		}
		return summary
	}
	for _, c := range []struct {
		name       string
		moveFirst  bool // the deadline moves while the read waits
		endsBefore bool // the read ends before the summary
		want       string
	}{
		{name: "lands in the moved deadline's drain", moveFirst: true, endsBefore: true, want: "ns/db-0: volume " + string(a) + " released at D-10.0s"},
		{name: "still under way at the window's end", want: "ns/db-0: volumes unknown (" + errPodVolumesPending.Error() + ")"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, p)
			release := make(chan struct{})
			f.e.o.PodVolumes = func(ctx context.Context, _ *v1.Pod) (VolumesOf, error) {
				select {
				case <-release:
				case <-ctx.Done():
					return VolumesOf{}, ctx.Err()
				}
				return VolumesOf{Attach: []v1.UniqueVolumeName{a}}, nil
			}
			defer func() {
				select {
				case <-release:
				default:
					close(release)
				}
				f.e.reads.Wait()
			}()
			vw := view(t0.Add(30 * time.Second))
			vw.Window.VolumeRelease = 16 * time.Second
			f.e.SetView(vw)
			f.e.ObserveVolumes([]v1.UniqueVolumeName{a}, t0)
			f.clock.SetTime(t0.Add(5 * time.Second)) // due: D-30 s less 16 s less its 10 s grace is before now
			synced := make(chan struct{})
			go func() {
				f.e.SyncPod(context.Background(), "ns/db-0")
				close(synced)
			}()
			select {
			case <-synced:
			case <-time.After(30 * time.Second):
				t.Fatal("SyncPod waits on the read of the pod's volumes")
			}
			f.e.sends.Wait()
			f.mu.Lock()
			sent := slices.Clone(f.sent)
			f.mu.Unlock()
			if !slices.Contains(sent, "ns/db-0") {
				t.Fatalf("evicted %v while the volumes' read waits; want ns/db-0", sent)
			}
			if c.moveFirst {
				vw = view(t0.Add(40 * time.Second))
				vw.Window.VolumeRelease = 16 * time.Second
				f.e.SetView(vw)
			}
			if c.endsBefore {
				close(release)
				f.e.reads.Wait()
			}
			f.e.ObserveVolumes(nil, t0.Add(30*time.Second))
			end := t0.Add(35 * time.Second)
			if c.moveFirst {
				end = t0.Add(40 * time.Second)
			}
			f.e.Summarize(context.Background(), end)
			if summary := summaryOf(f); !strings.Contains(summary, c.want) {
				t.Errorf("summary %q: want %q", summary, c.want)
			}
		})
	}
}

// TestVolumesToCount: reprieve_window_volumes_total counts the volumes of the pods planned with
// the volume rule, not those of pods reprieve leaves alone (a DaemonSet's, one tolerating the
// interruption forever): the alert on a volume still in use must be actionable. When a planned
// pod's volumes are unknown, or the volume rule is off, every volume counts.
func TestVolumesToCount(t *testing.T) {
	end := t0.Add(35 * time.Second)
	const mine, left, gone = v1.UniqueVolumeName("kubernetes.io/csi/d^mine"), v1.UniqueVolumeName("kubernetes.io/csi/d^left"), v1.UniqueVolumeName("kubernetes.io/csi/d^gone")
	volumes := map[v1.UniqueVolumeName]time.Time{mine: {}, left: {}, gone: t0.Add(20 * time.Second)}
	for _, c := range []struct {
		name               string
		pods               map[string]podVolumes
		ruleOff            bool
		released, stillUse int
	}{
		{"only the planned pods' volumes", map[string]podVolumes{"ns/db-0": {vols: VolumesOf{Attach: []v1.UniqueVolumeName{mine, gone}}}}, false, 1, 1},
		{"no planned pod", nil, false, 0, 0},
		{"a planned pod's volumes unknown", map[string]podVolumes{"ns/db-0": {vols: VolumesOf{Attach: []v1.UniqueVolumeName{mine}}},
			"ns/db-1": {err: errors.New("forbidden")}}, false, 1, 2},
		{"a read still under way", map[string]podVolumes{"ns/db-0": {pending: true}}, false, 1, 2},
		{"the volume rule off (--volume-release=off): no pod's volumes read", nil, true, 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			if r, h := volumesToCount(c.pods, volumes, end, !c.ruleOff); r != c.released || h != c.stillUse {
				t.Errorf("released %d, still in use %d; want %d and %d", r, h, c.released, c.stillUse)
			}
			// The counted volumes still listed in use are what the count and Azure's approval
			// wait for (issue 50, cases 5 and 6); one released after the window's end is no
			// longer among them.
			if got := volumesPending(c.pods, volumes, !c.ruleOff); got != c.stillUse {
				t.Errorf("%d still listed, want %d", got, c.stillUse)
			}
		})
	}
}

// TestVolumeMoments (issue 50, cases 5 and 6): the volume rule has a pod gone VolumeRelease
// before the deadline D so that the kubelet publishes its volume's release by D, not by the
// window's end E = D - margin. The count (reprieve_window_volumes_total, the summary) is taken
// at E when no counted volume is still listed in use, else when the last is released or at D,
// whichever comes first. The node is drained for Azure's approval once its pods are gone and no
// counted volume is still listed, or from E on (Azure starts the event at D anyway).
func TestVolumeMoments(t *testing.T) {
	w := view(t0.Add(40 * time.Second)).Window // E = T+35, D = T+40
	for _, c := range []struct {
		name              string
		pending           int
		now               time.Time
		countDue, holding bool
	}{
		{name: "before the window's end, nothing listed: no count yet, nothing holds the approval", now: t0.Add(20 * time.Second)},
		{name: "before the window's end, a volume listed: it holds the approval", pending: 1, now: t0.Add(20 * time.Second), holding: true},
		{name: "at the window's end, nothing listed: the count is due", now: t0.Add(35 * time.Second), countDue: true},
		{name: "at the window's end, a volume listed: its release is due by D, no count yet", pending: 1, now: t0.Add(35 * time.Second)},
		{name: "4.6 s before D, a volume listed: still no count", pending: 1, now: t0.Add(35400 * time.Millisecond)},
		{name: "at D, a volume listed: the count is due, it is still in use", pending: 1, now: t0.Add(40 * time.Second), countDue: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := volumeCountDue(w, c.pending, c.now); got != c.countDue {
				t.Errorf("count due %v, want %v", got, c.countDue)
			}
			if got := volumesHoldDrain(w, c.pending, c.now); got != c.holding {
				t.Errorf("volumes hold the drain %v, want %v", got, c.holding)
			}
		})
	}
}

// TestVolumeCountedWhenTheReleaseIsDue (issue 50, case 6): a pod with a claim gone at D - 15.4 s
// whose volume is unmounted in 0.5 s is published released at D - 4.6 s, after the window's end
// D - 5 s: counted released, not still in use, and the summary says so. A volume still listed
// at D is counted still in use then.
func TestVolumeCountedWhenTheReleaseIsDue(t *testing.T) {
	vol := v1.UniqueVolumeName("kubernetes.io/csi/ebs.csi.aws.com^vol-a")
	for _, c := range []struct {
		name     string
		released time.Duration // after T; 0: never
		want     map[string]float64
	}{
		{name: "released at D-4.6s", released: 35400 * time.Millisecond, want: map[string]float64{metrics.VolumeReleased: 1, metrics.VolumeStillInUse: 0}},
		{name: "still listed at D", want: map[string]float64{metrics.VolumeReleased: 0, metrics.VolumeStillInUse: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := testPod("db-0", 10)
			p.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data-db-0"}}}}
			f := newFixture(t, p)
			f.e.o.PodVolumes = func(context.Context, *v1.Pod) (VolumesOf, error) {
				return VolumesOf{Attach: []v1.UniqueVolumeName{vol}}, nil
			}
			vw := view(t0.Add(40 * time.Second))
			vw.Window.VolumeRelease = 15400 * time.Millisecond
			f.e.SetView(vw)
			f.e.ObserveVolumes([]v1.UniqueVolumeName{vol}, t0)
			f.e.SyncPod(context.Background(), "ns/db-0")
			f.e.reads.Wait()
			if err := f.store.Delete(p); err != nil {
				t.Fatal(err)
			}
			if err := f.client.CoreV1().Pods("ns").Delete(context.Background(), p.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			counted := func() map[string]float64 {
				m := map[string]float64{}
				for _, r := range []string{metrics.VolumeReleased, metrics.VolumeStillInUse} {
					m[r] = testutil.ToFloat64(f.e.o.Metrics.WindowVolumes.WithLabelValues(r))
				}
				return m
			}
			f.e.ObserveVolumes([]v1.UniqueVolumeName{vol}, t0.Add(35*time.Second))
			if f.e.Summarize(context.Background(), t0.Add(35*time.Second)) {
				t.Error("summarized at the window's end while the volume's release is due only by the deadline")
			}
			if got := counted(); got[metrics.VolumeReleased]+got[metrics.VolumeStillInUse] != 0 {
				t.Fatalf("counted %v at the window's end, before the release is due", got)
			}
			end := t0.Add(40 * time.Second)
			if c.released > 0 {
				end = t0.Add(c.released)
				f.e.ObserveVolumes(nil, end)
			} else {
				f.e.ObserveVolumes([]v1.UniqueVolumeName{vol}, t0.Add(39900*time.Millisecond))
				if f.e.Summarize(context.Background(), t0.Add(39900*time.Millisecond)) {
					t.Error("summarized before the deadline with the volume still listed")
				}
			}
			if !f.e.Summarize(context.Background(), end) {
				t.Fatalf("not summarized at T+%s", end.Sub(t0))
			}
			f.e.Summarize(context.Background(), end.Add(time.Second)) // once per window
			if got := counted(); got[metrics.VolumeReleased] != c.want[metrics.VolumeReleased] || got[metrics.VolumeStillInUse] != c.want[metrics.VolumeStillInUse] {
				t.Errorf("reprieve_window_volumes_total %v, want %v", got, c.want)
			}
			var summary string
			for len(f.events.Events) > 0 {
				if e := <-f.events.Events; strings.Contains(e, "InterruptionHandled") {
					summary = e
				}
			}
			wantText := "volume " + string(vol) + " released at D-4.6s"
			if c.released == 0 {
				wantText = "volume " + string(vol) + " still in use at D+0.0s"
			}
			if !strings.Contains(summary, wantText) {
				t.Errorf("summary %q: want %q", summary, wantText)
			}
		})
	}
}

// TestDrainedWaitsForTheVolumesRelease (issue 50, case 5): with --azure-approve-events the
// event is approved once the node is drained; its pods gone is not enough while the node's
// status.volumesInUse still lists a volume of theirs: the machine could go before the kubelet
// publishes the release, and the detach would wait the six minutes the volume rule is there to
// spare. Bounded: from the window's end on, the volume holds nothing (Azure starts the event at
// the deadline anyway). A volume of a pod reprieve leaves on the node holds nothing either.
func TestDrainedWaitsForTheVolumesRelease(t *testing.T) {
	mine, theirs := v1.UniqueVolumeName("kubernetes.io/csi/d^mine"), v1.UniqueVolumeName("kubernetes.io/csi/d^daemonset")
	p := testPod("db-0", 10)
	p.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data-db-0"}}}}
	for _, c := range []struct {
		name     string
		released bool
		at       time.Duration
		want     bool
	}{
		{name: "its volume still listed", at: 10 * time.Second, want: false},
		{name: "its volume released", released: true, at: 10 * time.Second, want: true},
		{name: "its volume still listed at the window's end: bounded", at: 35 * time.Second, want: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, p.DeepCopy())
			f.e.o.PodVolumes = func(context.Context, *v1.Pod) (VolumesOf, error) {
				return VolumesOf{Attach: []v1.UniqueVolumeName{mine}}, nil
			}
			vw := view(t0.Add(40 * time.Second))
			vw.Window.VolumeRelease = 16 * time.Second
			f.e.SetView(vw)
			f.e.ObserveVolumes([]v1.UniqueVolumeName{mine, theirs}, t0)
			f.e.SyncPod(context.Background(), "ns/db-0")
			f.e.reads.Wait()
			obj, _, _ := f.store.GetByKey("ns/db-0")
			if err := f.store.Delete(obj); err != nil {
				t.Fatal(err)
			}
			f.clock.SetTime(t0.Add(c.at))
			if c.released {
				f.e.ObserveVolumes([]v1.UniqueVolumeName{theirs}, f.clock.Now())
			}
			if _, _, ok := f.e.Drained(); ok != c.want {
				t.Errorf("drained %v, want %v", ok, c.want)
			}
		})
	}
}

// TestForcedDeleteOnASlowServer (issue 50, case 1), the executor whole on a fake clock: a pod
// held by its budget (every eviction refused), due at once, with a 30 s grace in a 61 s window
// (the window's end T+56, its last safe moment T+25 with the kubelet's 1 s reaction), on a server each of whose answers takes
// 1 s (evictions, the DisruptionTarget patch, the DELETE). Its DELETE leaves at its force point
// T+23.5 (the last safe moment less the lead and the 1 s margin its answers measured) with its
// whole 30 s, after the patch. Before, the retry counted from the send was applied from the
// answer and the patch went with the DELETE: it left at T+24.5 with 29 s, or later with 28 s.
func TestForcedDeleteOnASlowServer(t *testing.T) {
	const answer = time.Second
	f := newFixture(t, testPod("p", 30))
	pdb := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	pdb.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: policyv1.DisruptionBudgetCause}}
	got := f.recordEvictions(func(context.Context, int) error {
		f.clock.Step(answer)
		return pdb
	})
	var patchedAt, deletedAt time.Time
	var deleteGrace int64 = -1
	f.client.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if patchedAt.IsZero() {
			patchedAt = f.clock.Now()
		}
		f.clock.Step(answer)
		return false, nil, nil
	})
	f.client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		deletedAt = f.clock.Now()
		if g := a.(k8stesting.DeleteAction).GetDeleteOptions().GracePeriodSeconds; g != nil {
			deleteGrace = *g
		}
		f.clock.Step(answer)
		return false, nil, nil
	})
	f.e.SetView(view(t0.Add(60*time.Second + plan.KubeletReaction)))
	for step := 0; step < 200 && deletedAt.IsZero(); step++ {
		after := f.e.SyncPod(context.Background(), "ns/p")
		if deletedAt.IsZero() && after > 0 {
			f.clock.Step(after)
		}
	}
	if deletedAt.IsZero() {
		t.Fatalf("never deleted; evictions %v", f.sentSoFar(got))
	}
	sent := f.sentSoFar(got)
	t.Logf("%d refused evictions, the last at T+%s; the patch at T+%s; the DELETE at T+%s with %d s",
		len(sent), sent[len(sent)-1].at.Sub(t0), patchedAt.Sub(t0), deletedAt.Sub(t0), deleteGrace)
	if want := t0.Add(23500 * time.Millisecond); deletedAt.Sub(want).Abs() > time.Millisecond || deleteGrace != 30 {
		t.Errorf("the DELETE left at T+%s with %d s, want at the force point T+%s with the whole 30 s", deletedAt.Sub(t0), deleteGrace, want.Sub(t0))
	}
	if patchedAt.IsZero() || !patchedAt.Add(answer).After(sent[len(sent)-1].at) || patchedAt.Add(answer).After(deletedAt) {
		t.Errorf("the DisruptionTarget patch at T+%s: want it answered before the DELETE left (T+%s)", patchedAt.Sub(t0), deletedAt.Sub(t0))
	}
	for _, s := range sent {
		if s.at.Add(answer).After(deletedAt) {
			t.Errorf("an eviction sent at T+%s was answered past the DELETE's moment T+%s", s.at.Sub(t0), deletedAt.Sub(t0))
		}
	}
}

// TestMarginGrowsWhileWaiting (issue 50, case 2), the executor whole on a fake clock: three
// pods due at the notice in a 41 s window (its end E = T+36, less the kubelet's reaction T+35). The server answers "probe" at
// once, "slow" after 3 s, and "throttled"'s first eviction after 1 s with APF's 429 and
// Retry-After: 30. So throttled waits out a pause to T+31, submitted with the margin of its
// answer, while slow's answer grows the margin to 3 s. It goes at its last chance with the
// margin of the moment, T+29.5 (E less the kubelet's reaction and least grace, the lead and 3 s), not at the
// last chance its submission fixed (T+31.5 and later).
func TestMarginGrowsWhileWaiting(t *testing.T) {
	f := newFixture(t, testPod("probe", 33), testPod("throttled", 32), testPod("slow", 5))
	// answers holds the fake-clock moment each request out is answered at.
	answers := map[string]time.Time{}
	after := func(ctx context.Context, key string, d time.Duration) {
		f.mu.Lock()
		answers[key] = f.clock.Now().Add(d)
		ch := f.clock.After(d)
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		f.mu.Lock()
		delete(answers, key)
		f.mu.Unlock()
	}
	var throttledAt []time.Time
	f.evict = func(ctx context.Context, ev *policyv1.Eviction) error {
		switch ev.Name {
		case "slow":
			after(ctx, "slow", 3*time.Second)
		case "throttled":
			f.mu.Lock()
			throttledAt = append(throttledAt, f.clock.Now())
			n := len(throttledAt)
			f.mu.Unlock()
			if n == 1 {
				after(ctx, "throttled", time.Second)
				return apierrors.NewTooManyRequests("Too many requests, please try again later.", 30)
			}
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.e.SetView(decideView())
	// The notice's probe (gate.go) first, answered at once: then throttled and slow go together.
	f.e.SyncPod(ctx, "ns/probe")
	go f.e.Run(ctx, 4)
	quiet := func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		_, inflight, _, _ := f.e.gate.state()
		for _, at := range answers {
			if !at.After(f.clock.Now()) {
				return false
			}
		}
		// The gate's timer fires on a goroutine of its own: a moment that has come is not
		// yet dispatched while it is still armed.
		f.e.gate.mu.Lock()
		armed := f.e.gate.timerAt
		f.e.gate.mu.Unlock()
		return f.e.queue.Len() == 0 && len(answers) == inflight && !due(armed, f.clock.Now())
	}
	// Once refused, throttled is parked in the gate until it is sent again; on its way there
	// it waits in the queue's delay (on the fake clock too), which a millisecond hands on.
	parked := func() bool {
		f.mu.Lock()
		_, out := answers["throttled"]
		refused := len(throttledAt) == 1 && !out
		f.mu.Unlock()
		if !refused {
			return true
		}
		f.e.mu.Lock()
		defer f.e.mu.Unlock()
		for _, st := range f.e.waiters {
			if st.key.key == "ns/throttled" {
				return true
			}
		}
		return false
	}
	sent := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(throttledAt)
	}
	for step := 0; step < 5000 && sent() < 2; step++ {
		until(t, "every request out to wait for its answer", quiet)
		if !parked() {
			f.clock.Step(time.Millisecond)
			continue
		}
		f.clock.Step(100 * time.Millisecond)
	}
	until(t, "throttled sent again", func() bool { return sent() >= 2 })
	f.mu.Lock()
	defer f.mu.Unlock()
	again := throttledAt[1]
	t.Logf("throttled first sent at T+%s (refused 1 s later), sent again at T+%s", throttledAt[0].Sub(t0), again.Sub(t0))
	if want := t0.Add(29500 * time.Millisecond); again.After(want.Add(100*time.Millisecond)) || again.Before(want.Add(-time.Second)) {
		t.Errorf("throttled sent again at T+%s, want at its last chance with the margin of the moment, T+%s", again.Sub(t0), want.Sub(t0))
	}
}

// TestEvictOutsideThePlanFitsTheWindow: a request asked for outside the interruption's plan
// (the pressure loop's Evict and Delete) while a window is pending gets the grace the
// interruption's own would (sendGrace): it lands with the allowance and the server's queueing
// margin, and the kubelet's tail (plan.Tail) still ends before the window's end. The pressure
// loop used to cut it from now + RequestAllowance alone: a pod with a preStop hook could end 2 s
// past the window, and a slow server's queue cost any pod a second more.
func TestEvictOutsideThePlanFitsTheWindow(t *testing.T) {
	hooked := testPod("hooked", 60)
	hooked.Spec.Containers = []v1.Container{{Name: "c", Lifecycle: &v1.Lifecycle{
		PreStop: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"sleep", "60"}}}}}}
	plain := testPod("plain", 60)
	terminating := testPod("terminating", 60)
	terminating.DeletionTimestamp = &metav1.Time{Time: t0.Add(60 * time.Second)}
	v := view(t0.Add(40 * time.Second)) // the window ends at T+35
	ctx := context.Background()
	for _, c := range []struct {
		pod    *v1.Pod
		delete bool
		w      plan.Window
		want   int64 // E - (T + 0.25 s + 1.5 s + the tail), whole seconds
	}{
		{pod: hooked, w: v.Window, want: 30}, // the tail: the kubelet's reaction and the hook's 2 s
		{pod: plain, w: v.Window, want: 32},  // the kubelet's reaction
		{pod: terminating, delete: true, w: v.Window, want: 32},
		{pod: plain, w: plan.Window{}, want: 60}, // no deadline: the grace asked for
	} {
		// Each on an executor of its own: the first answer would replace the seeded margin.
		f := newFixture(t, hooked, plain, terminating)
		sent := map[string]int64{}
		f.evict = func(_ context.Context, ev *policyv1.Eviction) error {
			sent[ev.Name] = *ev.DeleteOptions.GracePeriodSeconds
			return nil
		}
		f.client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if g := a.(k8stesting.DeleteAction).GetDeleteOptions().GracePeriodSeconds; g != nil {
				sent[a.(k8stesting.DeleteAction).GetName()] = *g
			}
			return false, nil, nil
		})
		f.e.SetView(v)
		// The server took 1.5 s to answer the agent's first list: the margin until its own answers.
		f.e.Seed(1500 * time.Millisecond)
		var got time.Duration
		var err error
		if c.delete {
			got, err = f.e.Delete(ctx, c.pod, time.Minute, c.w)
		} else {
			got, err = f.e.Evict(ctx, c.pod, time.Minute, c.w)
		}
		if err != nil {
			t.Fatalf("%s: %v", c.pod.Name, err)
		}
		if got != time.Duration(c.want)*time.Second || sent[c.pod.Name] != c.want {
			t.Errorf("%s (deadline %t): returned %s and sent %d s, want %d s", c.pod.Name, c.w.HasDeadline(), got, sent[c.pod.Name], c.want)
		}
		if c.w.HasDeadline() {
			if end := t0.Add(plan.RequestAllowance + 1500*time.Millisecond + got + plan.Tail(c.pod)); end.After(c.w.End()) {
				t.Errorf("%s ends at T+%s, past the window's end T+%s", c.pod.Name, end.Sub(t0), c.w.End().Sub(t0))
			}
		}
	}
}
