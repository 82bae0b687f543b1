package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/record"
)

// reprievesMarks lists what of reprieve's a node carries: taints of reprieve.io/ or the
// interruption taint's key, reprieve.io/ annotations, the load-balancer label, reprieve's
// conditions (its own, and KEP-5683's lifecycle conditions).
func reprievesMarks(n *v1.Node, interruptionKey string) []string {
	var out []string
	for _, t := range n.Spec.Taints {
		if strings.HasPrefix(t.Key, record.Prefix) || t.Key == interruptionKey {
			out = append(out, "taint "+record.TaintID(t))
		}
	}
	for k := range n.Annotations {
		if strings.HasPrefix(k, record.Prefix) {
			out = append(out, "annotation "+k)
		}
	}
	if _, ok := n.Labels[record.LabelExcludeFromLB]; ok {
		out = append(out, "label "+record.LabelExcludeFromLB)
	}
	for _, c := range n.Status.Conditions {
		// No other writer sets the lifecycle conditions on this test's node.
		if c.Type == record.ConditionInterruption || slices.Contains(record.LifecycleConditions, c.Type) {
			out = append(out, "condition "+string(c.Type))
		}
	}
	return out
}

// TestLifecycleUninstallLeavesTheNodeClean runs the agent until it has put its pressure taint
// (thresholds the host always crosses) and its maintenance taint (an AWS scheduled event two hours
// ahead, from amazon-ec2-metadata-mock) and their records on its node, with its lifecycle
// conditions; then uninstalls as the chart does: the agent stops (the DaemonSet is deleted), and
// the chart's post-delete hook objects are applied (rendered with helm template) and its Job's
// command runs with the hook's ServiceAccount, against this node. Before that, the test proves
// on the real API server that this identity may not write outside reprieve's keys: adding a label,
// removing another writer's taint, changing another annotation, or removing the kubelet's
// condition are refused by the hook's policies, and `reprieve cleanup --require-confined` with
// an identity the policies do not bind refuses to clean. After it, the node carries nothing of
// reprieve's, and everything of everyone else's.
func TestLifecycleUninstallLeavesTheNodeClean(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, node, release = "lc-uninstall", "lc-uninstall-node", "lcu"
	c := env.Client
	setupNode(ctx, t, ns, node, nil)
	// Another writer's taint and annotation, which must stay.
	patch := []byte(`{"metadata":{"annotations":{"example.com/owner":"platform"}},"spec":{"taints":[{"key":"dedicated","value":"gpu","effect":"NoSchedule"}]}}`)
	if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	interruption, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	maintenance, _ := config.ParseTaint(config.DefaultConfig().MaintenanceTaint)
	mock := startEventsMock(ctx, t, "active", time.Now().Add(2*time.Hour).UTC().Truncate(time.Second))
	rp := startAgent(ctx, t, node, mock, "--maintenance-lead=10m", "--lifecycle-conditions",
		"--pressure-source=host", "--host-root=/", "--kubelet-root-dir=/", "--imagefs-dir=/", "--kubelet-config=/nonexistent/config.yaml",
		"--pressure-thresholds=memory.available<1000Ti", "--pressure-interval=200ms", "--pressure-transition-period=1s")
	n := waitNode(ctx, t, node, "the pressure and maintenance taints", func(n *v1.Node) bool {
		return hasTaint(n, maintenance.Key, maintenance.Effect) && hasTaint(n, "reprieve.io/memory-pressure", v1.TaintEffectNoSchedule)
	})
	before := reprievesMarks(n, interruption.Key)
	t.Logf("reprieve's marks on the node before the uninstall: %v", before)
	if len(before) < 3 {
		t.Fatalf("the node carries %v; want reprieve's two taints and its owned record at least", before)
	}
	// helm uninstall deletes the DaemonSet: the agent gets SIGTERM.
	stopAgent(t, rp)

	// The chart's post-delete hook, as helm renders it with a cluster (helm install, uninstall;
	// `helm template` without one renders no hook: issue 49, item 2); the Job is run here as a
	// process.
	manifest, err := helm(t, "template", release, chartDir, "--namespace", ns, "--set", "cloud=aws", "--show-only", "templates/cleanup.yaml",
		"--dry-run=server", "--kubeconfig", env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	var hooks []*unstructured.Unstructured
	var job batchv1.Job
	for _, o := range manifestObjects(t, "cleanup.yaml", manifest) {
		if o.GetAnnotations()["helm.sh/hook"] != "post-delete" {
			t.Errorf("%s %s is not a post-delete hook", o.GetKind(), o.GetName())
		}
		if o.GetKind() == "Job" {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &job); err != nil {
				t.Fatal(err)
			}
			continue
		}
		hooks = append(hooks, o)
	}
	if job.Name == "" || job.Spec.Template.Spec.ServiceAccountName != release+"-reprieve-cleanup" {
		t.Fatalf("the hook's Job %q runs as %q; want %s-reprieve-cleanup", job.Name, job.Spec.Template.Spec.ServiceAccountName, release)
	}
	ap := newApplier(t)
	t.Cleanup(func() { ap.deleteAll(context.Background(), hooks) })
	ap.serverSide(ctx, t, "helm", hooks)
	kube, err := env.ServiceAccountKubeconfig(ctx, ns, job.Spec.Template.Spec.ServiceAccountName)
	if err != nil {
		t.Fatal(err)
	}
	cl := clientFor(t, kube)

	// Writes outside reprieve's keys, each refused by the hook's policies. Server-side dry runs
	// (admission runs on them as on writes), so that a write the policies let through changes
	// nothing; and only once the policies are in force (they are not the moment they exist).
	dryRun := []string{metav1.DryRunAll}
	nodePatch := func(p string) func() error {
		return func() error {
			_, err := cl.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(p), metav1.PatchOptions{DryRun: dryRun})
			return err
		}
	}
	if !eventually(ctx, 30*time.Second, func() bool {
		return apierrors.IsForbidden(nodePatch(`{"metadata":{"labels":{"example.com/probe":"y"}}}`)())
	}) {
		t.Fatal("the cleanup policies never came in force")
	}
	// Each write is tried until its policy refuses it, for as long as the probe above may wait:
	// the policies come in force one by one (the API server loads each policy and binding on its
	// own), and under make test on two loaded cores the one on nodes/status was not yet in force
	// when the probe's was. The writes are dry runs: a try the policy lets through changes
	// nothing, and one it never refuses, or refuses for another reason, still fails.
	refused := func(what string, do func() error, want string) {
		t.Helper()
		var err error
		eventually(ctx, 30*time.Second, func() bool {
			err = do()
			return apierrors.IsForbidden(err) && strings.Contains(err.Error(), want)
		})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("the cleanup identity %s: %v; want a 403 from its policy (%q)", what, err, want)
		}
	}
	refused("adding a label", nodePatch(`{"metadata":{"labels":{"example.com/x":"y"}}}`), "may only remove the node.kubernetes.io/exclude-from-external-load-balancers label")
	refused("changing another writer's annotation", nodePatch(`{"metadata":{"annotations":{"example.com/owner":"me"}}}`), "may only remove reprieve.io/ annotations")
	refused("adding a reprieve annotation", nodePatch(`{"metadata":{"annotations":{"reprieve.io/x":"y"}}}`), "may only remove reprieve.io/ annotations")
	refused("removing another writer's taint", func() error {
		cur, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var keep []v1.Taint
		for _, t := range cur.Spec.Taints {
			if t.Key != "dedicated" {
				keep = append(keep, t)
			}
		}
		p, err := json.Marshal(map[string]any{"spec": map[string]any{"taints": keep}})
		if err != nil {
			return err
		}
		_, err = cl.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, p, metav1.PatchOptions{DryRun: dryRun})
		return err
	}, "may only remove reprieve's taints")
	refused("removing the kubelet's Ready condition", func() error {
		_, err := cl.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType,
			[]byte(`{"status":{"conditions":[{"type":"Ready","$patch":"delete"}]}}`), metav1.PatchOptions{DryRun: dryRun}, "status")
		return err
	}, "may only remove reprieve's node conditions")

	// An identity the policies do not confine: --require-confined refuses to clean with it.
	out, err := exec.CommandContext(ctx, reprieveBin, "cleanup", "--kubeconfig="+env.Kubeconfig, "--node="+node, "--require-confined=2s").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "may write outside reprieve's keys") {
		t.Errorf("cleanup as the admin with --require-confined: %v\n%s; want exit 1, refusing", err, out)
	}
	if n, _ := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); len(reprievesMarks(n, interruption.Key)) == 0 {
		t.Error("the refused cleanup removed reprieve's marks anyway")
	}

	// The hook's command, with its identity, on this node only (the cluster's other nodes are
	// other tests').
	args := []string{"--kubeconfig=" + kube}
	for _, a := range job.Spec.Template.Spec.Containers[0].Args {
		if a == "--all-nodes" {
			a = "--node=" + node
		}
		args = append(args, a)
	}
	out, err = exec.CommandContext(ctx, reprieveBin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("the hook's cleanup %q: %v\n%s", args, err, out)
	}
	t.Logf("reprieve %s:\n%s", strings.Join(args, " "), out)
	n, err = c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if left := reprievesMarks(n, interruption.Key); len(left) != 0 {
		t.Errorf("after the uninstall the node still carries %v; want nothing of reprieve's", left)
	}
	if !hasTaint(n, "dedicated", v1.TaintEffectNoSchedule) || n.Annotations["example.com/owner"] != "platform" {
		t.Errorf("the cleanup removed another writer's taint or annotation: %v %v", n.Spec.Taints, n.Annotations)
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == v1.NodeReady {
			return
		}
	}
	t.Errorf("the node lost its Ready condition: %v", n.Status.Conditions)
}
