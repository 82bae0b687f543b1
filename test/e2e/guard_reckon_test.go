package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/guard"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestEvictionGuardReckonsPodsThatOutliveTheReclaim: the count of pods that outlived their
// node's reclaim is kept where it survives the node (issue 48, item 4). Two real agents, each
// with its pod-bound token, through one interruption on the real API server, with the guard as
// the chart renders it:
//
//   - node A: a pod the agent evicts in time, a pod held past the deadline, a pod that
//     tolerates the interruption forever and the agent's own DaemonSet pod (neither planned, so
//     neither counted);
//   - node B: a pod the agent evicts in time.
//
// "Held" is a finalizer: kwok leaves a pod with finalizers in place (testenv.PodDeleteStage),
// which stands in for a kubelet that has not confirmed the pod's end by the reclaim. (A real
// kubelet moves a pod whose containers stopped to Failed; the reckoner counts a finished pod as
// gone, so a finalizer alone would not count there.)
//
// The guard counts one reclaim with one pod outlived (node A), one clear (node B), and names the
// held pod in its log; nothing else.
func TestEvictionGuardReckonsPodsThatOutliveTheReclaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, sa, nodeA, nodeB = "reckon", "reprieve-reckon", "reckon-a", "reckon-b"
	c := env.Client
	kubeA := boundAgents(ctx, t, ns, sa, nodeA, nodeB)
	agentB, err := c.CoreV1().Pods(ns).Get(ctx, "agent-"+nodeB, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeB, err := env.BoundServiceAccountKubeconfig(ctx, ns, sa, agentB)
	if err != nil {
		t.Fatal(err)
	}
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	if err := scenario.Create(ctx, c, ns, nodeA, taint, []scenario.Pod{
		{Name: "held", Kind: scenario.Plain, Grace: ptr64(1)},
		{Name: "forever", Kind: scenario.Plain, Tolerate: ptr64(scenario.Forever), Grace: ptr64(1)},
	}); err != nil {
		t.Fatal(err)
	}
	const finalizer = "reprieve.test/held"
	setFinalizers := func(v string) {
		if _, err := c.CoreV1().Pods(ns).Patch(context.Background(), "held", types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":`+v+`}}`), metav1.PatchOptions{}); err != nil {
			t.Errorf("setting held's finalizers: %v", err)
		}
	}
	setFinalizers(`["` + finalizer + `"]`)
	t.Cleanup(func() { setFinalizers("null") })

	startEvictionGuard(ctx, t, sa, ns)
	host := guardHost(ctx, t, sa, ns)
	// The guard's index watches every bound pod, so it reckons the other tests' reclaims too: the
	// counters are judged by how much they moved, and each node by the guard's log, which names
	// the node of every reckoning.
	outlived0 := guardMetric(t, host, `reprieve_guard_pods_outlived_reclaim_total`)
	for node, kube := range map[string]string{nodeA: kubeA, nodeB: kubeB} {
		rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+kube, "--provider=none")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rp.Stop() })
	}
	deadline := time.Now().Add(25 * time.Second).Truncate(time.Second)
	for _, node := range []string{nodeA, nodeB} {
		setDeadline(ctx, t, node, deadline.UTC().Format(time.RFC3339))
	}
	// The agents mark the pods they plan (their pod notice), which is what the guard reckons.
	waitFor(ctx, t, "the agents' marks on the planned pods", func() bool {
		for _, name := range []string{"held", "victim-" + nodeA, "victim-" + nodeB} {
			p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Annotations[record.AnnotationEvictAt] == "" {
				return false
			}
		}
		return true
	})
	if p, err := c.CoreV1().Pods(ns).Get(ctx, "forever", metav1.GetOptions{}); err != nil || p.Annotations[record.AnnotationEvictAt] != "" {
		t.Errorf("the pod that tolerates the interruption forever carries evict-at (%v); the guard would count it", err)
	}

	// reckonings are the guard's log lines that reckon this test's nodes.
	reckonings := func() []string {
		var out []string
		for _, line := range strings.Split(guardLogText(t, sa, ns), "\n") {
			if strings.Contains(line, "reckon.go") && (strings.Contains(line, `node="`+nodeA+`"`) || strings.Contains(line, `node="`+nodeB+`"`)) {
				out = append(out, line)
			}
		}
		return out
	}
	waitLong(ctx, t, time.Until(deadline)+30*time.Second, "both reclaims reckoned", func() bool {
		var a, b bool
		for _, l := range reckonings() {
			a = a || strings.Contains(l, `node="`+nodeA+`"`)
			b = b || strings.Contains(l, `node="`+nodeB+`"`)
		}
		return a && b
	})
	// Each reckoning is logged at or after the deadline's settle, by the guard's own clock (klog's
	// header: "E1205 13:57:48.640886", UTC here).
	for _, l := range reckonings() {
		f := strings.Fields(l)
		at, err := time.Parse("0102 15:04:05.000000", f[0][1:]+" "+f[1])
		if err != nil {
			t.Fatalf("a guard log line without klog's header: %s", l)
		}
		at = at.AddDate(deadline.UTC().Year(), 0, 0)
		if at.Before(deadline.Add(guard.DefaultReckonSettle)) {
			t.Errorf("reckoned at %s, %v after the deadline; want at least the settle, %v", at.Format(time.StampMicro), at.Sub(deadline), guard.DefaultReckonSettle)
		}
	}
	var outlivedLines, clearB int
	for _, l := range reckonings() {
		switch {
		case strings.Contains(l, "outlived its node's reclaim deadline"):
			outlivedLines++
			if !strings.Contains(l, `node="`+nodeA+`"`) || !strings.Contains(l, `pod="`+ns+`/held"`) {
				t.Errorf("the guard counts another pod as outliving the reclaim: %s", l)
			}
		case strings.Contains(l, "was gone by its node's reclaim deadline"):
			if strings.Contains(l, `node="`+nodeA+`"`) {
				t.Errorf("node A counted clear, with held still there: %s", l)
			}
			clearB++
		default:
			t.Errorf("a reckoning of this test's nodes that is neither: %s", l)
		}
	}
	if outlivedLines != 1 || clearB != 1 {
		t.Errorf("the guard's log counts %d pods outlived and %d clear reclaims of this test's nodes; want held alone, and node B clear:\n%s",
			outlivedLines, clearB, strings.Join(reckonings(), "\n"))
	}
	if d := guardMetric(t, host, `reprieve_guard_pods_outlived_reclaim_total`) - outlived0; d < 1 {
		t.Errorf("reprieve_guard_pods_outlived_reclaim_total moved by %v; want at least held's 1", d)
	}
	p, err := c.CoreV1().Pods(ns).Get(ctx, "held", metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp == nil {
		t.Errorf("held: %v; want it evicted (terminating, held by its finalizer)", err)
	}
}
