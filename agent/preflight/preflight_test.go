package preflight

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
)

// guardDown is the API server's answer to an eviction while the eviction guard's webhook cannot
// be called (failurePolicy Fail): k8s.io/apiserver's ErrCallingWebhook in a 500.
func guardDown() error {
	return apierrors.NewInternalError(errors.New(`failed calling webhook "eviction-guard.reprieve.io": failed to call webhook: Post "https://reprieve-eviction-guard.kube-system.svc:443/validate-eviction?timeout=3s": dial tcp 10.0.0.1:443: connect: connection refused`))
}

// TestEvictionCheckVerdict: what each answer to the dry-run eviction says of the eviction path.
func TestEvictionCheckVerdict(t *testing.T) {
	pdb := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	pdb.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: policyv1.DisruptionBudgetCause}}
	gr := schema.GroupResource{Resource: "pods"}
	for _, c := range []struct {
		name   string
		err    error
		status string
		known  bool
	}{
		{"passed", nil, StatusOK, true},
		{"a budget refuses the agent's own pod: the path answered", pdb, StatusOK, true},
		{"the guard's webhook cannot be called", guardDown(), StatusGuardUnreachable, true},
		{"RBAC refuses pods/eviction", apierrors.NewForbidden(gr, "agent", errors.New("cannot create resource pods/eviction")), StatusRefused, true},
		{"the guard denies", apierrors.NewForbidden(gr, "agent", errors.New(`admission webhook "eviction-guard.reprieve.io" denied the request`)), StatusRefused, true},
		{"no pod of its own", errNoOwnPod, StatusUnknown, true},
		{"its pod name is wrong", apierrors.NewNotFound(gr, "agent"), StatusUnknown, true},
		{"another webhook's failure", apierrors.NewInternalError(errors.New(`failed calling webhook "other.example.com": timeout`)), "", false},
		{"a time-out says nothing", context.DeadlineExceeded, "", false},
		{"APF's 429 says nothing", apierrors.NewTooManyRequests("throttled", 1), "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if s, ok := Verdict(c.err); s != c.status || ok != c.known {
				t.Errorf("Verdict(%v) = %q, %v; want %q, %v", c.err, s, ok, c.status, c.known)
			}
		})
	}
}

// TestEvictionCheckRun: the check runs at start; with the guard down it says so in the detail
// and the metric and tries again with backoff (1 s, 2 s), so that the guard's return shows within
// seconds; once it passes, the next check is 10 minutes later. The agent's own pod is dry-run
// evicted, nothing else.
func TestEvictionCheckRun(t *testing.T) {
	client := fake.NewClientset(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-x", Namespace: "kube-system"}})
	down := true
	calls := make(chan *policyv1.Eviction, 10)
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		ca, ok := a.(k8stesting.CreateAction)
		if !ok || a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := ca.GetObject().(*policyv1.Eviction)
		calls <- ev
		if down {
			return true, nil, guardDown()
		}
		return true, nil, nil
	})
	clk := clocktesting.NewFakeClock(t0)
	reg := prometheus.NewRegistry()
	gauge := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "check_status"}, []string{"status"})
	reg.MustRegister(gauge)
	c := New(kubetest.Wrap(client), clk, "agent-x", "kube-system", func() (types.UID, error) { return "uid-x", nil }, gauge)
	if d := c.Detail(); !strings.Contains(d, "unknown") {
		t.Errorf("before the first check: detail %q, want unknown", d)
	}
	if v := testutil.ToFloat64(gauge.WithLabelValues(StatusUnknown)); v != 1 {
		t.Errorf("before the first check: unknown = %v, want 1", v)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	ev := <-calls
	if o := ev.DeleteOptions; ev.Name != "agent-x" || ev.Namespace != "kube-system" || len(o.DryRun) != 1 || o.DryRun[0] != metav1.DryRunAll ||
		o.Preconditions == nil || o.Preconditions.UID == nil || *o.Preconditions.UID != "uid-x" {
		t.Fatalf("the check evicted %s/%s with %+v; want the agent's own pod, a server-side dry run with its UID precondition (the shipped policy demands it)", ev.Namespace, ev.Name, o)
	}
	waitTimer(t, clk) // the check observed the answer and waits
	if d := c.Detail(); !strings.Contains(d, "the eviction guard is unreachable since") || !strings.Contains(d, "eviction-guard.reprieve.io") {
		t.Errorf("guard down: detail %q", d)
	}
	if v := testutil.ToFloat64(gauge.WithLabelValues(StatusGuardUnreachable)); v != 1 {
		t.Errorf("guard down: guard_unreachable = %v, want 1", v)
	}
	if v := testutil.ToFloat64(gauge.WithLabelValues(StatusOK)); v != 0 {
		t.Errorf("guard down: ok = %v, want 0", v)
	}
	// Backoff: 1 s, then 2 s.
	clk.Step(999 * time.Millisecond)
	select {
	case <-calls:
		t.Fatal("checked again before the 1 s backoff")
	default:
	}
	clk.Step(time.Millisecond)
	<-calls
	waitTimer(t, clk)
	down = false
	clk.Step(2 * time.Second)
	<-calls
	waitTimer(t, clk)
	if d := c.Detail(); d != "" {
		t.Errorf("guard back: detail %q, want none", d)
	}
	if v := testutil.ToFloat64(gauge.WithLabelValues(StatusOK)); v != 1 {
		t.Errorf("guard back: ok = %v, want 1", v)
	}
	clk.Step(10*time.Minute - time.Millisecond)
	select {
	case <-calls:
		t.Fatal("checked again before 10 minutes while the path passes")
	default:
	}
	clk.Step(time.Millisecond)
	<-calls
}

// TestEvictionCheckNoOwnPod: without its pod's name the agent cannot check, says "unknown" and
// calls nothing.
func TestEvictionCheckNoOwnPod(t *testing.T) {
	client := fake.NewClientset()
	clk := clocktesting.NewFakeClock(t0)
	gauge := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "check_status"}, []string{"status"})
	c := New(kubetest.Wrap(client), clk, "", "", func() (types.UID, error) {
		t.Fatal("looked for a pod without a name")
		return "", nil
	}, gauge)
	if again := c.observe(context.Background(), c.try(context.Background())); again {
		t.Error("no pod of its own: checked again soon; want every 10 minutes")
	}
	if d := c.Detail(); !strings.Contains(d, "the eviction path is unknown") || !strings.Contains(d, "POD_NAME") {
		t.Errorf("detail %q; want unknown, naming $POD_NAME", d)
	}
	if n := len(client.Actions()); n != 0 {
		t.Errorf("%d API calls without a pod to try; want none", n)
	}
}

// waitTimer waits until the check has armed its next timer on the fake clock.
func waitTimer(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the check armed no timer")
		}
		runtime.Gosched()
	}
}

// t0 is the tests' start, as the agent's tests have it.
var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
