package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/agent"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// TestInstallDaemonSet applies the shipped DaemonSet (deploy/manifests/daemonset.yaml) to the
// real API server with kube-controller-manager's daemonset and taint-eviction controllers and
// kube-scheduler running, and several kwok nodes: one reprieve pod lands on each selected (spot)
// node and none elsewhere; the interruption taint and reprieve's own taints on a node evict a
// pod that does not tolerate them, yet leave that node's reprieve pod running.
func TestInstallDaemonSet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns = "install"
	spot := map[string]string{"karpenter.sh/capacity-type": "spot"}
	nodes := []string{"install-spot-1", "install-spot-2", "install-spot-3"}
	setupNode(ctx, t, ns, nodes[0], spot)
	for _, n := range nodes[1:] {
		if _, err := env.CreateNode(ctx, n, spot); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.CreateNode(ctx, "install-on-demand", nil); err != nil {
		t.Fatal(err)
	}
	if err := env.StartControllerManager(ctx, "daemonset", "taint-eviction-controller"); err != nil {
		t.Fatal(err)
	}
	defer env.StopControllerManager()
	if err := env.StartScheduler(ctx); err != nil {
		t.Fatal(err)
	}
	defer env.StopScheduler()

	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(root, "deploy", "manifests", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := scenario.Apply(ctx, env.Client, manifest); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = env.Client.AppsV1().DaemonSets("kube-system").Delete(context.Background(), "reprieve", metav1.DeleteOptions{})
	}()
	agentPod := func(node string) *v1.Pod {
		list, err := env.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=reprieve"})
		if err != nil {
			t.Fatal(err)
		}
		var found *v1.Pod
		for i := range list.Items {
			if p := &list.Items[i]; p.Spec.NodeName == node {
				if found != nil {
					t.Errorf("two reprieve pods on %s: %s and %s", node, found.Name, p.Name)
				}
				found = p
			}
		}
		return found
	}
	waitFor(ctx, t, "one running reprieve pod on each spot node", func() bool {
		for _, n := range nodes {
			if p := agentPod(n); p == nil || p.Status.Phase != v1.PodRunning {
				return false
			}
		}
		return true
	})
	if p := agentPod("install-on-demand"); p != nil {
		t.Errorf("a reprieve pod on the node its nodeSelector leaves out: %s", p.Name)
	}

	// A workload pod that tolerates nothing: the taint-eviction controller deletes it once the
	// interruption taint is on, which shows the controller at work on this node.
	taint, _ := agent.ParseTaint(agent.DefaultConfig().InterruptionTaint)
	if err := scenario.Create(ctx, env.Client, ns, nodes[0], taint, []scenario.Pod{{Name: "workload", Kind: scenario.Plain, Grace: ptr64(1)}}); err != nil {
		t.Fatal(err)
	}
	before := agentPod(nodes[0])
	n, err := env.Client.CoreV1().Nodes().Get(ctx, nodes[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	cfg := agent.DefaultConfig()
	added := []v1.Taint{{Key: taint.Key, Value: taint.Value, Effect: taint.Effect, TimeAdded: &now}}
	for _, spec := range []string{cfg.RebalanceTaint, cfg.MaintenanceTaint} {
		t2, _ := agent.ParseTaint(spec)
		added = append(added, t2)
	}
	// The pressure taints of the pressure issue use these keys; the DaemonSet must tolerate them
	// already.
	for _, key := range []string{"reprieve.io/memory-pressure", "reprieve.io/disk-pressure", "reprieve.io/pid-pressure"} {
		added = append(added, v1.Taint{Key: key, Value: "true", Effect: v1.TaintEffectNoSchedule})
	}
	patchNode(ctx, t, map[string]any{"spec": map[string]any{"taints": append(n.Spec.Taints, added...)}}, nodes[0])
	waitFor(ctx, t, "the workload evicted by the taint-eviction controller", func() bool {
		p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "workload", metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
	})
	// Give the controllers a few seconds more to do anything else they would do.
	select {
	case <-time.After(3 * time.Second):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	after := agentPod(nodes[0])
	if after == nil || after.UID != before.UID || after.DeletionTimestamp != nil || after.Status.Phase != v1.PodRunning {
		t.Errorf("the reprieve pod on the tainted node: before %s, after %+v; want it still running (its tolerations hold)", before.UID, after)
	}
	var taints []string
	for _, tt := range added {
		taints = append(taints, tt.Key+":"+string(tt.Effect))
	}
	t.Logf("reprieve pods on %d spot nodes; on %s it survived %s", len(nodes), nodes[0], strings.Join(taints, ", "))
}
