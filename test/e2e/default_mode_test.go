package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// defaultModeKeepsDaemonSetsAndBudgets (issue 48, item 1) runs an interruption with the agent as
// a default install runs it (no --interruption-eviction: the binary's own default, which the
// chart passes on), beside kube-controller-manager's taint-eviction, node-lifecycle, disruption
// and daemonset controllers and kube-scheduler, as in every managed cluster. On the node: a real
// DaemonSet, a log shipper that tolerates nothing of the interruption taint (Fluent Bit's,
// Vector's and node-exporter's charts tolerate no custom taint by default), placed by the
// scheduler; a pod under a budget that allows no disruption; and pods due at once and at T+10 s.
//
// What a drain would keep must be kept: the log shipper runs, the same pod, until after the
// window's end; the budget holds until the pod's last safe moment, when reprieve deletes it;
// kube-controller-manager deletes nothing (no TaintManagerEviction event on any pod) and the
// daemonset controller replaces nothing. The node carries cloud=spot:NoSchedule, never the
// NoExecute taint.
func defaultModeKeepsDaemonSetsAndBudgets(ctx context.Context, t *testing.T) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if mode := config.DefaultConfig().InterruptionEviction; mode != string(plan.EvictionReprieve) {
		t.Fatalf("the binary's default --interruption-eviction is %q, want reprieve", mode)
	}
	const ns, node = "default-mode", "default-mode-node"
	shipper := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "log-shipper", Namespace: ns},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "log-shipper"}},
			Template: v1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "log-shipper"}},
				Spec: v1.PodSpec{
					// Only this test's node: the group's other nodes are other tests'.
					NodeSelector:                  map[string]string{"kubernetes.io/hostname": node},
					TerminationGracePeriodSeconds: ptr64(5),
					Containers:                    []v1.Container{{Name: "shipper", Image: "registry.k8s.io/pause:3.10"}},
				},
			},
		},
	}
	var before *v1.Pod
	beforeNotice := func(ctx context.Context) error {
		if _, err := env.Client.AppsV1().DaemonSets(ns).Create(ctx, shipper, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating the log shipper: %w", err)
		}
		// The daemonset controller creates its pod, kube-scheduler binds it, kwok runs it.
		return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			p := shipperPod(ctx, t, ns)
			if p != nil && p.Spec.NodeName == node && p.Status.Phase == v1.PodRunning {
				before = p
				return true, nil
			}
			return false, nil
		})
	}
	pods := []scenario.Pod{
		{Name: "no-toleration", Kind: scenario.Plain, Grace: ptr64(5)},
		{Name: "tolerate-10s", Kind: scenario.Plain, Tolerate: ptr64(10), Grace: ptr64(5)},
		{Name: "pdb-blocked", Kind: scenario.Plain, Grace: ptr64(5), PDB: true},
	}
	// A subtest of TestWithTaintEvictionController, in the serial phase: kwok runs its pods at once.
	scenario.InstantTemplate(&shipper.Spec.Template)
	res := runSpot(ctx, t, scenario.SpotOptions{Namespace: ns, Node: node, Pods: scenario.InstantAll(pods), BinaryDefault: true, BeforeNotice: beforeNotice})
	defer func() {
		if t.Failed() {
			t.Logf("reprieve's log, the lines about pods and errors:\n%s", res.AgentLines(80))
		}
	}()
	if !env.ControllerManagerRunning("taint-eviction-controller") || !env.ControllerManagerRunning("daemonset") {
		t.Fatal("kube-controller-manager's taint-eviction or daemonset controller is not running: the test proves nothing")
	}
	if !hasTaint(res.Node, "cloud", v1.TaintEffectNoSchedule) || hasTaint(res.Node, "cloud", v1.TaintEffectNoExecute) {
		t.Errorf("taints %+v; want cloud=spot:NoSchedule and no NoExecute one", res.Node.Spec.Taints)
	}
	end := res.Window.End()
	if time.Now().Before(end) {
		t.Fatalf("the scenario ended at %v, before the window's end %v: the log shipper's fate is not known yet", time.Now(), end)
	}

	// The log shipper: the same pod, running, after the window's end.
	after := shipperPod(ctx, t, ns)
	switch {
	case after == nil:
		t.Errorf("the log shipper's pod is gone; want it running to the window's end")
	case after.UID != before.UID || after.DeletionTimestamp != nil || after.Status.Phase != v1.PodRunning:
		t.Errorf("the log shipper's pod at T%+.1fs: %s (UID %s, deleting %v, %s); want the pod of before the notice, %s, running",
			time.Since(res.TimeAdded).Seconds(), after.Name, after.UID, after.DeletionTimestamp != nil, after.Status.Phase, before.UID)
	}
	if row, ok := res.Row(before.Name); !ok || !row.Record.DeletedAt.IsZero() || !strings.Contains(row.Note, "daemonset") {
		t.Errorf("the log shipper's row %+v; want left alone as a DaemonSet pod, never deleted", row)
	}

	// Nothing deleted by kube-controller-manager; each pod at reprieve's plan.
	for _, row := range res.Rows {
		if row.KubeControllerManager {
			t.Errorf("pod %s: kube-controller-manager marked it for deletion", row.Pod)
		}
	}
	exp := map[string]expectation{
		"no-toleration": expected["no-toleration"],
		"tolerate-10s":  expected["tolerate-10s"],
		"pdb-blocked":   expected["pdb-blocked"],
	}
	assertAsPlanned(t, res, exp)

	// The budget held until the last safe moment, then reprieve deleted the pod.
	row, _ := res.Row("pdb-blocked")
	last := lastStart(end, 5*time.Second).Add(-plan.EvictionLead)
	if d := row.Record.DeletedAt; d.IsZero() || d.Before(last.Add(-slack)) {
		t.Errorf("pdb-blocked: deleted at T%+.2fs; want not before its last safe moment T%+.2fs", d.Sub(res.TimeAdded).Seconds(), last.Sub(res.TimeAdded).Seconds())
	}
	reasons := res.EventReasons()
	if reasons["pdb-blocked "+events.ReasonEvictionBlocked] == 0 || reasons["pdb-blocked "+events.ReasonForceDeleted] == 0 {
		t.Errorf("pdb-blocked: events %v; want %s, then %s", reasons, events.ReasonEvictionBlocked, events.ReasonForceDeleted)
	}
	if !strings.Contains(res.Metrics, `reprieve_evictions_missed_deadline_total 0`) {
		t.Errorf("metrics: %s", grep(res.Metrics, "reprieve_evictions_missed_deadline_total"))
	}
	samples := 0
	for _, l := range strings.Split(res.Metrics, "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			samples++
		}
	}
	t.Logf("log shipper %s ran through the window (end T%+.1fs); pdb-blocked deleted at T%+.2fs; kube-controller-manager deleted nothing; the agent's /metrics held %d samples",
		before.Name, end.Sub(res.TimeAdded).Seconds(), row.Record.DeletedAt.Sub(res.TimeAdded).Seconds(), samples)
}

// shipperPod is the log shipper's pod in ns, nil when there is none.
func shipperPod(ctx context.Context, t *testing.T, ns string) *v1.Pod {
	t.Helper()
	list, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=log-shipper"})
	if err != nil || len(list.Items) == 0 {
		return nil
	}
	if len(list.Items) > 1 {
		t.Errorf("%d log shipper pods; want one: the daemonset controller replaced it", len(list.Items))
	}
	return &list.Items[0]
}
