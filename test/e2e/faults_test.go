package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/reprieve-dev/reprieve/agent"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestRestartMidInterruption kills the agent (SIGKILL) once the pods due at the taint are
// evicted and starts a new one: the remaining pods leave on their original plan (counted from
// the taint's timeAdded, not from the restart), nothing is evicted twice, and a SIGTERM then
// stops the agent cleanly with the node's state intact.
func TestRestartMidInterruption(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "restart", "restart-node"
	c := env.Client
	if err := env.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := env.CreateNode(ctx, node, nil); err != nil {
		t.Fatal(err)
	}
	taint, _ := agent.ParseTaint(agent.DefaultConfig().InterruptionTaint)
	var pods []scenario.Pod
	for i := range 3 {
		pods = append(pods, scenario.Pod{Name: fmt.Sprintf("now-%d", i), Kind: scenario.Plain, Grace: ptr64(1)})
	}
	later := map[string]time.Duration{"later-15": 15 * time.Second, "later-20": 20 * time.Second, "later-25": 25 * time.Second}
	for name, d := range later {
		pods = append(pods, scenario.Pod{Name: name, Kind: scenario.Plain, Tolerate: ptr64(int64(d / time.Second)), Grace: ptr64(1)})
	}
	if err := scenario.Create(ctx, c, ns, node, taint, pods); err != nil {
		t.Fatal(err)
	}
	obs, err := scenario.Observe(ctx, c, ns)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Stop()
	args := []string{"--kubeconfig=" + agentKubeconfig, "--provider=none"}
	first, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Stop() }()
	deadline := time.Now().Add(60 * time.Second).UTC().Truncate(time.Second)
	patchNode(ctx, t, map[string]any{"metadata": map[string]any{"annotations": map[string]any{agent.AnnotationReclaimDeadline: deadline.Format(time.RFC3339)}}}, node)
	n := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	timeAdded := taintOf(n, taint).TimeAdded.Time

	waitFor(ctx, t, "the pods due at once evicted", func() bool {
		recs := obs.Records()
		for i := range 3 {
			if recs[fmt.Sprintf("now-%d", i)].DeletedAt.IsZero() {
				return false
			}
		}
		return true
	})
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	restartedAt := time.Now()
	second, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node+"-2", append(args, "--node-name="+node)...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = second.Stop() }()

	waitFor(ctx, t, "the tolerating pods evicted", func() bool {
		recs := obs.Records()
		for name := range later {
			if recs[name].DeletedAt.IsZero() {
				return false
			}
		}
		return true
	})
	recs := obs.Records()
	for name, d := range later {
		planned := timeAdded.Add(d)
		if got := recs[name].DeletedAt; got.Before(planned.Add(-slack)) || got.After(planned.Add(slack)) {
			t.Errorf("pod %s: evicted at T%+.2fs, planned T%+.0fs (restart at T%+.2fs): the countdown must run from timeAdded",
				name, got.Sub(timeAdded).Seconds(), d.Seconds(), restartedAt.Sub(timeAdded).Seconds())
		}
	}
	if got := taintOf(getNode(ctx, t, node), taint).TimeAdded.Time; !got.Equal(timeAdded) {
		t.Errorf("timeAdded changed across the restart: %v, was %v", got, timeAdded)
	}
	// The new agent evicted exactly the three pods left (the others were already terminating
	// or gone, and a terminating pod is never evicted again).
	text, err := scenario.Scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, `reprieve_evictions_requests_total{result="evicted"} 3`) {
		t.Errorf("the restarted agent's evictions: %s", grep(text, "reprieve_evictions_requests_total"))
	}

	// SIGTERM: a clean stop within a few seconds; the node keeps the taint, the deadline and a
	// readable ownership record, so the next agent takes over.
	stopped := time.Now()
	if err := second.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := second.Wait(5 * time.Second); err != nil || code != 0 {
		t.Fatalf("SIGTERM: exit %d, %v", code, err)
	}
	t.Logf("stopped %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	n = getNode(ctx, t, node)
	if !hasTaint(n, taint.Key, taint.Effect) || n.Annotations[agent.AnnotationReclaimDeadline] == "" || !strings.Contains(n.Annotations[agent.AnnotationOwned], `"cloud:NoExecute"`) {
		t.Errorf("node state after SIGTERM: taints %+v annotations %v", n.Spec.Taints, n.Annotations)
	}
}

// TestConcurrentWriters: while reprieve taints and untaints its node, another client keeps
// rewriting the node's taints, labels and annotations with read-modify-write updates, as the
// node lifecycle controller and other agents do. No write of either side may drop the other's
// taint, and reprieve's own taint must be present exactly once.
func TestConcurrentWriters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const node = "writers-node"
	if _, err := env.CreateNode(ctx, node, nil); err != nil {
		t.Fatal(err)
	}
	taint, _ := agent.ParseTaint(agent.DefaultConfig().InterruptionTaint)
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	// The other writer: every few milliseconds, replace its own taint with a new value and
	// bump a label and an annotation, through Update with the resourceVersion it read.
	wctx, stopWriter := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var writes, conflicts, lastOK int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; wctx.Err() == nil; i++ {
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				n, err := env.Client.CoreV1().Nodes().Get(wctx, node, metav1.GetOptions{})
				if err != nil {
					return err
				}
				var taints []v1.Taint
				for _, t := range n.Spec.Taints {
					if t.Key != "writer.example.com/gen" {
						taints = append(taints, t)
					}
				}
				n.Spec.Taints = append(taints, v1.Taint{Key: "writer.example.com/gen", Value: fmt.Sprint(i), Effect: v1.TaintEffectNoSchedule})
				n.Labels["writer.example.com/gen"] = fmt.Sprint(i)
				if n.Annotations == nil {
					n.Annotations = map[string]string{}
				}
				n.Annotations["writer.example.com/gen"] = fmt.Sprint(i)
				_, err = env.Client.CoreV1().Nodes().Update(wctx, n, metav1.UpdateOptions{})
				if apierrors.IsConflict(err) {
					conflicts++
				}
				return err
			})
			if err == nil {
				writes++
				lastOK = i
			}
		}
	}()

	// Reprieve's side: set and withdraw the deadline three times during the writes.
	for round := range 3 {
		deadline := time.Now().Add(5 * time.Minute).UTC().Truncate(time.Second).Format(time.RFC3339)
		patchNode(ctx, t, map[string]any{"metadata": map[string]any{"annotations": map[string]any{agent.AnnotationReclaimDeadline: deadline}}}, node)
		waitNode(ctx, t, node, fmt.Sprintf("the taint (round %d)", round), func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
		patchNode(ctx, t, map[string]any{"metadata": map[string]any{"annotations": map[string]any{agent.AnnotationReclaimDeadline: nil}}}, node)
		waitNode(ctx, t, node, fmt.Sprintf("the undo (round %d)", round), func(n *v1.Node) bool { return !hasTaint(n, taint.Key, taint.Effect) })
	}
	deadline := time.Now().Add(5 * time.Minute).UTC().Truncate(time.Second).Format(time.RFC3339)
	patchNode(ctx, t, map[string]any{"metadata": map[string]any{"annotations": map[string]any{agent.AnnotationReclaimDeadline: deadline}}}, node)
	waitNode(ctx, t, node, "the final taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	stopWriter()
	wg.Wait()
	t.Logf("the other writer made %d writes (%d conflicts) while reprieve wrote", writes, conflicts)
	if writes < 10 {
		t.Fatalf("only %d concurrent writes: the test did not contend", writes)
	}

	n := getNode(ctx, t, node)
	count, writer := 0, 0
	for _, tt := range n.Spec.Taints {
		switch tt.Key {
		case taint.Key:
			count++
		case "writer.example.com/gen":
			writer++
		}
	}
	if count != 1 {
		t.Errorf("reprieve's taint present %d times, want exactly once: %+v", count, n.Spec.Taints)
	}
	// Nothing of the other writer was dropped or rolled back by a reprieve write: its last
	// successful write is what the node holds.
	last := fmt.Sprint(lastOK)
	if writer != 1 || taintOf(n, v1.Taint{Key: "writer.example.com/gen", Effect: v1.TaintEffectNoSchedule}).Value != last ||
		n.Labels["writer.example.com/gen"] != last || n.Annotations["writer.example.com/gen"] != last {
		t.Errorf("the other writer's last write (%s) is not what the node holds: taints %+v, label %q, annotation %q",
			last, n.Spec.Taints, n.Labels["writer.example.com/gen"], n.Annotations["writer.example.com/gen"])
	}
}

func getNode(ctx context.Context, t *testing.T, name string) *v1.Node {
	t.Helper()
	n, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func taintOf(n *v1.Node, want v1.Taint) v1.Taint {
	for _, t := range n.Spec.Taints {
		if t.Key == want.Key && t.Effect == want.Effect {
			return t
		}
	}
	return v1.Taint{TimeAdded: &metav1.Time{}}
}
