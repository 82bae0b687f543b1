package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/agent"
	"github.com/reprieve-dev/reprieve/agent/guard"
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
	taint, _ := agent.ParseTaint(agent.DefaultConfig().InterruptionTaint)
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
	for _, o := range []string{guard.ReckonClear, guard.ReckonOutlived, guard.ReckonUnknown} {
		if v := guardMetric(t, host, `reprieve_guard_reclaims_total{outcome="`+o+`"}`); v != 0 {
			t.Fatalf("reclaims %s before any: %v", o, v)
		}
	}
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
			if err != nil || p.Annotations[agent.AnnotationEvictAt] == "" {
				return false
			}
		}
		return true
	})
	if p, err := c.CoreV1().Pods(ns).Get(ctx, "forever", metav1.GetOptions{}); err != nil || p.Annotations[agent.AnnotationEvictAt] != "" {
		t.Errorf("the pod that tolerates the interruption forever carries evict-at (%v); the guard would count it", err)
	}

	// Nothing is reckoned before the deadline has settled.
	time.Sleep(time.Until(deadline) - time.Second) // the deadline is the event under test
	if v := guardMetric(t, host, `reprieve_guard_reclaims_total{outcome="`+guard.ReckonOutlived+`"}`) +
		guardMetric(t, host, `reprieve_guard_reclaims_total{outcome="`+guard.ReckonClear+`"}`); v != 0 {
		t.Errorf("reclaims reckoned a second before the deadline: %v; want none", v)
	}
	waitFor(ctx, t, "both reclaims reckoned", func() bool {
		return guardMetric(t, host, `reprieve_guard_reclaims_total{outcome="`+guard.ReckonOutlived+`"}`)+
			guardMetric(t, host, `reprieve_guard_reclaims_total{outcome="`+guard.ReckonClear+`"}`) >= 2
	})
	if d := time.Since(deadline); d < guard.DefaultReckonSettle {
		t.Errorf("reckoned %v after the deadline; want at least the settle, %v", d, guard.DefaultReckonSettle)
	}
	for series, want := range map[string]float64{
		`reprieve_guard_reclaims_total{outcome="` + guard.ReckonOutlived + `"}`: 1,
		`reprieve_guard_reclaims_total{outcome="` + guard.ReckonClear + `"}`:    1,
		`reprieve_guard_reclaims_total{outcome="` + guard.ReckonUnknown + `"}`:  0,
		`reprieve_guard_pods_outlived_reclaim_total`:                            1,
	} {
		if got := guardMetric(t, host, series); got != want {
			t.Errorf("%s = %v; want %v", series, got, want)
		}
	}
	log := guardLogText(t, sa, ns)
	if !strings.Contains(log, "outlived its node's reclaim deadline") || !strings.Contains(log, ns+"/held") {
		t.Errorf("the guard's log does not name %s/held as outliving the reclaim:\n%s", ns, log)
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "outlived its node's reclaim deadline") && !strings.Contains(line, ns+"/held") {
			t.Errorf("the guard's log counts another pod as outliving the reclaim: %s", line)
		}
	}
	p, err := c.CoreV1().Pods(ns).Get(ctx, "held", metav1.GetOptions{})
	if err != nil || p.DeletionTimestamp == nil {
		t.Errorf("held: %v; want it evicted (terminating, held by its finalizer)", err)
	}
}
