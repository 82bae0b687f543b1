package agent

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/evict"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/agent/whatif"
	"github.com/reprieve-dev/reprieve/providers"
)

// Tests for issue 12: the deadline promise under adversity. Each one failed on the code before
// its fix.

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
	sw := &switchable{p: failing{}}
	h.build(sw)
	h.step()

	after := h.node()
	if len(after.Spec.Taints) != 1 || !after.Spec.Taints[0].TimeAdded.Equal(spot.TimeAdded) {
		t.Fatalf("taints after a restart during an outage = %+v, want %+v unchanged", after.Spec.Taints, spot)
	}
	if after.Annotations[record.AnnotationReclaimDeadline] != before.Annotations[record.AnnotationReclaimDeadline] || after.Labels[record.LabelExcludeFromLB] != "true" {
		t.Fatalf("annotations %v labels %v after the restart", after.Annotations, after.Labels)
	}
	if v := h.a.exec.View(); !v.Window.Deadline.Equal(deadline) {
		t.Fatalf("restarted agent plans with deadline %v, want %v from the annotation", v.Window.Deadline, deadline)
	}
	if d := h.a.exec.SyncPod(h.ctx, "ns/tol10"); d != 5*time.Second {
		t.Errorf("tolerating 10s: requeue %v, want 5s (counting from the original timeAdded)", d)
	}

	// The service answers again with the same notice: nothing is rewritten.
	sw.set(h.prov)
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
	if n := h.node(); len(n.Spec.Taints) != 0 || n.Annotations[record.AnnotationReclaimDeadline] != "" {
		t.Errorf("the notice's withdrawal left %+v %v", n.Spec.Taints, n.Annotations)
	}
}

func providerNotice(id string, deadline time.Time) providers.Notice {
	return providers.Notice{Provider: "aws", Kind: providers.KindSpotInterruption, ID: id, Deadline: deadline, Action: "terminate"}
}

// TestTerminatingForeverToleratingPodIsShortened (item 1): a pod deleted with a 600 s grace two
// seconds after a 40 s notice, tolerating the interruption taint forever, is leaving: its
// tolerations no longer keep it, and its grace is cut to end by the window's end.
func TestTerminatingForeverToleratingPodIsShortened(t *testing.T) {
	p := testPod("leaving", 600, spotToleration(nil))
	p.DeletionTimestamp = &metav1.Time{Time: t0.Add(602 * time.Second)}
	h := newHarness(t, nil, testNode(), p)
	h.notice(t0.Add(40 * time.Second))
	h.clock.SetTime(t0.Add(2 * time.Second))
	h.a.exec.SyncPod(h.ctx, "ns/leaving")
	dels := h.deletes()
	if len(dels) != 1 {
		t.Fatalf("deletes = %d, want 1: a terminating pod tolerating forever must be shortened", len(dels))
	}
	// The window ends at t0+35s; sent at t0+2s with the 250 ms allowance and the kubelet's 1 s
	// reaction: 31 s.
	if g := *dels[0].DeleteOptions.GracePeriodSeconds; g != 31 {
		t.Errorf("grace = %d, want 31", g)
	}
	if uid := *dels[0].DeleteOptions.Preconditions.UID; uid != "uid-leaving" {
		t.Errorf("UID precondition %q", uid)
	}
	// Without a deadline it is left alone, as upstream leaves it.
	h.prov.Set()
	h.step()
	h.a.exec.SyncPod(h.ctx, "ns/leaving")
	if len(h.deletes()) != 1 {
		t.Error("shortened a terminating pod without a deadline")
	}
}

// TestForcedDeleteAfterSlowFailedEvictionUsesTheGraceLeft (item 3): an eviction that hangs 4 s
// and fails must not be followed by a DELETE with the grace computed before it: the grace is
// computed from the clock when each request leaves.
func TestForcedDeleteAfterSlowFailedEvictionUsesTheGraceLeft(t *testing.T) {
	deadline := t0.Add(40 * time.Second) // window end t0+35s
	h := newHarness(t, nil, testNode(), testPod("p", 30))
	h.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		h.clock.Step(4 * time.Second)
		return true, nil, apierrors.NewInternalError(errors.New("etcd timeout"))
	})
	h.notice(deadline)
	forceAt := deadline.Add(-5*time.Second - 30*time.Second - plan.KubeletReaction - plan.EvictionLead)
	h.clock.SetTime(forceAt)
	for i := 0; i < 5 && len(h.deletes()) == 0; i++ {
		h.clock.Step(h.a.exec.SyncPod(h.ctx, "ns/p"))
	}
	dels := h.deletes()
	if len(dels) != 1 {
		t.Fatalf("deletes = %d, want 1", len(dels))
	}
	// The delete leaves at forceAt + 4 s = t0+7.5s: 35 - 7.75 less the kubelet's 1 s reaction =
	// 26.25, so 26 s.
	if g := *dels[0].DeleteOptions.GracePeriodSeconds; g != 26 {
		t.Errorf("forced delete grace = %d s, want 26 (the pod would end %d s past the window)", g, g-26)
	}
}

// TestNewNoticeStartsEvictionStateAfresh (item 4): a PodDisruptionBudget refused the pod during
// a notice that was then withdrawn; the next notice goes through the Eviction API (which the
// budget now allows) and announces the eviction, rather than deleting at once on the old
// attempts.
func TestNewNoticeStartsEvictionStateAfresh(t *testing.T) {
	h := newHarness(t, nil, testNode(), testPod("p", 5, spotToleration(secs(2))))
	refuse := true
	h.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return a.GetSubresource() == "eviction" && refuse, nil, pdbRefusal()
	})
	h.notice(t0.Add(20 * time.Second))
	for h.clock.Now().Before(t0.Add(5 * time.Second)) {
		d := h.a.exec.SyncPod(h.ctx, "ns/p")
		if d == 0 {
			t.Fatal("gave up")
		}
		h.clock.Step(d)
	}
	if len(h.evictions()) < 2 || len(h.deletes()) != 0 {
		t.Fatalf("evictions %d deletes %d during the first notice", len(h.evictions()), len(h.deletes()))
	}
	h.prov.Set()
	h.step()
	h.drainEvents()

	refuse = false
	h.clock.SetTime(t0.Add(6 * time.Second))
	h.prov.Set(providerNotice("spot-2", t0.Add(18*time.Second))) // window end t0+13s, latest t0+8s
	h.step()
	if d := h.a.exec.SyncPod(h.ctx, "ns/p"); d <= 0 || d > 2*time.Second {
		t.Fatalf("requeue %v, want the 2 s toleration of the new taint", d)
	}
	if !hasEvent(h.drainEvents(), "Normal EvictionScheduled") {
		t.Error("the new notice's eviction was not announced")
	}
	h.clock.SetTime(t0.Add(8*time.Second - plan.EvictionLead))
	h.a.exec.SyncPod(h.ctx, "ns/p")
	if len(h.deletes()) != 0 {
		t.Fatal("deleted at once on the withdrawn notice's attempts")
	}
	if evs := h.evictions(); len(evs) < 3 {
		t.Errorf("evictions = %d: the new notice did not go through the Eviction API", len(evs))
	}
}

// TestBackoffBeforeADeadlineDoesNotOutlastIt (item 4): a budget refused an eviction for a
// NoExecute taint of someone else until the backoff reached 10 s; a notice then arrives whose
// deadline leaves 2 s before the forced delete. The next request must come at once, not after
// the old backoff.
func TestBackoffBeforeADeadlineDoesNotOutlastIt(t *testing.T) {
	added := metav1.NewTime(t0)
	h := newHarness(t, nil, testNode(v1.Taint{Key: "other", Effect: v1.TaintEffectNoExecute, TimeAdded: &added}), testPod("p", 5))
	h.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return a.GetSubresource() == "eviction", nil, pdbRefusal()
	})
	h.step()
	var d time.Duration
	for d < evict.EvictionBackoffMax {
		d = h.a.exec.SyncPod(h.ctx, "ns/p")
		h.clock.Step(time.Millisecond) // part-way through the backoff
	}
	now := h.clock.Now()
	h.notice(now.Add(5*time.Second + 5*time.Second + 2*time.Second)) // forced delete in about 2 s
	before := len(h.evictions())
	d = h.a.exec.SyncPod(h.ctx, "ns/p")
	if len(h.evictions()) != before+1 {
		t.Errorf("no eviction request when the notice came (next in %v)", d)
	}
	if d > 2*time.Second {
		t.Errorf("next look in %v, past the forced delete", d)
	}
}

// TestHugeSecondsDoNotOverflow (item 5): tolerationSeconds above ~9.2e9 overflowed
// time.Duration and evicted at once where upstream never evicts; a huge
// terminationGracePeriodSeconds wrapped to a zero grace, and its last safe moment, less the
// kubelet's tail, wrapped to centuries after the deadline (every pod's tail counts the
// kubelet's reaction; a preStop hook's counts 2 s more).
func TestHugeSecondsDoNotOverflow(t *testing.T) {
	spot := []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoExecute, t0)}
	for _, s := range []int64{9_300_000_000, 1 << 62, math.MaxInt64} {
		p := pod(spotToleration(secs(s)))
		if pl := plan.PlanPod(p, spot, plan.Window{}, plan.PodFilter{}, false); pl.Skip != plan.SkipTolerateForever {
			t.Errorf("tolerationSeconds %d: plan %+v, want tolerates-forever", s, pl)
		}
	}
	for _, s := range []int64{9_300_000_000, math.MaxInt64} {
		g := plan.PodGrace(withGrace(pod(), s))
		if g < 100*365*24*time.Hour {
			t.Errorf("terminationGracePeriodSeconds %d: grace %v, want effectively unbounded", s, g)
		}
		w := plan.Window{Deadline: t0.Add(time.Minute), SafetyMargin: 5 * time.Second}
		if got := plan.GraceAt(g, w, t0); got != 55*time.Second {
			t.Errorf("terminationGracePeriodSeconds %d: grace in a window %v, want 55s", s, got)
		}
		hooked := withGrace(pod(), s)
		hooked.Spec.Containers = []v1.Container{{Name: "app", Lifecycle: &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"sleep", "5"}}}}}}
		for _, p := range []*v1.Pod{withGrace(pod(), s), hooked} {
			pl := plan.PlanPod(p, spot, w, plan.PodFilter{}, false)
			if !pl.ByDeadline || pl.EvictAt.After(t0) {
				t.Errorf("terminationGracePeriodSeconds %d, tail %v: plan %+v, want evicted at once by the deadline", s, pl.Tail, pl)
			}
		}
	}
}

// TestFutureTimeAddedIsAnchoredWhenFirstSeen (item 5): a NoExecute taint of someone else whose
// timeAdded lies in the future (a writer with a fast clock) must not delay an untolerated pod:
// upstream evicts it at once. The anchor is min(timeAdded, first seen).
func TestFutureTimeAddedIsAnchoredWhenFirstSeen(t *testing.T) {
	future := metav1.NewTime(t0.Add(time.Minute))
	h := newHarness(t, nil, testNode(v1.Taint{Key: "other", Effect: v1.TaintEffectNoExecute, TimeAdded: &future}),
		testPod("p", 5), testPod("tol10", 5, v1.Toleration{Key: "other", Operator: v1.TolerationOpExists, TolerationSeconds: secs(10)}))
	h.step()
	if d := h.a.exec.SyncPod(h.ctx, "ns/p"); d != 0 || len(h.evictions()) != 1 {
		t.Errorf("untolerated pod: requeue %v, %d evictions; want evicted at once", d, len(h.evictions()))
	}
	h.clock.Step(3 * time.Second)
	h.step()
	if d := h.a.exec.SyncPod(h.ctx, "ns/tol10"); d != 7*time.Second {
		t.Errorf("tolerating 10s: requeue %v, want 7s (from when the taint was first seen)", d)
	}
}

// TestShorteningDoesNotFlapOnSkew (item 5): the API server sets deletionTimestamp from its own
// clock in whole seconds. With its clock 2 s ahead the shortened pod still seems to end after
// the window; reprieve must not shorten it again every second for nothing.
func TestShorteningDoesNotFlapOnSkew(t *testing.T) {
	p := testPod("kcm-deleted", 300)
	p.DeletionTimestamp = &metav1.Time{Time: t0.Add(300 * time.Second)}
	h := newHarness(t, nil, testNode(), p)
	h.notice(t0.Add(60 * time.Second))
	h.a.exec.SyncPod(h.ctx, "ns/kcm-deleted")
	if len(h.deletes()) != 1 {
		t.Fatalf("deletes = %d, want 1", len(h.deletes()))
	}
	// The server, 2 s ahead, answered with deletionTimestamp = its now + 54 s.
	skewed := p.DeepCopy()
	skewed.DeletionTimestamp = &metav1.Time{Time: t0.Add(56 * time.Second)}
	if err := h.a.podInformer.GetIndexer().Update(skewed); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		h.clock.Step(time.Second)
		h.a.exec.SyncPod(h.ctx, "ns/kcm-deleted")
	}
	if n := len(h.deletes()); n != 1 {
		t.Errorf("deletes = %d: shortened again for less than a second each time", n)
	}
	// A real move (the deadline comes 10 s earlier) shortens it again.
	h.prov.Set(providerNotice("spot-1", t0.Add(50*time.Second)))
	h.a.intr.PollOnce(h.ctx) // not h.step: the fake API removed the deleted pod at once
	h.reconcile()
	h.a.exec.SyncPod(h.ctx, "ns/kcm-deleted")
	if n := len(h.deletes()); n != 2 {
		t.Errorf("deletes = %d after the deadline moved 10 s earlier, want 2", n)
	}
}

// TestDisruptionTargetBeforeDeleting (item 8): the Eviction API adds DisruptionTarget=True; a
// plain DELETE does not, so a Job whose podFailurePolicy ignores disruptions would count a
// forced deletion as a failure. Before a forced DELETE and before shortening, reprieve patches
// the condition onto the pod's status, as the taint-eviction controller does.
func TestDisruptionTargetBeforeDeleting(t *testing.T) {
	leaving := testPod("leaving", 300)
	leaving.DeletionTimestamp = &metav1.Time{Time: t0.Add(300 * time.Second)}
	h := newHarness(t, nil, testNode(), testPod("pdb", 5), leaving)
	h.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return a.GetSubresource() == "eviction", nil, pdbRefusal()
	})
	var order []string
	h.client.PrependReactor("*", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() == "patch" || a.GetVerb() == "delete" {
			order = append(order, a.GetVerb()+" "+a.GetSubresource()+" "+a.(interface{ GetName() string }).GetName())
		}
		return false, nil, nil
	})
	h.notice(t0.Add(60 * time.Second))
	h.a.exec.SyncPod(h.ctx, "ns/leaving")
	for i := 0; i < 200 && len(h.deletes()) < 2; i++ {
		h.clock.Step(h.a.exec.SyncPod(h.ctx, "ns/pdb"))
	}
	want := []string{"patch status leaving", "delete  leaving", "patch status pdb", "delete  pdb"}
	if !slices.Equal(order, want) {
		t.Fatalf("requests = %q, want %q", order, want)
	}
	for _, a := range h.actions("patch", "pods", "status") {
		var patch v1.Pod
		if err := json.Unmarshal(a.(k8stesting.PatchAction).GetPatch(), &patch); err != nil {
			t.Fatal(err)
		}
		c := patch.Status.Conditions
		if len(c) != 1 || c[0].Type != v1.DisruptionTarget || c[0].Status != v1.ConditionTrue || c[0].Reason == "" || c[0].LastTransitionTime.IsZero() {
			t.Errorf("status patch conditions = %+v", c)
		}
	}
	// A dry run patches nothing.
	d := newHarness(t, func(c *config.Config) { c.DryRun = true }, testNode(), leaving)
	d.notice(t0.Add(60 * time.Second))
	d.a.exec.SyncPod(d.ctx, "ns/leaving")
	if n := len(d.actions("patch", "pods", "status")); n != 0 {
		t.Errorf("dry run patched %d pod statuses", n)
	}
}

// TestPDBRefusalsAndTheBlockedGauge (item 6): a 403 carrying the DisruptionBudget cause is a
// budget's refusal like a 429; the blocked-pods gauge drops when a blocked pod's plan becomes a
// skip (here: the NoExecute taint is removed).
func TestPDBRefusalsAndTheBlockedGauge(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("the disruption budget forbids it"))
	forbidden.ErrStatus.Details.Causes = append(forbidden.ErrStatus.Details.Causes, metav1.StatusCause{Type: policyv1.DisruptionBudgetCause})
	if !evict.IsPDBRefusal(forbidden) {
		t.Error("a 403 with the DisruptionBudget cause is not read as a budget's refusal")
	}
	if evict.IsPDBRefusal(apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("RBAC"))) {
		t.Error("a plain 403 read as a budget's refusal")
	}

	added := metav1.NewTime(t0)
	other := v1.Taint{Key: "other", Effect: v1.TaintEffectNoExecute, TimeAdded: &added}
	h := newHarness(t, nil, testNode(other), testPod("p", 5))
	h.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return a.GetSubresource() == "eviction", nil, forbidden
	})
	h.step()
	h.a.exec.SyncPod(h.ctx, "ns/p")
	if got := testutil.ToFloat64(h.a.metrics.BlockedPods); got != 1 {
		t.Fatalf("blocked pods = %v after a 403 DisruptionBudget refusal, want 1", got)
	}
	n := h.node()
	n.Spec.Taints = nil
	if _, err := h.client.CoreV1().Nodes().Update(h.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.syncStores()
	h.step()
	h.a.exec.SyncPod(h.ctx, "ns/p")
	if got := testutil.ToFloat64(h.a.metrics.BlockedPods); got != 0 {
		t.Errorf("blocked pods = %v once the pod's plan became a skip, want 0", got)
	}
}

// TestPlanPDBsEmptySelectorAndTwoBudgets (item 6): in policy/v1 an empty selector selects
// every pod of the namespace; a pod covered by two budgets is refused by the Eviction API
// (500) and is deleted at its latest time.
func TestPlanPDBsEmptySelectorAndTwoBudgets(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.NodeName = nodeName
	web := testPod("web", 10)
	web.Labels = map[string]string{"app": "web"}
	budget := func(name string, sel *metav1.LabelSelector, allowed int32) policyv1.PodDisruptionBudget {
		return policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
			Spec: policyv1.PodDisruptionBudgetSpec{Selector: sel}, Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed}}
	}
	in := whatif.Input{Node: testNode(), Pods: []*v1.Pod{web, testPod("other", 10)}, Deadline: t0.Add(2 * time.Minute), Now: t0,
		PDBs: []policyv1.PodDisruptionBudget{
			budget("all", &metav1.LabelSelector{}, 0),
			budget("web", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, 1),
			budget("none", nil, 0),
		}}
	got := whatif.Plan(cfg, in)
	if len(got.Pods) != 2 {
		t.Fatalf("pods = %d, want 2", len(got.Pods))
	}
	other, webPlan := got.Pods[0], got.Pods[1]
	if other.PDB == nil || other.PDB.Name != "all" || !other.PDB.Blocks {
		t.Errorf("other: PDB %+v, want the empty-selector budget \"all\", blocking", other.PDB)
	}
	if webPlan.PDB == nil || !webPlan.PDB.Blocks || !slices.Equal(webPlan.PDB.Covering, []string{"all", "web"}) ||
		!strings.Contains(webPlan.PDB.Then, "more than one") {
		t.Errorf("web: PDB %+v, want both budgets, refused, deleted at its latest time", webPlan.PDB)
	}
}

// TestStopDuringAnInterruptionFinishesTheWindow (item 7): SIGTERM during an interruption keeps
// the agent working until the window's end; outside one it stops at once.
func TestStopDuringAnInterruptionFinishesTheWindow(t *testing.T) {
	h := newHarness(t, nil, testNode())
	parent, cancel := context.WithCancel(h.ctx)
	cancel() // the signal
	stopped := make(chan struct{})
	workDone := make(chan struct{})
	defer close(workDone)
	go h.a.lingerOnStop(parent, h.clock, func() { close(stopped) }, workDone)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("without an interruption the agent did not stop at once")
	}

	h = newHarness(t, nil, testNode())
	h.notice(t0.Add(40 * time.Second)) // window end t0+35s
	// The linger gets a clock of its own: the harness's is shared with the work queue, whose
	// timers would hide whether the linger is waiting.
	clk := clocktesting.NewFakeClock(t0.Add(3 * time.Second))
	var once sync.Once
	stopped = make(chan struct{})
	go h.a.lingerOnStop(parent, clk, func() { once.Do(func() { close(stopped) }) }, workDone)
	for clk.Now().Before(t0.Add(35 * time.Second)) {
		for !clk.HasWaiters() {
			select {
			case <-stopped:
				t.Fatalf("stopped at T+%v, before the window's end", clk.Now().Sub(t0))
			default:
				goruntime.Gosched()
			}
		}
		clk.Step(time.Second)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("did not stop at the window's end")
	}
}

// TestPlanWhatIfFutureTimeAdded: reprieve plan anchors a foreign taint whose timeAdded lies in
// the future on now, as the agent does, but keeps the imagined notice's own time, however far
// ahead (TestPlanMatchesTheAgent plans a notice 3 s ahead).
func TestPlanWhatIfFutureTimeAdded(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.NodeName = nodeName
	future := metav1.NewTime(t0.Add(time.Minute))
	in := whatif.Input{Node: testNode(v1.Taint{Key: "other", Effect: v1.TaintEffectNoExecute, TimeAdded: &future}),
		Pods: []*v1.Pod{testPod("p", 5)}, Now: t0}
	got := whatif.Plan(cfg, in)
	if len(got.Pods) != 1 || got.Pods[0].Due == nil || !got.Pods[0].Due.Equal(t0) {
		t.Errorf("foreign taint in the future: %+v, want due now", got.Pods)
	}
	in = whatif.Input{Node: testNode(), Pods: []*v1.Pod{testPod("p", 5)}, Now: t0, NoticeTime: t0.Add(3 * time.Second), Deadline: t0.Add(time.Minute)}
	got = whatif.Plan(cfg, in)
	if len(got.Pods) != 1 || got.Pods[0].Due == nil || !got.Pods[0].Due.Equal(t0.Add(3*time.Second)) {
		t.Errorf("notice 3 s ahead: %+v, want due at the notice time", got.Pods)
	}
}

// TestDeadlineMovingEarlierDoesNotEvictTwice: a changed deadline starts a fresh drain, but a
// pod already evicted in the same interruption is not evicted again before the informer shows
// its deletionTimestamp (one request per pod).
func TestDeadlineMovingEarlierDoesNotEvictTwice(t *testing.T) {
	h := newHarness(t, nil, testNode(), testPod("p", 5))
	h.notice(t0.Add(60 * time.Second))
	h.a.exec.SyncPod(h.ctx, "ns/p")
	if len(h.evictions()) != 1 {
		t.Fatalf("evictions = %d, want 1", len(h.evictions()))
	}
	h.prov.Set(providerNotice("spot-1", t0.Add(50*time.Second)))
	h.a.intr.PollOnce(h.ctx) // not h.step: the informer has not seen the eviction yet
	h.reconcile()
	h.a.exec.SyncPod(h.ctx, "ns/p")
	if n := len(h.evictions()); n != 1 {
		t.Errorf("evictions = %d after the deadline moved earlier, want still 1", n)
	}
}

// TestPlanPodTakesFirstSeen (item 6): the exported planner is right on its own: a taint without
// timeAdded counts from when the caller first saw it, not from the zero time, and a timeAdded
// in the future counts from first seen too.
func TestPlanPodTakesFirstSeen(t *testing.T) {
	seen := t0.Add(5 * time.Second)
	tol10 := pod(spotToleration(secs(10)))
	bare := []v1.Taint{{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute}}
	if due, _, _ := plan.NoExecuteDue(tol10.Spec.Tolerations, bare, seen, false); !due.Equal(seen.Add(10 * time.Second)) {
		t.Errorf("taint without timeAdded: due %v, want first seen + 10s", due)
	}
	future := []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoExecute, t0.Add(time.Hour))}
	if pl := plan.PlanPodAt(tol10, future, seen, plan.Window{}, plan.PodFilter{}, false); !pl.Due.Equal(seen.Add(10 * time.Second)) {
		t.Errorf("timeAdded in the future: due %v, want first seen + 10s", pl.Due)
	}
	past := []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoExecute, t0)}
	if pl := plan.PlanPodAt(tol10, past, seen, plan.Window{}, plan.PodFilter{}, false); !pl.Due.Equal(t0.Add(10 * time.Second)) {
		t.Errorf("timeAdded before first seen: due %v, want timeAdded + 10s", pl.Due)
	}
}

// TestStopLeavesAFarWindowToTheNextAgent: on SIGTERM during an interruption whose window ends
// after --stop-grace (a scheduled maintenance two hours away), the agent stops at once instead of
// lingering past its pod's grace; the next agent resumes from the node.
func TestStopLeavesAFarWindowToTheNextAgent(t *testing.T) {
	h := newHarness(t, nil, testNode())
	h.notice(t0.Add(2 * time.Hour))
	parent, cancel := context.WithCancel(h.ctx)
	cancel() // the signal
	stopped := make(chan struct{})
	workDone := make(chan struct{})
	defer close(workDone)
	clk := clocktesting.NewFakeClock(t0.Add(3 * time.Second))
	go h.a.lingerOnStop(parent, clk, func() { close(stopped) }, workDone)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent lingered for a window two hours away")
	}
	if clk.Now() != t0.Add(3*time.Second) {
		t.Errorf("the clock moved to %v: the stop should not wait for it", clk.Now())
	}
}
