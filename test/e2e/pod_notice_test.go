package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/record"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestPodNoticeWarnsPodsUnderThePolicy runs the agent with a token bound to its pod on node A,
// under the shipped admission policies, through a notice, a later deadline and a withdrawal:
// the pods it plans to evict, and the one that tolerates the interruption forever, carry the
// reprieve.io/Interruption condition and the evict-at and reclaim-deadline annotations with
// the planned times, which follow the deadline and go with the notice; the DaemonSet pod gets
// none. With the same token, the policy refuses a pod label, another annotation, another
// condition, a write of the pod itself, and any write to a pod on node B.
func TestPodNoticeWarnsPodsUnderThePolicy(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const ns, sa, nodeA, nodeB = "pod-notice", "reprieve-pod-notice", "pod-notice-a", "pod-notice-b"
	c := env.Client
	kubeA := boundAgents(ctx, t, ns, sa, nodeA, nodeB)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	// A job that checkpoints for 30 s and tolerates the taint an hour: the deadline decides its
	// eviction. A pod that tolerates it forever stays and dies with the machine.
	if err := scenario.Create(ctx, c, ns, nodeA, taint, []scenario.Pod{
		{Name: "job", Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(30)},
		{Name: "forever", Kind: scenario.Plain, Tolerate: ptr64(scenario.Forever), Grace: ptr64(1)},
	}); err != nil {
		t.Fatal(err)
	}
	clientA := clientFor(t, kubeA)

	statusPatch := func(cl kubernetes.Interface, pod string, p map[string]any) error {
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cl.CoreV1().Pods(ns).Patch(ctx, pod, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status")
		return err
	}
	warning := func(evictAt string) map[string]any {
		return map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{record.AnnotationEvictAt: evictAt}},
			"status": map[string]any{"conditions": []map[string]any{{"type": string(record.PodConditionInterruption),
				"status": "True", "reason": "Test", "message": "test", "lastTransitionTime": time.Now().UTC().Format(time.RFC3339)}}},
		}
	}
	// Policies take effect once the API server has loaded them.
	waitFor(ctx, t, "the policy in force", func() bool {
		err := statusPatch(clientA, "victim-"+nodeB, warning("x"))
		return err != nil && strings.Contains(err.Error(), "only pods on the node its token is bound to")
	})
	denied := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want it refused with %q", what, err, want)
		}
	}
	allowed := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v; want it allowed", what, err)
		}
	}
	victim := "victim-" + nodeA
	denied("node A's agent warning a pod on node B", statusPatch(clientA, "victim-"+nodeB, warning("x")), "only pods on the node its token is bound to")
	denied("a pod label through pods/status", statusPatch(clientA, victim, map[string]any{"metadata": map[string]any{"labels": map[string]any{"workload": "hijacked"}}}), "labels")
	denied("another annotation through pods/status", statusPatch(clientA, victim, map[string]any{"metadata": map[string]any{"annotations": map[string]any{"example.com/x": "y"}}}), "only reprieve.io/ annotations")
	denied("the Ready condition", statusPatch(clientA, victim, map[string]any{"status": map[string]any{"conditions": []map[string]any{{"type": "Ready", "status": "False"}}}}), "conditions")
	denied("the pod's phase", statusPatch(clientA, victim, map[string]any{"status": map[string]any{"phase": "Failed"}}), "phase")
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{record.AnnotationEvictAt: "x"}}})
	if _, err := clientA.CoreV1().Pods(ns).Patch(ctx, victim, types.MergePatchType, b, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node A's agent patching a pod itself: %v; want it forbidden (RBAC grants only pods/status)", err)
	}
	allowed("the warning itself on node A", statusPatch(clientA, victim, warning("2026-01-01T00:00:00Z")))

	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, nodeA, "--kubeconfig="+kubeA, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	pod := func(name string) *v1.Pod {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("getting pod %s: %v", name, err)
		}
		return p
	}
	condition := func(p *v1.Pod) *v1.PodCondition {
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == record.PodConditionInterruption {
				return &p.Status.Conditions[i]
			}
		}
		return nil
	}
	// The job's 30 s grace must end 5 s (the default margin) before the deadline, after the
	// kubelet's reaction.
	expect := func(deadline time.Time) {
		t.Helper()
		d, evictAt := deadline.UTC().Format(time.RFC3339), lastStart(deadline.Add(-5*time.Second), 30*time.Second).UTC().Format(time.RFC3339)
		waitFor(ctx, t, "the job warned for the deadline "+d, func() bool {
			p := pod("job")
			c := condition(p)
			return p.Annotations[record.AnnotationEvictAt] == evictAt && p.Annotations[record.AnnotationReclaimDeadline] == d &&
				c != nil && c.Status == v1.ConditionTrue && c.Reason == events.ReasonSpotInterruption &&
				strings.Contains(c.Message, evictAt) && strings.Contains(c.Message, d)
		})
		waitFor(ctx, t, "the forever pod warned for the deadline "+d, func() bool {
			p := pod("forever")
			c := condition(p)
			_, evict := p.Annotations[record.AnnotationEvictAt]
			return !evict && p.Annotations[record.AnnotationReclaimDeadline] == d &&
				c != nil && c.Status == v1.ConditionTrue && strings.Contains(c.Message, "tolerates the interruption taint forever")
		})
	}

	deadline := time.Now().Add(2 * time.Minute).Truncate(time.Second)
	setDeadline(ctx, t, nodeA, deadline.UTC().Format(time.RFC3339))
	expect(deadline)
	first := condition(pod("job")).LastTransitionTime

	later := deadline.Add(time.Minute)
	setDeadline(ctx, t, nodeA, later.UTC().Format(time.RFC3339))
	expect(later)
	if got := condition(pod("job")).LastTransitionTime; !got.Equal(&first) {
		t.Errorf("the condition's lastTransitionTime moved from %v to %v on a re-plan; want it kept", first, got)
	}

	setDeadline(ctx, t, nodeA, "")
	for _, name := range []string{"job", "forever"} {
		waitFor(ctx, t, name+"'s warning withdrawn", func() bool {
			p := pod(name)
			c := condition(p)
			_, evict := p.Annotations[record.AnnotationEvictAt]
			_, dl := p.Annotations[record.AnnotationReclaimDeadline]
			return !evict && !dl && c != nil && c.Status == v1.ConditionFalse && c.Reason == events.ReasonNoticeWithdrawn
		})
	}
	for _, name := range []string{"job", "forever"} {
		if p := pod(name); p.DeletionTimestamp != nil {
			t.Errorf("%s was deleted; the notice planned its eviction later", name)
		}
	}
	if p := pod("agent-" + nodeA); condition(p) != nil || p.Annotations[record.AnnotationReclaimDeadline] != "" {
		t.Errorf("the DaemonSet pod was warned: %v %v", p.Annotations, p.Status.Conditions)
	}
	if p := pod("victim-" + nodeB); condition(p) != nil {
		t.Errorf("the pod on node B carries a warning: %v", p.Status.Conditions)
	}
	if log := rp.LogTail(400); strings.Contains(log, "denied request") || strings.Contains(log, "ValidatingAdmissionPolicy") ||
		strings.Contains(log, "Writing the pod's interruption warning failed") {
		t.Errorf("the agent's warnings met the policy or failed:\n%s", log)
	}
}

// BenchmarkPodNotice110 measures the time from a notice to the reprieve.io/Interruption
// condition on every one of 110 pods (the kubelet's default maximum per node), all planned for
// eviction later, on the real API server: the figure docs/benchmarks.md records. The notice is
// the deadline annotation (--provider none), timed from just before its write; each pod's time
// is when a watch saw its condition. One node and agent per iteration (-benchtime=3x: three).
//
//	go test -run '^$' -bench BenchmarkPodNotice110 -benchtime=3x ./test/e2e/
func BenchmarkPodNotice110(b *testing.B) {
	const pods = 110
	var lasts, medians, afterTaint []time.Duration
	for i := range b.N {
		// Only notice to last condition counts in ns/op.
		b.StopTimer()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		name := fmt.Sprintf("notice-bench-%d-%d", time.Now().Unix(), i)
		setupNode(ctx, b, name, name, nil)
		taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
		specs := make([]scenario.Pod, pods)
		for j := range specs {
			// Evicted by the deadline's latest start, 2 min away: none leaves during the measure.
			specs[j] = scenario.Pod{Name: fmt.Sprintf("p%03d", j), Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(30)}
		}
		if err := scenario.Create(ctx, env.Client, name, name, taint, specs); err != nil {
			b.Fatal(err)
		}
		// Running and Ready first, so that kwok's own status writes are done.
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			list, err := env.Client.CoreV1().Pods(name).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			ready := 0
			for _, p := range list.Items {
				for _, c := range p.Status.Conditions {
					if c.Type == v1.PodReady && c.Status == v1.ConditionTrue {
						ready++
					}
				}
			}
			return ready == pods, nil
		}); err != nil {
			b.Fatalf("waiting for %d ready pods: %v", pods, err)
		}
		rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, name, "--kubeconfig="+agentKubeconfig, "--provider=none")
		if err != nil {
			b.Fatal(err)
		}
		list, err := env.Client.CoreV1().Pods(name).List(ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		w, err := env.Client.CoreV1().Pods(name).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		if err != nil {
			b.Fatal(err)
		}
		// The agent reads the annotation at its next poll (--poll-interval 1s), as it reads a
		// cloud's endpoint: the interruption taint's arrival marks when it saw the notice.
		nw, err := env.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		if err != nil {
			b.Fatal(err)
		}
		var taintAt time.Time
		taintSeen := make(chan struct{})
		go func() {
			defer close(taintSeen)
			for ev := range nw.ResultChan() {
				if n, ok := ev.Object.(*v1.Node); ok && hasTaint(n, taint.Key, taint.Effect) {
					taintAt = time.Now()
					return
				}
			}
		}()
		notice := time.Now()
		b.StartTimer()
		deadline := notice.Add(2 * time.Minute).Truncate(time.Second)
		patchNodeB(ctx, b, name, map[string]any{"metadata": map[string]any{"annotations": map[string]any{record.AnnotationReclaimDeadline: deadline.UTC().Format(time.RFC3339)}}})
		seen := map[string]time.Duration{}
		for len(seen) < pods {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					b.Fatalf("the pod watch ended after %d of %d conditions", len(seen), pods)
				}
				p, isPod := ev.Object.(*v1.Pod)
				if !isPod {
					continue
				}
				if _, done := seen[p.Name]; done {
					continue
				}
				for _, c := range p.Status.Conditions {
					if c.Type == record.PodConditionInterruption && c.Status == v1.ConditionTrue {
						seen[p.Name] = time.Since(notice)
					}
				}
			case <-ctx.Done():
				b.Fatalf("%d of %d pods warned before the timeout:\n%s", len(seen), pods, rp.LogTail(30))
			}
		}
		b.StopTimer()
		w.Stop()
		nw.Stop()
		<-taintSeen
		tainted := taintAt.Sub(notice)
		times := slices.Sorted(maps.Values(seen))
		lasts, medians = append(lasts, times[len(times)-1]), append(medians, times[len(times)/2])
		afterTaint = append(afterTaint, times[len(times)-1]-tainted)
		b.Logf("run %d: notice to condition on %d pods: first %s, median %s, last %s; the taint at %s, so the last %s after it", i+1, pods,
			times[0].Round(time.Millisecond), times[len(times)/2].Round(time.Millisecond), times[len(times)-1].Round(time.Millisecond),
			tainted.Round(time.Millisecond), (times[len(times)-1] - tainted).Round(time.Millisecond))
		_ = rp.Stop()
		_ = env.Client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
		cancel()
	}
	b.ReportMetric(slices.Max(lasts).Seconds(), "s-last-pod-worst")
	b.ReportMetric(slices.Max(medians).Seconds(), "s-median-pod-worst")
	b.ReportMetric(slices.Max(afterTaint).Seconds(), "s-taint-to-last-pod-worst")
}

func patchNodeB(ctx context.Context, b *testing.B, node string, patch map[string]any) {
	b.Helper()
	body, err := json.Marshal(patch)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := env.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		b.Fatalf("patching node %s: %v", node, err)
	}
}
