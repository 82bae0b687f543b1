package agent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/podnotice"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/providers"
)

// drainPodNotice writes every queued warning, as the notifier's workers would.
func (h *harness) drainPodNotice() {
	h.t.Helper()
	for h.a.podNotice.Pending() > 0 {
		h.a.podNotice.Next(h.ctx)
	}
}

func (h *harness) warningPatches() []k8stesting.PatchAction {
	var out []k8stesting.PatchAction
	for _, a := range h.actions("patch", "pods", "status") {
		p := a.(k8stesting.PatchAction)
		if strings.Contains(string(p.GetPatch()), string(record.PodConditionInterruption)) {
			out = append(out, p)
		}
	}
	return out
}

func (h *harness) pod(name string) *v1.Pod {
	h.t.Helper()
	p, err := h.client.CoreV1().Pods("ns").Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return p
}

// syncAll runs the eviction loop once over every pod, as enqueueAll would.
func (h *harness) syncAll(names ...string) {
	for _, n := range names {
		h.a.exec.SyncPod(h.ctx, "ns/"+n)
	}
}

func TestPodWarningFollowsTheNotice(t *testing.T) {
	ds := testPod("ds", 10)
	ds.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "d", Controller: ptr(true)}}
	h := newHarness(t, nil, testNode(),
		testPod("job", 90, spotToleration(secs(3600))),
		testPod("forever", 10, spotToleration(nil)),
		ds,
	)
	pods := []string{"job", "forever", "ds"}
	// No notice: nothing to say, nothing queued.
	h.syncAll(pods...)
	if n := h.a.podNotice.Pending(); n != 0 {
		t.Fatalf("%d pods queued without a notice", n)
	}

	deadline := t0.Add(120 * time.Second)
	h.notice(deadline)
	h.syncAll(pods...)
	h.drainPodNotice()
	if n := len(h.warningPatches()); n != 2 {
		t.Fatalf("%d warnings written, want 2 (job and forever; not the DaemonSet pod)", n)
	}
	job := h.pod("job")
	// The 90 s grace must end 5 s before the deadline, after the kubelet's 1 s reaction: evicted
	// at t0+24s.
	if got := job.Annotations[record.AnnotationEvictAt]; got != "2026-11-29T12:00:24Z" {
		t.Errorf("job evict-at %q, want 2026-11-29T12:00:24Z", got)
	}
	if got := job.Annotations[record.AnnotationReclaimDeadline]; got != "2026-11-29T12:02:00Z" {
		t.Errorf("job reclaim-deadline %q", got)
	}
	c := podnotice.InterruptionCondition(job)
	if c == nil || c.Status != v1.ConditionTrue || c.Reason != events.ReasonSpotInterruption || !c.LastTransitionTime.Time.Equal(t0) {
		t.Fatalf("job condition %+v, want True, %s, since t0", c, events.ReasonSpotInterruption)
	}
	forever := h.pod("forever")
	if _, ok := forever.Annotations[record.AnnotationEvictAt]; ok || forever.Annotations[record.AnnotationReclaimDeadline] != "2026-11-29T12:02:00Z" {
		t.Errorf("forever annotations %v, want only the deadline", forever.Annotations)
	}
	if c := podnotice.InterruptionCondition(forever); c == nil || c.Status != v1.ConditionTrue || !strings.HasPrefix(c.Message, "Not evicted") {
		t.Errorf("forever condition %+v", c)
	}
	if len(h.pod("ds").Annotations) != 0 || podnotice.InterruptionCondition(h.pod("ds")) != nil {
		t.Errorf("the DaemonSet pod was warned")
	}

	// The same plan again, before and after the informer shows the writes: nothing is sent.
	h.syncAll(pods...)
	h.drainPodNotice()
	h.syncStores()
	h.syncAll(pods...)
	h.drainPodNotice()
	if n := len(h.warningPatches()); n != 2 {
		t.Errorf("%d warnings written after unchanged re-plans, want still 2", n)
	}

	// The deadline moves earlier: the times follow, the transition time stays.
	h.clock.Step(10 * time.Second)
	h.notice(t0.Add(100 * time.Second))
	h.syncAll(pods...)
	h.drainPodNotice()
	job = h.pod("job")
	if got := job.Annotations[record.AnnotationEvictAt]; got != "2026-11-29T12:00:04Z" {
		t.Errorf("job evict-at after the re-plan %q, want 2026-11-29T12:00:04Z (100 s less the 5 s margin, the 90 s grace and the kubelet's reaction)", got)
	}
	if c := podnotice.InterruptionCondition(job); c == nil || !strings.Contains(c.Message, "2026-11-29T12:01:40Z") || !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("job condition after the re-plan %+v, want the new deadline and the first transition time", c)
	}

	// Withdrawn: annotations gone, condition False.
	h.clock.Step(time.Second)
	h.prov.Set()
	h.step()
	h.syncAll(pods...)
	h.drainPodNotice()
	for _, name := range []string{"job", "forever"} {
		p := h.pod(name)
		if _, ok := p.Annotations[record.AnnotationEvictAt]; ok {
			t.Errorf("%s still has %s", name, record.AnnotationEvictAt)
		}
		if _, ok := p.Annotations[record.AnnotationReclaimDeadline]; ok {
			t.Errorf("%s still has %s", name, record.AnnotationReclaimDeadline)
		}
		c := podnotice.InterruptionCondition(p)
		if c == nil || c.Status != v1.ConditionFalse || c.Reason != events.ReasonNoticeWithdrawn || !c.LastTransitionTime.Time.Equal(t0.Add(11*time.Second)) {
			t.Errorf("%s condition after the withdrawal %+v, want False, %s, now", name, c, events.ReasonNoticeWithdrawn)
		}
	}
	// And a withdrawn pod is not written again.
	before := len(h.warningPatches())
	h.syncStores()
	h.syncAll(pods...)
	h.drainPodNotice()
	if n := len(h.warningPatches()); n != before {
		t.Errorf("%d more writes after the withdrawal was written", n-before)
	}
}

func TestPodWarningRetriedUntilWritten(t *testing.T) {
	h := newHarness(t, nil, testNode(), testPod("job", 10))
	fail := true
	h.client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" && fail {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	h.notice(t0.Add(60 * time.Second))
	h.syncAll("job")
	n := h.a.podNotice
	if !n.Next(h.ctx) {
		t.Fatal("queue shut down")
	}
	// Not lost: back in the queue with a backoff.
	if got := n.Requeues("ns/job"); got != 1 {
		t.Fatalf("requeues after a failed write = %d, want 1", got)
	}
	fail = false
	if err := n.Sync(h.ctx, "ns/job"); err != nil {
		t.Fatal(err)
	}
	if c := podnotice.InterruptionCondition(h.pod("job")); c == nil || c.Status != v1.ConditionTrue {
		t.Errorf("condition after the retry %+v, want True", c)
	}
	for result, want := range map[string]float64{"failed": 1, "written": 1} {
		if got := testutil.ToFloat64(h.a.metrics.PodWarningWrites.WithLabelValues(result)); got != want {
			t.Errorf("reprieve_pod_warnings_writes_total{result=%q} = %v, want %v", result, got, want)
		}
	}
}

func TestPodWarningSkipsWhatThePodAlreadyCarries(t *testing.T) {
	// An agent restarted during a notice finds the warning it wrote: it writes nothing.
	deadline := t0.Add(60 * time.Second)
	pod := testPod("job", 10)
	pod.Annotations = map[string]string{record.AnnotationEvictAt: rfc3339(t0), record.AnnotationReclaimDeadline: rfc3339(deadline)}
	pw := podnotice.WarningFor(plan.Plan{EvictAt: t0, Grace: 10 * time.Second}, plan.Window{Deadline: deadline, SafetyMargin: 5 * time.Second},
		&providers.Notice{Provider: "aws", Kind: providers.KindSpotInterruption})
	pod.Status.Conditions = []v1.PodCondition{{Type: record.PodConditionInterruption, Status: v1.ConditionTrue, Reason: pw.Reason, Message: pw.Message}}
	h := newHarness(t, nil, testNode(), pod)
	h.notice(deadline)
	h.syncAll("job")
	if n := h.a.podNotice.Pending(); n != 0 {
		t.Errorf("%d writes queued for a pod that carries its warning", n)
	}
	if !podnotice.Carries(pod, pw) {
		t.Errorf("carries = false for the pod's own warning")
	}
}

func TestPodWarningNotWrittenToASuccessor(t *testing.T) {
	h := newHarness(t, nil, testNode(), testPod("job", 10))
	h.notice(t0.Add(60 * time.Second))
	h.syncAll("job")
	// The pod is replaced under the same name before the writer gets to it.
	if err := h.client.CoreV1().Pods("ns").Delete(h.ctx, "job", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	successor := testPod("job", 10)
	successor.UID = types.UID("uid-successor")
	successor.Spec.Tolerations = []v1.Toleration{{Operator: v1.TolerationOpExists}} // tolerates everything forever
	if _, err := h.client.CoreV1().Pods("ns").Create(h.ctx, successor, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.syncStores()
	if err := h.a.podNotice.Sync(h.ctx, "ns/job"); err != nil {
		t.Fatal(err)
	}
	if n := len(h.warningPatches()); n != 0 {
		t.Errorf("%d warnings written to the successor from its predecessor's plan", n)
	}
}

func TestPodNoticeOff(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.PodNotice = false }, testNode(), testPod("job", 10))
	h.notice(t0.Add(60 * time.Second))
	h.syncAll("job")
	if h.a.podNotice != nil || len(h.warningPatches()) != 0 {
		t.Errorf("--pod-notice=false still warns")
	}
}

func TestPodNotifierRunStops(t *testing.T) {
	h := newHarness(t, nil, testNode())
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() { defer close(done); h.a.podNotice.Run(ctx) }()
	cancel()
	<-done
	if !h.a.podNotice.ShuttingDown() {
		t.Errorf("the queue is still open after run returned")
	}
}

// TestPodWarningWaitsOutTheServersThrottling (issue 24): the early-warning writes share the
// agent's turn with its evictions. Once the API server throttles an eviction (APF's 429 with
// Retry-After, no DisruptionBudget cause), no warning is written before Retry-After ends: they
// would take the seats the evictions need.
func TestPodWarningWaitsOutTheServersThrottling(t *testing.T) {
	h := newHarness(t, nil, testNode(), testPod("web", 10))
	h.evictFn = func(context.Context, *policyv1.Eviction) error {
		return apierrors.NewTooManyRequests("Too many requests, please try again later.", 3)
	}
	h.notice(t0.Add(120 * time.Second))
	h.syncAll("web") // its eviction is throttled: the agent pauses for 3 s at least
	if h.a.podNotice.Pending() == 0 {
		t.Fatal("no warning queued at the notice")
	}
	entered := make(chan struct{}, 1)
	if turn := h.a.podNotice.Turn; turn != nil {
		h.a.podNotice.Turn = func(ctx context.Context) (func(error), error) {
			entered <- struct{}{}
			return turn(ctx)
		}
	}
	done := make(chan struct{})
	go func() { defer close(done); h.drainPodNotice() }()
	select {
	case <-entered: // waiting for its turn
	case <-done:
		t.Fatalf("the warning was written at once, during the pause (%d patches)", len(h.warningPatches()))
	}
	h.clock.Step(3*time.Second - time.Millisecond)
	select {
	case <-done:
		t.Fatalf("the warning was written during the pause (%d patches)", len(h.warningPatches()))
	default:
	}
	if n := len(h.warningPatches()); n != 0 {
		t.Fatalf("%d warnings written before Retry-After ended", n)
	}
	// The jitter makes the pause up to 1.5 x Retry-After.
	h.clock.Step(1500 * time.Millisecond)
	<-done
	if n := len(h.warningPatches()); n != 1 {
		t.Fatalf("%d warnings written after the pause, want 1", n)
	}
}

// rfc3339 writes t as the pods' warning annotations carry it (podnotice).
func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }
