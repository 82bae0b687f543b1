package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/interrupt"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestForeignPlatformSignals (issue 39 item 5): a node component's identity with a cluster-wide
// grant to patch nodes and nodes/status (node-problem-detector's, the EKS node monitoring
// agent's) writes, on an EKS node (spec.providerID aws://), AKS's PreemptScheduled condition
// dated and due an hour ago and GKE's impending-node-termination taint added an hour ago. The
// agent reads neither: no taint, no eviction, no notice. On a GKE node (gce://) the same taint
// is GKE's own signal and acts, with a deadline 30 s after the agent first saw it, not the
// writer's hour-old timeAdded.
func TestForeignPlatformSignals(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel) // after the parallel subtests, which run once this function returns
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	writer := nodeStatusWriter(ctx, t, "foreign-signals", "node-monitor")
	hourAgo := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))

	t.Run("on an EKS node", func(t *testing.T) {
		t.Parallel()
		ns, node := "foreign-eks", "foreign-eks-node"
		setupNodeWithProviderID(ctx, t, ns, node, "aws:///us-east-1a/i-0f0e0d0c0b0a09080")
		if err := scenario.Create(ctx, env.Client, ns, node, taint, []scenario.Pod{{Name: "evictee", Kind: scenario.Plain, Grace: ptr64(2)}}); err != nil {
			t.Fatal(err)
		}
		rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = rp.Stop() }()

		// AKS node-problem-detector's condition, through nodes/status as it writes it.
		statusPatch(ctx, t, writer, node, map[string]any{"status": map[string]any{"conditions": []v1.NodeCondition{{
			Type: "PreemptScheduled", Status: v1.ConditionTrue, Reason: "PreemptScheduled",
			Message:            "Preempt Scheduled: " + hourAgo.UTC().Format(http.TimeFormat) + ". EventId: 6C1D3F5E-FOREIGN",
			LastTransitionTime: hourAgo, LastHeartbeatTime: metav1.Now()}}}})
		writerAddTaint(ctx, t, writer, node, v1.Taint{Key: interrupt.TaintGKEImpendingTermination, Effect: v1.TaintEffectNoSchedule, TimeAdded: &hourAgo})
		// Karpenter's taint, read on every node and only reported, is the sentinel: once the
		// agent reports it, it has read the node with the foreign signals on it (the informer
		// delivers the updates in order), in the same reconcile.
		writerAddTaint(ctx, t, writer, node, v1.Taint{Key: interrupt.TaintKarpenterDisrupted, Effect: v1.TaintEffectNoSchedule})
		waitFor(ctx, t, "the sentinel's notice in the agent's log", func() bool {
			return strings.Contains(rp.LogTail(400), interrupt.SourceKarpenterDisrupted)
		})
		log := rp.LogTail(400)
		for _, src := range []string{interrupt.SourceAKSScheduledEvent, interrupt.SourceGKEImpendingTermination} {
			if strings.Contains(log, src) {
				t.Errorf("the agent took in another platform's signal %s on an EKS node:\n%s", src, log)
			}
		}
		n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if hasTaint(n, taint.Key, taint.Effect) {
			t.Errorf("the foreign signals tainted the node: %+v", n.Spec.Taints)
		}
		if p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "evictee", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
			t.Errorf("the pod was evicted for another platform's signal (%v)", err)
		}
	})

	t.Run("on a GKE node", func(t *testing.T) {
		t.Parallel()
		ns, node := "foreign-gke", "foreign-gke-node"
		setupNodeWithProviderID(ctx, t, ns, node, "gce://reprieve-e2e/us-central1-a/"+node)
		if err := scenario.Create(ctx, env.Client, ns, node, taint, []scenario.Pod{{Name: "evictee", Kind: scenario.Plain, Grace: ptr64(2)}}); err != nil {
			t.Fatal(err)
		}
		rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = rp.Stop() }()
		written := time.Now()
		writerAddTaint(ctx, t, writer, node, v1.Taint{Key: interrupt.TaintGKEImpendingTermination, Effect: v1.TaintEffectNoSchedule, TimeAdded: &hourAgo})
		waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
		var deadline time.Time
		waitFor(ctx, t, "the signal's notice in the agent's log", func() bool {
			deadline = noticeDeadline(rp.LogTail(400), interrupt.SourceGKEImpendingTermination)
			return !deadline.IsZero()
		})
		if earliest := written.Add(30 * time.Second).Truncate(time.Second); deadline.Before(earliest) {
			t.Errorf("deadline %s; want at least 30 s after the taint was written (%s), whatever its timeAdded (%s)",
				deadline.Format(time.RFC3339), earliest.Format(time.RFC3339), hourAgo.UTC().Format(time.RFC3339))
		}
	})
}

// nodeStatusWriter returns a client of a ServiceAccount that may get and patch every node and
// its status, and nothing else: the grant node-problem-detector and the EKS node monitoring
// agent have.
func nodeStatusWriter(ctx context.Context, t *testing.T, ns, name string) kubernetes.Interface {
	t.Helper()
	if err := env.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
	}}
	if _, err := env.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := env.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	kubeconfig, err := env.ServiceAccountKubeconfig(ctx, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	return clientFor(t, kubeconfig)
}

// setupNodeWithProviderID creates the namespace and the node, and sets the node's
// spec.providerID as a cloud's node controller does (once, from empty).
func setupNodeWithProviderID(ctx context.Context, t *testing.T, ns, node, providerID string) {
	t.Helper()
	setupNode(ctx, t, ns, node, nil)
	patchNode(ctx, t, map[string]any{"spec": map[string]any{"providerID": providerID}}, node)
}

// statusPatch sends a strategic merge patch of node's status with c.
func statusPatch(ctx context.Context, t *testing.T, c kubernetes.Interface, node string, patch map[string]any) {
	t.Helper()
	b, err := json.Marshal(patch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(fmt.Errorf("patching the status of node %s: %w", node, err))
	}
}

// writerAddTaint adds a taint with c, with the node's resourceVersion as a precondition.
func writerAddTaint(ctx context.Context, t *testing.T, c kubernetes.Interface, node string, taint v1.Taint) {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": n.ResourceVersion},
		"spec": map[string]any{"taints": append(n.Spec.Taints, taint)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		t.Fatal(fmt.Errorf("adding taint %s to node %s: %w", taint.Key, node, err))
	}
}

// noticeLine matches the deadline of the agent's "Notice received" log line (klog's text form
// of a time.Time, without its monotonic clock reading " m=+30.158509679").
var noticeLine = regexp.MustCompile(`"Notice received".*source="([^"]+)".*deadline="([^"]+?)(?: m=[^"]*)?"`)

// noticeDeadline returns the deadline the agent logged for the notice of source, zero when it
// logged none.
func noticeDeadline(log, source string) time.Time {
	for _, line := range strings.Split(log, "\n") {
		m := noticeLine.FindStringSubmatch(line)
		if m == nil || m[1] != source {
			continue
		}
		if d, err := time.Parse("2006-01-02 15:04:05.999999999 -0700 MST", m[2]); err == nil {
			return d
		}
	}
	return time.Time{}
}
