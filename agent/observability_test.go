package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/providers"
)

func TestEventsThroughAnInterruption(t *testing.T) {
	deadline := t0.Add(60 * time.Second)
	// The NoExecute mode, explicitly (the default is --interruption-eviction=reprieve).
	h := newHarness(t, func(c *config.Config) { c.InterruptionEviction = string(plan.EvictionKubeControllerManager) }, testNode(),
		testPod("now", 10),
		testPod("later", 5, spotToleration(secs(20))),
		testPod("slow", 300),
		testPod("pdb", 5),
	)
	h.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "eviction" && a.(k8stesting.CreateAction).GetObject().(interface{ GetName() string }).GetName() == "pdb" {
			return true, nil, pdbRefusal()
		}
		return false, nil, nil
	})
	h.notice(deadline)
	ev := h.drainEvents()
	for _, want := range []string{
		"Warning SpotInterruption aws spot-interruption (terminate), deadline 2026-11-29T12:01:00Z (in 1m0s)",
		"Normal TaintApplied added taint cloud=spot:NoExecute",
	} {
		if !hasEvent(ev, want) {
			t.Errorf("missing event %q in %q", want, ev)
		}
	}
	for _, key := range []string{"ns/now", "ns/later", "ns/slow", "ns/pdb"} {
		h.a.exec.SyncPod(h.ctx, key)
	}
	ev = h.drainEvents()
	for _, want := range []string{
		"Normal InterruptionEviction Evicted with grace 10s (planned 2026-11-29T12:00:00Z: taint cloud=spot:NoExecute not tolerated)",
		"Normal EvictionScheduled Eviction planned at 2026-11-29T12:00:20Z (in 20s) with grace 5s: taint cloud=spot:NoExecute tolerated for 20s",
		"Warning GraceShortened Grace shortened from 5m0s to 53s", // 55 s less the allowance and the kubelet's reaction
		"Warning EvictionBlocked Eviction refused by a PodDisruptionBudget; retrying until 2026-11-29T12:00:49Z, then deleting",
	} {
		if !hasEvent(ev, want) {
			t.Errorf("missing event %q in %q", want, ev)
		}
	}
	if got := testutil.ToFloat64(h.a.metrics.BlockedPods); got != 1 {
		t.Errorf("blocked pods = %v, want 1", got)
	}
	// The blocked pod is retried until latest, then deleted.
	for i := 0; i < 200; i++ {
		d := h.a.exec.SyncPod(h.ctx, "ns/pdb")
		if d == 0 {
			break
		}
		h.clock.Step(d)
	}
	if !hasEvent(h.drainEvents(), "Warning ForceDeleted Deleted with grace 5s") {
		t.Error("no ForceDeleted event")
	}
	if got := testutil.ToFloat64(h.a.metrics.BlockedPods); got != 0 {
		t.Errorf("blocked pods after the delete = %v, want 0", got)
	}

	// The notice goes away: withdrawn, taint removed.
	h.prov.Set()
	h.step()
	ev = h.drainEvents()
	for _, want := range []string{"Normal NoticeWithdrawn Withdrawn: aws spot-interruption", "Normal TaintRemoved removed taint cloud=spot:NoExecute"} {
		if !hasEvent(ev, want) {
			t.Errorf("missing event %q in %q", want, ev)
		}
	}
}

func TestWindowSummaryCountsMissedPods(t *testing.T) {
	deadline := t0.Add(60 * time.Second)
	h := newHarness(t, nil, testNode(), testPod("gone", 5), testPod("stuck", 5))
	h.notice(deadline)
	h.a.exec.SyncPod(h.ctx, "ns/gone")
	h.a.exec.SyncPod(h.ctx, "ns/stuck")
	// "gone" finishes; "stuck" is evicted but never ends (a finalizer, a hung kubelet).
	if err := h.client.CoreV1().Pods("ns").Delete(h.ctx, "gone", metav1DeleteNow()); err != nil {
		t.Fatal(err)
	}
	h.syncStores()
	h.drainEvents()

	h.clock.SetTime(deadline.Add(-5*time.Second - time.Millisecond))
	h.step()
	if hasEvent(h.drainEvents(), "Normal InterruptionHandled") || testutil.ToFloat64(h.a.metrics.MissedDeadlineTotal) != 0 {
		t.Fatal("summarised before the window's end")
	}
	h.clock.SetTime(deadline.Add(-5 * time.Second))
	h.step()
	ev := h.drainEvents()
	if !hasEvent(ev, "Warning InterruptionHandled Interruption handled: 2 pods evicted, 1 gone before 2026-11-29T12:00:55Z (deadline 2026-11-29T12:01:00Z less 5s margin), 1 still present") {
		t.Errorf("summary missing or wrong: %q", ev)
	}
	if !hasEvent(ev, "Warning MissedDeadline Still present at 2026-11-29T12:00:55Z") {
		t.Errorf("no MissedDeadline pod event: %q", ev)
	}
	if got := testutil.ToFloat64(h.a.metrics.MissedDeadlineTotal); got != 1 {
		t.Errorf("missed deadline total = %v, want 1", got)
	}
	// Once only.
	h.clock.Step(time.Second)
	h.step()
	if hasEvent(h.drainEvents(), "Warning InterruptionHandled") || testutil.ToFloat64(h.a.metrics.MissedDeadlineTotal) != 1 {
		t.Error("summarised twice")
	}
}

func TestDryRunAnnouncesTheTaintOnce(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.DryRun = true
		c.InterruptionEviction = string(plan.EvictionKubeControllerManager)
	}, testNode())
	h.notice(t0.Add(time.Minute))
	first := h.drainEvents()
	if !hasEvent(first, "Normal TaintApplied Dry run: would have added taint cloud=spot:NoExecute") {
		t.Errorf("dry-run taint event missing: %q", first)
	}
	for range 3 {
		h.clock.Step(time.Second)
		h.step()
	}
	if ev := h.drainEvents(); hasEvent(ev, "Normal TaintApplied") {
		t.Errorf("dry run repeated the taint event at every poll: %q", ev)
	}
}

func TestMetricsGolden(t *testing.T) {
	h := newHarness(t, nil, testNode(), testPod("now", 10))
	reg := prometheus.NewPedanticRegistry()
	h.reg = reg
	h.build(h.prov)
	h.clock.SetTime(t0.Add(1500 * time.Millisecond))
	h.notice(t0.Add(2 * time.Minute))
	h.a.exec.SyncPod(h.ctx, "ns/now")

	const want = `
# HELP reprieve_evictions_requests_total Eviction and delete requests, by result.
# TYPE reprieve_evictions_requests_total counter
reprieve_evictions_requests_total{result="evicted"} 1
reprieve_evictions_requests_total{result="failed"} 0
reprieve_evictions_requests_total{result="forced_delete"} 0
reprieve_evictions_requests_total{result="gone"} 0
reprieve_evictions_requests_total{result="grace_shortened"} 0
reprieve_evictions_requests_total{result="pdb_blocked"} 0
# HELP reprieve_evictions_missed_deadline_total Pods reprieve planned to evict that were still present at the end of the window (deadline - safety margin). Must stay 0.
# TYPE reprieve_evictions_missed_deadline_total counter
reprieve_evictions_missed_deadline_total 0
# HELP reprieve_metadata_polls_total Polls of the provider (all of its metadata sources), by provider and outcome (ok, error).
# TYPE reprieve_metadata_polls_total counter
reprieve_metadata_polls_total{outcome="error",provider="aws"} 0
reprieve_metadata_polls_total{outcome="ok",provider="aws"} 1
# HELP reprieve_notices_received_total Notices received from the cloud, by provider and kind.
# TYPE reprieve_notices_received_total counter
reprieve_notices_received_total{kind="maintenance-information",provider="aws"} 0
reprieve_notices_received_total{kind="preemption",provider="aws"} 0
reprieve_notices_received_total{kind="rebalance-recommendation",provider="aws"} 0
reprieve_notices_received_total{kind="scheduled-maintenance",provider="aws"} 0
reprieve_notices_received_total{kind="spot-interruption",provider="aws"} 1
reprieve_notices_received_total{kind="termination",provider="aws"} 0
# HELP reprieve_notices_reclaim_deadline_timestamp_seconds The pending reclaim deadline as a Unix timestamp; 0 when none.
# TYPE reprieve_notices_reclaim_deadline_timestamp_seconds gauge
reprieve_notices_reclaim_deadline_timestamp_seconds 1.79595372e+09
# HELP reprieve_taints_active 1 while reprieve's taint with this key is on the node (or, in a dry run, would be).
# TYPE reprieve_taints_active gauge
reprieve_taints_active{key="cloud"} 1
reprieve_taints_active{key="reprieve.io/rebalance-recommended"} 0
reprieve_taints_active{key="reprieve.io/scheduled-maintenance"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"reprieve_evictions_requests_total", "reprieve_evictions_missed_deadline_total", "reprieve_metadata_polls_total",
		"reprieve_notices_received_total", "reprieve_notices_reclaim_deadline_timestamp_seconds", "reprieve_taints_active"); err != nil {
		t.Error(err)
	}
	// CollectAndCount counts series, which is 1 for a histogram with no observation at all:
	// check the observation count itself.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var observed uint64
	for _, mf := range mfs {
		if mf.GetName() == "reprieve_evictions_lateness_seconds" && len(mf.GetMetric()) == 1 {
			observed = mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	if observed != 1 {
		t.Errorf("lateness observations = %d, want 1 (one eviction)", observed)
	}
	if lint, err := testutil.GatherAndLint(reg); err != nil || len(lint) > 0 {
		t.Errorf("metric lint problems: %v %v", lint, err)
	}
}

func metav1DeleteNow() metav1.DeleteOptions { return metav1.DeleteOptions{GracePeriodSeconds: secs(0)} }

// TestNoticeReasons: each notice kind has its own node event reason, none of them the kubelet's
// Evicted nor the fallback for an unknown kind.
func TestNoticeReasons(t *testing.T) {
	seen := map[string]providers.Kind{}
	for _, k := range providers.Kinds {
		r := events.NoticeReason(k)
		if r == events.ReasonNoticeReceived || r == "Evicted" {
			t.Errorf("kind %s: reason %s, want one of its own", k, r)
		}
		if other, dup := seen[r]; dup {
			t.Errorf("kinds %s and %s share the reason %s", other, k, r)
		}
		seen[r] = k
	}
	if r := events.NoticeReason("something-new"); r != events.ReasonNoticeReceived {
		t.Errorf("an unknown kind's reason is %s, want %s", r, events.ReasonNoticeReceived)
	}
	if events.ReasonEvicted == "Evicted" {
		t.Error("reprieve's pod eviction event reuses the kubelet's Evicted reason")
	}
}
