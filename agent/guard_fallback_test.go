package agent

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/reprieve-dev/reprieve/agent/evict"
	"github.com/reprieve-dev/reprieve/agent/metrics"
	"github.com/reprieve-dev/reprieve/agent/plan"
)

// TestGuardDownFallsBackToNodeBoundDelete: with the eviction guard unreachable, the API server
// refuses every eviction with a 500 (failurePolicy Fail: "failed calling webhook"). The agent
// retries at most a second apart, deletes the pod with its UID precondition and its whole grace
// at the pod's last safe moment (forceAt), never before, and acts on no other pod. That DELETE
// is node-bound by the admission policy; PodDisruptionBudgets are not consulted.
func TestGuardDownFallsBackToNodeBoundDelete(t *testing.T) {
	deadline := t0.Add(60 * time.Second)
	h := newHarness(t, nil, testNode(), testPod("p", 5))
	h.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		// What kube-apiserver answers when a failurePolicy Fail webhook cannot be reached.
		return true, nil, apierrors.NewInternalError(errors.New(`failed calling webhook "eviction-guard.reprieve.io": failed to call webhook: ` +
			`Post "https://reprieve-eviction-guard.kube-system.svc:443/validate-eviction?timeout=3s": dial tcp 10.96.0.12:443: connect: connection refused`))
	})
	h.notice(deadline)
	// Latest = deadline - safety margin (5 s) - the pod's grace (5 s) - the kubelet's reaction;
	// sent evictionLead before.
	forceAt := deadline.Add(-5*time.Second - 5*time.Second - plan.KubeletReaction - plan.EvictionLead)

	var deletedAt time.Time
	for i := 0; i < 500 && deletedAt.IsZero(); i++ {
		d := h.a.exec.SyncPod(h.ctx, "ns/p")
		if len(h.deletes()) > 0 {
			deletedAt = h.clock.Now()
			break
		}
		if d <= 0 || d > evict.FailureBackoffMax {
			t.Fatalf("at %v the agent waits %v before retrying; want a wait in (0, %v]", h.clock.Now().Sub(t0), d, evict.FailureBackoffMax)
		}
		h.clock.Step(d)
	}
	if deletedAt.IsZero() {
		t.Fatal("the pod was never deleted")
	}
	if !deletedAt.Equal(forceAt) {
		t.Errorf("deleted at t0+%v; want t0+%v, the last safe moment", deletedAt.Sub(t0), forceAt.Sub(t0))
	}
	dels := h.deletes()
	if len(dels) != 1 || dels[0].Namespace != "ns" || dels[0].Name != "p" {
		t.Fatalf("deletes = %+v; want one, of ns/p", dels)
	}
	opts := dels[0].DeleteOptions
	if opts.GracePeriodSeconds == nil || *opts.GracePeriodSeconds != 5 || opts.Preconditions == nil ||
		opts.Preconditions.UID == nil || *opts.Preconditions.UID != "uid-p" {
		t.Errorf("delete options %+v; want grace 5 and the UID precondition uid-p", opts)
	}
	evs := h.evictions()
	// Retries from t0 to forceAt, one a second at most apart after the first few: dozens.
	if len(evs) < 40 {
		t.Errorf("%d eviction attempts before the delete; want retries all along the window", len(evs))
	}
	for _, ev := range evs {
		// What the eviction policy (deploy/chart/reprieve/templates/admission-policy.yaml)
		// requires of every eviction by the agent.
		if ev.Namespace != "ns" || ev.Name != "p" || ev.DeleteOptions == nil || ev.DeleteOptions.GracePeriodSeconds == nil ||
			*ev.DeleteOptions.GracePeriodSeconds < 1 || ev.DeleteOptions.Preconditions == nil || ev.DeleteOptions.Preconditions.UID == nil ||
			*ev.DeleteOptions.Preconditions.UID != "uid-p" {
			t.Fatalf("eviction %s/%s with %+v; want ns/p with a grace of at least 1 s and its UID precondition", ev.Namespace, ev.Name, ev.DeleteOptions)
		}
	}
	if got := testutil.ToFloat64(h.a.metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultForcedDelete)); got != 1 {
		t.Errorf("forced deletes counted %v; want 1", got)
	}
	if got := testutil.ToFloat64(h.a.metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultFailed)); int(got) != len(evs) {
		t.Errorf("failed evictions counted %v; want %d", got, len(evs))
	}
	// Done: nothing more is sent for the pod.
	h.syncStores()
	if d := h.a.exec.SyncPod(h.ctx, "ns/p"); d != 0 || len(h.deletes()) != 1 || len(h.evictions()) != len(evs) {
		t.Errorf("after the delete: next look in %v, %d deletes, %d evictions; want nothing more", d, len(h.deletes()), len(h.evictions()))
	}
}
