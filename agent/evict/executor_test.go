package evict

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prometheus/client_golang/prometheus"

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
	f.e = New(Options{Client: f.client, Pods: corelisters.NewPodLister(f.store), Clock: f.clock, Metrics: m, Recorder: f.events,
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
