package agent

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	k8srecord "k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/evict"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/providers/providertest"
)

// harness drives one agent without running its loops: each test calls the one-iteration
// functions (pollOnce, reconcile, syncPod) on a fake clock, so nothing sleeps.
type harness struct {
	t      *testing.T
	a      *Agent
	client *fake.Clientset
	clock  *clocktesting.FakeClock
	prov   *providertest.Fake
	events *k8srecord.FakeRecorder
	ctx    context.Context
	src    *scriptedSource
	cfg    config.Config
	// reg, when set before build, is the agent's metrics registry.
	reg *prometheus.Registry
	// evictFn, when set, receives the evictions instead of the fake clientset.
	evictFn func(context.Context, *policyv1.Eviction) error
}

const nodeName = "n1"

func newHarness(t *testing.T, mutate func(*config.Config), objs ...runtime.Object) *harness {
	t.Helper()
	cfg := config.DefaultConfig()
	cfg.NodeName = nodeName
	cfg.Provider = "aws"
	cfg.MetricsBindAddress = ""
	// The host's own kubelet config (graceful node shutdown, eviction thresholds) must not
	// reach unit tests.
	cfg.HostRoot = t.TempDir()
	// Unit tests never read the machine's own pressure; pressure tests turn it on with src.
	cfg.PressureSource = config.PressureSourceOff
	// The start-up dry-run write check would be one more node patch among those the tests
	// count; TestNodeWriteRefusals turns it on.
	cfg.NodeWriteRefusals = 0
	// The node conditions' status patch would be one more node write among those the tests
	// count, and the fake clientset applies no strategic merge patch of a subresource: they are
	// tested in agent/record and against the real API server (test/e2e/node_condition_test.go).
	cfg.NodeConditions = false
	if mutate != nil {
		mutate(&cfg)
	}
	if len(objs) == 0 || objs[0].(*v1.Node) == nil {
		t.Fatal("the first object must be the node")
	}
	client := fake.NewClientset(objs...)
	clk := clocktesting.NewFakeClock(t0)
	prov := providertest.New("aws")
	events := k8srecord.NewFakeRecorder(1000)
	src := &scriptedSource{}
	h := &harness{t: t, client: client, clock: clk, prov: prov, events: events, ctx: context.Background(), src: src, cfg: cfg}
	h.build(prov)
	return h
}

// build (re)creates the agent with provider p, on the harness's client, clock and recorder.
func (h *harness) build(p providers.Provider) {
	h.t.Helper()
	deps := Deps{Client: kubetest.Wrap(h.client), Provider: p, Clock: h.clock, Recorder: h.events, PressureSource: h.src,
		// The fake clientset serves EvictV1 through its reactors (postEviction needs a real
		// REST client).
		Evict: func(ctx context.Context, ev *policyv1.Eviction) error {
			if h.evictFn != nil {
				return h.evictFn(ctx, ev)
			}
			return h.client.CoreV1().Pods(ev.Namespace).EvictV1(ctx, ev)
		}}
	if h.reg != nil {
		deps.Registerer, deps.Gatherer = h.reg, h.reg
	}
	a, err := New(h.cfg, deps)
	if err != nil {
		h.t.Fatal(err)
	}
	h.a = a
	h.syncStores()
}

// reconcile is one reconcile and the node write it asks for, as the agent's loops do them.
func (h *harness) reconcile() {
	h.t.Helper()
	h.a.intr.Reconcile(h.ctx)
	if err := h.a.writer.Sync(h.ctx); err != nil {
		h.t.Logf("node write: %v", err)
	}
}

// syncStores copies the fake API's objects into the informers' stores, as the watches would.
func (h *harness) syncStores() {
	h.t.Helper()
	nodes := h.a.nodeInformer.GetIndexer()
	pods := h.a.podInformer.GetIndexer()
	n, err := h.client.CoreV1().Nodes().Get(h.ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := nodes.Replace([]any{n}, ""); err != nil {
		h.t.Fatal(err)
	}
	list, err := h.client.CoreV1().Pods("").List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	var objs []any
	for i := range list.Items {
		objs = append(objs, &list.Items[i])
	}
	if err := pods.Replace(objs, ""); err != nil {
		h.t.Fatal(err)
	}
}

// notice makes the provider report a spot notice with the given deadline, and runs one poll
// and reconcile.
func (h *harness) notice(deadline time.Time) {
	h.prov.Set(providers.Notice{Provider: "aws", Kind: providers.KindSpotInterruption, ID: "spot-1", Deadline: deadline, Action: "terminate"})
	h.step()
}

func (h *harness) step() {
	h.a.intr.PollOnce(h.ctx)
	h.reconcile()
	h.syncStores()
}

func (h *harness) node() *v1.Node {
	n, err := h.client.CoreV1().Nodes().Get(h.ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return n
}

// actions returns the recorded actions of verb on resource/subresource, clearing nothing.
func (h *harness) actions(verb, resource, sub string) []k8stesting.Action {
	var out []k8stesting.Action
	for _, a := range h.client.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == resource && a.GetSubresource() == sub {
			out = append(out, a)
		}
	}
	return out
}

func (h *harness) evictions() []*policyv1.Eviction {
	var out []*policyv1.Eviction
	for _, a := range h.actions("create", "pods", "eviction") {
		out = append(out, a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction))
	}
	return out
}

func (h *harness) deletes() []k8stesting.DeleteActionImpl {
	var out []k8stesting.DeleteActionImpl
	for _, a := range h.actions("delete", "pods", "") {
		out = append(out, a.(k8stesting.DeleteActionImpl))
	}
	return out
}

// drainEvents returns the events recorded since the last call, as "Type Reason message".
func (h *harness) drainEvents() []string {
	var out []string
	for {
		select {
		case e := <-h.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func hasEvent(events []string, prefix string) bool {
	for _, e := range events {
		if strings.HasPrefix(e, prefix) {
			return true
		}
	}
	return false
}

func testNode(taints ...v1.Taint) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"keep": "label"}},
		Spec: v1.NodeSpec{Taints: taints}}
}

func testPod(name string, grace int64, tolerations ...v1.Toleration) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec:       v1.PodSpec{NodeName: nodeName, TerminationGracePeriodSeconds: &grace, Tolerations: tolerations},
		Status:     v1.PodStatus{Phase: v1.PodRunning},
	}
}

func spotToleration(s *int64) v1.Toleration {
	return v1.Toleration{Key: "cloud", Operator: v1.TolerationOpEqual, Value: "spot", Effect: v1.TaintEffectNoExecute, TolerationSeconds: s}
}

func TestReconcileTaintsThenUndoes(t *testing.T) {
	other := v1.Taint{Key: "dedicated", Value: "x", Effect: v1.TaintEffectNoSchedule}
	// The NoExecute mode, explicitly (the default is --interruption-eviction=reprieve).
	h := newHarness(t, func(c *config.Config) { c.InterruptionEviction = string(plan.EvictionKubeControllerManager) }, testNode(other))
	h.clock.SetTime(t0.Add(300 * time.Millisecond))
	h.notice(t0.Add(2 * time.Minute))

	n := h.node()
	if len(n.Spec.Taints) != 2 || n.Spec.Taints[0] != other {
		t.Fatalf("taints = %+v", n.Spec.Taints)
	}
	spot := n.Spec.Taints[1]
	if spot.Key != "cloud" || spot.Effect != v1.TaintEffectNoExecute || spot.TimeAdded == nil || !spot.TimeAdded.Time.Equal(t0) {
		t.Fatalf("interruption taint = %+v, want timeAdded %v (truncated to the second)", spot, t0)
	}
	if n.Annotations[record.AnnotationReclaimDeadline] != "2026-11-29T12:02:00Z" || n.Labels[record.LabelExcludeFromLB] != "true" {
		t.Fatalf("annotations %v labels %v", n.Annotations, n.Labels)
	}
	// Idempotent: another poll with the same notice writes nothing.
	patches := len(h.actions("patch", "nodes", ""))
	h.clock.Step(time.Second)
	h.step()
	if got := len(h.actions("patch", "nodes", "")); got != patches {
		t.Errorf("a repeated notice patched the node again (%d patches, was %d)", got, patches)
	}

	h.prov.Set()
	h.step()
	n = h.node()
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0] != other {
		t.Errorf("after the notice went away, taints = %+v", n.Spec.Taints)
	}
	if _, ok := n.Labels[record.LabelExcludeFromLB]; ok || n.Labels["keep"] != "label" {
		t.Errorf("labels = %v", n.Labels)
	}
	if len(n.Annotations) != 0 {
		t.Errorf("annotations left: %v", n.Annotations)
	}
}

func TestPollErrorKeepsState(t *testing.T) {
	h := newHarness(t, nil, testNode())
	h.notice(t0.Add(time.Minute))
	h.build(failing{})
	h.step()
	if v := h.a.exec.View(); !v.Window.Deadline.Equal(t0.Add(time.Minute)) {
		t.Fatalf("a failed poll lost the deadline: %v", v.Window.Deadline)
	}
	if len(h.node().Spec.Taints) != 1 {
		t.Fatalf("a failed poll removed the taint: %+v", h.node().Spec.Taints)
	}
}

// switchable is a provider whose behaviour a test changes while the agent keeps its state.
type switchable struct {
	mu sync.Mutex
	p  providers.Provider
}

func (s *switchable) set(p providers.Provider) { s.mu.Lock(); s.p = p; s.mu.Unlock() }
func (s *switchable) Name() string             { return "aws" }
func (s *switchable) Poll(ctx context.Context) ([]providers.Notice, error) {
	s.mu.Lock()
	p := s.p
	s.mu.Unlock()
	return p.Poll(ctx)
}

type failing struct{}

func (failing) Name() string { return "aws" }
func (failing) Poll(context.Context) ([]providers.Notice, error) {
	return nil, errors.New("metadata service down")
}

func TestEvictionSchedule(t *testing.T) {
	deadline := t0.Add(60 * time.Second) // window end t0+55s with the 5s margin
	h := newHarness(t, nil, testNode(),
		testPod("now", 10),
		testPod("tol20", 5, spotToleration(secs(20))),
		testPod("tol600", 10, spotToleration(secs(600))),
		testPod("forever", 10, spotToleration(nil)),
		testPod("slow", 300),
	)
	h.notice(deadline)

	if d := h.a.exec.SyncPod(h.ctx, "ns/now"); d != 0 {
		t.Errorf("untolerated pod: requeue %v, want evicted now", d)
	}
	if d := h.a.exec.SyncPod(h.ctx, "ns/tol20"); d != 20*time.Second {
		t.Errorf("tolerating 20s: requeue %v, want 20s", d)
	}
	// It waits in two steps: until RemeasureLead before its send, to measure the queueing
	// margin again, then (the margin still 0) until latest less the lead. Its latest is 44 s:
	// the window's end less its grace and the kubelet's reaction.
	latest := 45*time.Second - plan.KubeletReaction
	if d := h.a.exec.SyncPod(h.ctx, "ns/tol600"); d != latest-plan.EvictionLead-evict.RemeasureLead {
		t.Errorf("tolerating 600s with grace 10: requeue %v, want latest (%v) less the lead and RemeasureLead", d, latest)
	}
	h.clock.SetTime(t0.Add(latest - plan.EvictionLead - evict.RemeasureLead))
	if d := h.a.exec.SyncPod(h.ctx, "ns/tol600"); d != evict.RemeasureLead {
		t.Errorf("tolerating 600s with grace 10, remeasured: requeue %v, want the rest (%v) to latest (%v) less the lead", d, evict.RemeasureLead, latest)
	}
	h.clock.SetTime(t0)
	if d := h.a.exec.SyncPod(h.ctx, "ns/forever"); d != 0 {
		t.Errorf("forever: requeue %v", d)
	}
	if d := h.a.exec.SyncPod(h.ctx, "ns/slow"); d != 0 {
		t.Errorf("slow: requeue %v", d)
	}
	evs := h.evictions()
	// slow: 55 s are left at t0, less the 250 ms allowed for the request and the kubelet's 1 s
	// reaction, rounded down.
	want := map[string]int64{"now": 10, "slow": 53}
	if len(evs) != len(want) {
		t.Fatalf("evictions = %d, want %d", len(evs), len(want))
	}
	for _, ev := range evs {
		if g := *ev.DeleteOptions.GracePeriodSeconds; g != want[ev.Name] {
			t.Errorf("%s: grace %d, want %d", ev.Name, g, want[ev.Name])
		}
		if uid := *ev.DeleteOptions.Preconditions.UID; string(uid) != "uid-"+ev.Name {
			t.Errorf("%s: UID precondition %q", ev.Name, uid)
		}
	}

	// The deadline-bound pod fires evictionLead before its latest start; even when the queue
	// wakes 20 ms late it keeps its whole 10 s grace.
	h.clock.SetTime(t0.Add(latest - plan.EvictionLead + 20*time.Millisecond))
	if d := h.a.exec.SyncPod(h.ctx, "ns/tol600"); d != 0 {
		t.Fatalf("tol600 not evicted at its time: requeue %v", d)
	}
	if evs := h.evictions(); *evs[len(evs)-1].DeleteOptions.GracePeriodSeconds != 10 {
		t.Errorf("tol600: grace %d, want its full 10", *evs[len(evs)-1].DeleteOptions.GracePeriodSeconds)
	}
	h.clock.SetTime(t0.Add(20 * time.Second))
	if d := h.a.exec.SyncPod(h.ctx, "ns/tol20"); d != 0 || len(h.evictions()) != 4 {
		t.Errorf("tolerating 20s: not evicted at its time (requeue %v, %d evictions)", d, len(h.evictions()))
	}
	// An evicted pod is never evicted twice, even before its deletionTimestamp shows up.
	if h.a.exec.SyncPod(h.ctx, "ns/now"); len(h.evictions()) != 4 {
		t.Errorf("a pod was evicted twice")
	}
}

func TestPDBBlockedEvictionFallsBackToDeleteAtLatest(t *testing.T) {
	deadline := t0.Add(60 * time.Second)
	h := newHarness(t, nil, testNode(), testPod("pdb", 5))
	h.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		return true, nil, pdbRefusal()
	})
	h.notice(deadline)
	forceAt := deadline.Add(-5*time.Second - 5*time.Second - plan.KubeletReaction - plan.EvictionLead)

	var delays []time.Duration
	for i := 0; i < 200 && len(h.deletes()) == 0; i++ {
		d := h.a.exec.SyncPod(h.ctx, "ns/pdb")
		if d == 0 {
			break
		}
		delays = append(delays, d)
		h.clock.Step(d)
	}
	if len(delays) < 4 || delays[0] != 100*time.Millisecond || delays[1] != 200*time.Millisecond || delays[2] != 400*time.Millisecond {
		t.Errorf("backoff = %v, want 100ms doubling", delays)
	}
	for _, d := range delays {
		if d > evict.EvictionBackoffMax {
			t.Errorf("backoff %v over the cap", d)
		}
	}
	dels := h.deletes()
	if len(dels) != 1 {
		t.Fatalf("deletes = %d, want 1", len(dels))
	}
	if now := h.clock.Now(); now.Before(forceAt) || now.After(forceAt.Add(time.Millisecond)) {
		t.Errorf("deleted at %v, want at %v (latest less the lead)", now, forceAt)
	}
	opts := dels[0].DeleteOptions
	if *opts.GracePeriodSeconds != 5 || string(*opts.Preconditions.UID) != "uid-pdb" {
		t.Errorf("delete options = grace %d uid %s", *opts.GracePeriodSeconds, *opts.Preconditions.UID)
	}
}

// TestFailingForcedDeleteBacksOff: past the latest eviction time with the API server refusing
// connections, the delete is retried 100 ms doubling to 500 ms, not ten times a second for the
// whole outage, and each retry asks for the grace that is left.
func TestFailingForcedDeleteBacksOff(t *testing.T) {
	deadline := t0.Add(60 * time.Second)
	h := newHarness(t, nil, testNode(), testPod("p", 5))
	h.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return a.GetSubresource() == "eviction", nil, errors.New("connection refused")
	})
	h.client.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	h.notice(deadline)
	forceAt := deadline.Add(-5*time.Second - 5*time.Second - plan.KubeletReaction - plan.EvictionLead)
	for i := 0; i < 200 && h.clock.Now().Before(forceAt); i++ {
		h.clock.Step(h.a.exec.SyncPod(h.ctx, "ns/p"))
	}
	var delays []time.Duration
	for range 6 {
		d := h.a.exec.SyncPod(h.ctx, "ns/p")
		delays = append(delays, d)
		h.clock.Step(d)
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond}
	if !slices.Equal(delays, want) {
		t.Errorf("delete retries after %v, want %v", delays, want)
	}
	dels := h.deletes()
	if len(dels) != 6 {
		t.Fatalf("deletes = %d, want 6", len(dels))
	}
	if first, last := *dels[0].DeleteOptions.GracePeriodSeconds, *dels[5].DeleteOptions.GracePeriodSeconds; last >= first {
		t.Errorf("grace %ds on the first delete, %ds on the sixth: want the grace that is left, shrinking", first, last)
	}
}

func TestWithoutDeadlinePDBsAreAlwaysRespected(t *testing.T) {
	// A NoExecute taint of someone else, no notice: evictions retry, never fall back to DELETE.
	added := metav1.NewTime(t0)
	h := newHarness(t, nil, testNode(v1.Taint{Key: "other", Effect: v1.TaintEffectNoExecute, TimeAdded: &added}), testPod("pdb", 5))
	h.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return a.GetSubresource() == "eviction", nil, pdbRefusal()
	})
	h.step()
	for range 50 {
		d := h.a.exec.SyncPod(h.ctx, "ns/pdb")
		if d == 0 {
			t.Fatal("gave up retrying")
		}
		h.clock.Step(d)
	}
	if len(h.deletes()) != 0 {
		t.Fatal("deleted a PDB-protected pod without a deadline")
	}
}

func TestTerminatingPodIsShortenedOnce(t *testing.T) {
	p := testPod("kcm-deleted", 300)
	p.DeletionTimestamp = &metav1.Time{Time: t0.Add(300 * time.Second)}
	h := newHarness(t, nil, testNode(), p)
	h.notice(t0.Add(60 * time.Second))
	h.a.exec.SyncPod(h.ctx, "ns/kcm-deleted")
	h.a.exec.SyncPod(h.ctx, "ns/kcm-deleted")
	dels := h.deletes()
	if len(dels) != 1 {
		t.Fatalf("deletes = %d, want exactly 1", len(dels))
	}
	if g := *dels[0].DeleteOptions.GracePeriodSeconds; g != 53 {
		t.Errorf("shortened grace = %d, want 53 (deadline - margin - now - the request's allowance - the kubelet's reaction, rounded down)", g)
	}
	if len(h.evictions()) != 0 {
		t.Error("a terminating pod must not be evicted")
	}
}

func TestRestartReplansFromTimeAdded(t *testing.T) {
	// A previous run tainted the node 20 s ago; the new agent must not restart the countdown.
	added := metav1.NewTime(t0.Add(-20 * time.Second))
	h := newHarness(t, nil, testNode(v1.Taint{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute, TimeAdded: &added}),
		testPod("tol30", 5, spotToleration(secs(30))))
	h.notice(t0.Add(2 * time.Minute))
	if d := h.a.exec.SyncPod(h.ctx, "ns/tol30"); d != 10*time.Second {
		t.Errorf("requeue %v, want 10s (30s from the existing timeAdded)", d)
	}
	if ta := h.node().Spec.Taints[0].TimeAdded; !ta.Equal(&added) {
		t.Errorf("timeAdded rewritten to %v", ta)
	}
}

func TestTaintWithoutTimeAddedIsAnchoredWhenFirstSeen(t *testing.T) {
	h := newHarness(t, nil, testNode(v1.Taint{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute}),
		testPod("tol30", 5, spotToleration(secs(30))))
	h.step()
	h.clock.Step(10 * time.Second)
	h.step()
	if d := h.a.exec.SyncPod(h.ctx, "ns/tol30"); d != 20*time.Second {
		t.Errorf("requeue %v, want 20s: the countdown runs from when the taint was first seen", d)
	}
}

func TestDryRunChangesNothing(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.DryRun = true }, testNode(), testPod("now", 10))
	h.notice(t0.Add(time.Minute))
	h.a.exec.SyncPod(h.ctx, "ns/now")
	for _, a := range h.client.Actions() {
		if a.GetVerb() != "get" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			t.Errorf("dry run wrote: %s %s/%s", a.GetVerb(), a.GetResource().Resource, a.GetSubresource())
		}
	}
	// It still plans as if the taint were there.
	if v := h.a.exec.View(); len(v.Taints) != 1 || !v.Window.HasDeadline() {
		t.Errorf("dry-run view = %+v", v)
	}
}

func TestNewPodOfTheSameNameStartsAfresh(t *testing.T) {
	h := newHarness(t, nil, testNode(), testPod("p", 5))
	h.notice(t0.Add(time.Minute))
	h.a.exec.SyncPod(h.ctx, "ns/p")
	if len(h.evictions()) != 1 {
		t.Fatal("not evicted")
	}
	// Same name, new UID: the old pod's "done" must not leak onto it.
	np := testPod("p", 5)
	np.UID = "uid-new"
	if err := h.a.podInformer.GetIndexer().Update(np); err != nil {
		t.Fatal(err)
	}
	h.a.exec.SyncPod(h.ctx, "ns/p")
	evs := h.evictions()
	if len(evs) != 2 || *evs[1].DeleteOptions.Preconditions.UID != "uid-new" {
		t.Fatalf("the new pod was not evicted with its own UID: %d evictions", len(evs))
	}
}

func TestNodeWriteRetriesOnConflict(t *testing.T) {
	h := newHarness(t, nil, testNode())
	conflicts := 0
	h.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts < 2 {
			conflicts++
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, nodeName, errors.New("the object has been modified"))
		}
		return false, nil, nil
	})
	before := len(h.client.Actions())
	h.prov.Set(providers.Notice{Provider: "aws", Kind: providers.KindSpotInterruption, ID: "spot-1", Deadline: t0.Add(time.Minute)})
	h.a.intr.PollOnce(h.ctx)
	h.reconcile()
	var verbs []string
	for _, a := range h.client.Actions()[before:] {
		verbs = append(verbs, a.GetVerb())
	}
	// The first attempt uses the informer's copy; after each conflict the writer re-reads the
	// node from the API rather than retrying on the stale copy.
	if got, want := strings.Join(verbs, ","), "patch,get,patch,get,patch"; got != want {
		t.Errorf("requests = %s, want %s", got, want)
	}
	h.syncStores()
	if conflicts != 2 {
		t.Fatalf("conflicts = %d, want 2", conflicts)
	}
	if len(h.actions("patch", "nodes", "")) != 3 {
		t.Errorf("patches = %d, want 3 (two conflicts, then success)", len(h.actions("patch", "nodes", "")))
	}
	if !record.HasTaint(h.node().Spec.Taints, h.a.taints.Interruption) {
		t.Error("taint not written after the conflicts")
	}
}

// TestStaleCacheDoesNotRepatch: after an API server outage the node informer's watch backs off
// and its copy lags the agent's own write; the writer must not patch again at every poll (each
// such patch would fail its resourceVersion precondition and cost a GET).
func TestStaleCacheDoesNotRepatch(t *testing.T) {
	node := testNode()
	node.ResourceVersion = "10"
	h := newHarness(t, nil, node)
	h.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		// The fake tracker keeps no resourceVersions: give the written node a new one.
		n, err := h.client.Tracker().Get(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, "", nodeName)
		if err != nil {
			return true, nil, err
		}
		out := n.(*v1.Node).DeepCopy()
		var patch v1.Node
		if err := json.Unmarshal(a.(k8stesting.PatchAction).GetPatch(), &patch); err != nil {
			return true, nil, err
		}
		out.Spec.Taints, out.ResourceVersion = patch.Spec.Taints, "11"
		maps.Copy(out.Labels, patch.Labels)
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		maps.Copy(out.Annotations, patch.Annotations)
		return true, out, h.client.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, out, "")
	})
	h.prov.Set(providers.Notice{Provider: "aws", Kind: providers.KindSpotInterruption, ID: "spot-1", Deadline: t0.Add(time.Minute)})
	h.a.intr.PollOnce(h.ctx)
	gets := len(h.actions("get", "nodes", ""))
	for range 3 {
		h.reconcile() // the informer's copy stays at resourceVersion 10
		h.clock.Step(time.Second)
	}
	if n := len(h.actions("patch", "nodes", "")); n != 1 {
		t.Errorf("patches = %d while the cache lagged the agent's own write, want 1", n)
	}
	if n := len(h.actions("get", "nodes", "")) - gets; n != 0 {
		t.Errorf("GETs = %d, want 0", n)
	}
	// Once the cache moves on (here: someone removed the taint), it is the truth again.
	other := h.node().DeepCopy()
	other.Spec.Taints, other.ResourceVersion = nil, "12"
	if err := h.client.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, other, ""); err != nil {
		t.Fatal(err)
	}
	h.syncStores()
	h.reconcile()
	if n := len(h.actions("patch", "nodes", "")); n != 2 {
		t.Errorf("patches = %d after the cache caught up without the taint, want 2 (the taint restored)", n)
	}
}

// watchingProvider pushes notices through Watch, as GCP's hanging GETs do, and records
// approvals, as Azure's StartRequests does.
type watchingProvider struct {
	*providertest.Fake
	push     chan []providers.Notice
	approved chan providers.Notice
}

func (w *watchingProvider) Watch(ctx context.Context, update func([]providers.Notice, error)) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ns := <-w.push:
			update(ns, nil)
		}
	}
}

func (w *watchingProvider) Approve(_ context.Context, n providers.Notice) error {
	w.approved <- n
	return nil
}

func TestWatchingProviderReachesTheNodeWithoutATick(t *testing.T) {
	h := newHarness(t, nil, testNode())
	wp := &watchingProvider{Fake: h.prov, push: make(chan []providers.Notice), approved: make(chan providers.Notice, 1)}
	h.build(wp)
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	done := make(chan struct{})
	go func() { h.a.intr.Run(ctx); close(done) }()
	go h.a.writer.Run(ctx)
	w, err := h.client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wp.push <- []providers.Notice{{Provider: "gcp", Kind: providers.KindPreemption, ID: "p", Deadline: t0.Add(30 * time.Second)}}
	// The update wakes the reconcile at once, and the writer writes: no clock step is needed.
	timeout := time.After(10 * time.Second)
	for tainted := false; !tainted; {
		select {
		case ev := <-w.ResultChan():
			if n, ok := ev.Object.(*v1.Node); ok && record.HasTaint(n.Spec.Taints, h.a.taints.Interruption) {
				tainted = true
			}
		case <-timeout:
			t.Fatal("no taint after the watched notice without a clock step")
		}
	}
	w.Stop()
	cancel()
	<-done
}

func TestApproveOnceDrained(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.ApproveEvents = true }, testNode(), testPod("p", 5))
	wp := &watchingProvider{Fake: h.prov, approved: make(chan providers.Notice, 1)}
	h.build(wp)
	h.prov.Set(providers.Notice{Provider: "azure", Kind: providers.KindPreemption, ID: "evt-1", Deadline: t0.Add(time.Minute)})
	h.step()
	h.a.intr.ApproveOnce(h.ctx)
	if len(wp.approved) != 0 {
		t.Fatal("approved while a pod is still to be evicted")
	}
	h.a.exec.SyncPod(h.ctx, "ns/p")
	if err := h.client.CoreV1().Pods("ns").Delete(h.ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.syncStores()
	h.a.intr.ApproveOnce(h.ctx)
	h.a.intr.ApproveOnce(h.ctx)
	if len(wp.approved) != 1 {
		t.Fatalf("approvals = %d, want exactly 1", len(wp.approved))
	}
	if n := <-wp.approved; n.ID != "evt-1" {
		t.Errorf("approved %q", n.ID)
	}
	if !hasEvent(h.drainEvents(), "Normal EventApproved") {
		t.Error("no EventApproved event")
	}
}

func TestNoApprovalUnlessEnabled(t *testing.T) {
	h := newHarness(t, nil, testNode())
	wp := &watchingProvider{Fake: h.prov, approved: make(chan providers.Notice, 1)}
	h.build(wp)
	h.prov.Set(providers.Notice{Provider: "azure", Kind: providers.KindPreemption, ID: "evt-1", Deadline: t0.Add(time.Minute)})
	h.step()
	h.a.intr.ApproveOnce(h.ctx)
	if len(wp.approved) != 0 {
		t.Fatal("approved without --azure-approve-events")
	}
}

// pdbRefusal is the API server's answer to an eviction that a PodDisruptionBudget forbids.
func pdbRefusal() error {
	err := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{
		Type: policyv1.DisruptionBudgetCause, Message: "The disruption budget pdb needs 1 healthy pods and has 1 currently"})
	return err
}
