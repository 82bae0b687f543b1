package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestProviderNoneAnnotationRoundTrip drives reprieve through the node annotation (--provider
// none): setting it taints and evicts; removing it undoes exactly what reprieve added and
// nothing that another writer had put on the node.
func TestProviderNoneAnnotationRoundTrip(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "none", "none-node"
	c := env.Client
	setupNode(ctx, t, ns, node, map[string]string{"team": "a"})
	other := v1.Taint{Key: "dedicated", Value: "gpu", Effect: v1.TaintEffectNoSchedule}
	patchNode(ctx, t, map[string]any{"spec": map[string]any{"taints": []v1.Taint{other}}}, node)

	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	pods := []scenario.Pod{
		{Name: "evictee", Kind: scenario.Plain, Grace: ptr64(2)},
		{Name: "stays", Kind: scenario.Plain, Tolerate: ptr64(scenario.Forever), Grace: ptr64(2)},
	}
	if err := scenario.Create(ctx, c, ns, node, taint, pods); err != nil {
		t.Fatal(err)
	}
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	deadline := time.Now().Add(40 * time.Second).UTC().Truncate(time.Second).Format(time.RFC3339)
	setDeadline(ctx, t, node, deadline)
	n := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	if n.Labels[v1.LabelNodeExcludeBalancers] != "true" {
		t.Errorf("label %s missing: %v", v1.LabelNodeExcludeBalancers, n.Labels)
	}
	waitFor(ctx, t, "evictee evicted", func() bool {
		p, err := c.CoreV1().Pods(ns).Get(ctx, "evictee", metav1.GetOptions{})
		return err != nil || p.DeletionTimestamp != nil
	})

	// The operator withdraws the deadline.
	setDeadline(ctx, t, node, "")
	n = waitNode(ctx, t, node, "the interruption taint removed", func(n *v1.Node) bool { return !hasTaint(n, taint.Key, taint.Effect) })
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != other.Key {
		t.Errorf("taints after undo = %+v, want only the other writer's %s", n.Spec.Taints, other.Key)
	}
	if _, ok := n.Labels[v1.LabelNodeExcludeBalancers]; ok || n.Labels["team"] != "a" {
		t.Errorf("labels after undo = %v", n.Labels)
	}
	if _, ok := n.Annotations[record.AnnotationOwned]; ok {
		t.Errorf("ownership record left: %v", n.Annotations)
	}
	if p, err := c.CoreV1().Pods(ns).Get(ctx, "stays", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("the pod tolerating forever was touched: %v", err)
	}

	// A malformed deadline is an error in the log, not a notice: nothing is tainted.
	setDeadline(ctx, t, node, "tomorrow")
	waitFor(ctx, t, "the parse error in the log", func() bool { return strings.Contains(rp.LogTail(200), "tomorrow") })
	if n, _ := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); hasTaint(n, taint.Key, taint.Effect) {
		t.Error("a malformed deadline tainted the node")
	}
	if err := rp.Stop(); err != nil {
		t.Fatal(err)
	}
	if code, err := rp.Wait(time.Second); err != nil || code != 0 {
		t.Errorf("reprieve exit %d, %v; want 0 after SIGTERM", code, err)
	}
}

func patchNode(ctx context.Context, t *testing.T, patch map[string]any, node string) {
	t.Helper()
	b, err := json.Marshal(patch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		t.Fatalf("patching node %s with %s: %v", node, b, err)
	}
}

func waitNode(ctx context.Context, t *testing.T, node, what string, cond func(*v1.Node) bool) *v1.Node {
	t.Helper()
	var last *v1.Node
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = n
		return cond(n), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s on %s: %v (last taints %+v)", what, node, err, last)
	}
	return last
}

func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, waitBound, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// waitBound is how long waitFor waits for a condition.
const waitBound = 30 * time.Second

func ptr64(v int64) *int64 { return &v }
