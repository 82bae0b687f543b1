// Package scenario holds the spot-interruption scenario that the end-to-end tests, the demo and
// the benchmarks share: a mixed workload on one node, a watcher that records what happened to
// each pod as the API server saw it, and a table of the outcome.
package scenario

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Kind says how a workload pod is owned.
type Kind string

// Pod kinds.
const (
	Plain     Kind = "plain"
	DaemonSet Kind = "daemonset"
	Mirror    Kind = "mirror"
)

// Pod describes one pod of the workload.
type Pod struct {
	Name string
	Kind Kind
	// Tolerate: nil means no toleration of the interruption taint; a pointer to -1 means
	// tolerate forever (no tolerationSeconds); otherwise tolerationSeconds.
	Tolerate *int64
	// Grace is terminationGracePeriodSeconds; nil leaves it unset (the API defaults 30).
	Grace *int64
	// PDB puts the pod under a PodDisruptionBudget that allows no disruption.
	PDB bool
	// ServiceAccount runs the pod as that ServiceAccount (tokens can then be bound to it);
	// empty means the namespace's default.
	ServiceAccount string
	// Edit, when set, changes the pod object before it is created (a preStop hook, a native
	// sidecar, a claim).
	Edit func(*v1.Pod)
}

// kwokStages are the stages of kwok's general pod lifecycle (testenv's default) that wait
// before a pod runs: each waits 1 s plus a jitter that makes it 1 to 5 s
// (sigs.k8s.io/kwok v0.8.0, kustomize/stage/pod/general, and Stage.Delay in
// pkg/utils/lifecycle/lifecycle.go), so a pod runs 2 to 10 s after its creation.
var kwokStages = []string{"pod-create", "pod-init-container-running", "pod-init-container-completed", "pod-ready"}

// Instant makes kwok run the pod as soon as it sees it: each general stage's delay and jitter
// set to zero through the per-pod annotations the stages read (a jitter no longer than the
// delay is the delay itself, lifecycle.go). It is for tests that run alone and only wait for
// their pods to run before they act: the parallel tests keep kwok's spread, which keeps their
// starts from reaching the API server at once.
func Instant(p *v1.Pod) { instant(&p.ObjectMeta) }

// InstantTemplate is Instant for the pods of a template (a DaemonSet's, for one).
func InstantTemplate(t *v1.PodTemplateSpec) { instant(&t.ObjectMeta) }

// InstantDaemonSets is an edit for Apply: InstantTemplate on every DaemonSet of the manifest.
func InstantDaemonSets(obj runtime.Object) {
	if ds, ok := obj.(*appsv1.DaemonSet); ok {
		InstantTemplate(&ds.Spec.Template)
	}
}

func instant(m *metav1.ObjectMeta) {
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	for _, s := range kwokStages {
		m.Annotations[s+".stage.kwok.x-k8s.io/delay"] = "0s"
		m.Annotations[s+".stage.kwok.x-k8s.io/jitter-delay"] = "0s"
	}
}

// InstantAll returns pods with Instant applied to each before its own Edit.
func InstantAll(pods []Pod) []Pod {
	out := make([]Pod, len(pods))
	for i, p := range pods {
		edit := p.Edit
		p.Edit = func(obj *v1.Pod) {
			Instant(obj)
			if edit != nil {
				edit(obj)
			}
		}
		out[i] = p
	}
	return out
}

// Forever is the Tolerate value for a toleration without tolerationSeconds.
const Forever = -1

func i64(v int64) *int64 { return &v }

// Toleration describes p's toleration for the table.
func (p Pod) Toleration() string {
	switch {
	case p.Tolerate == nil:
		return "none"
	case *p.Tolerate == Forever:
		return "forever"
	default:
		return fmt.Sprintf("%ds", *p.Tolerate)
	}
}

// GraceSeconds is the pod's effective grace.
func (p Pod) GraceSeconds() int64 {
	if p.Grace == nil {
		return 30
	}
	return *p.Grace
}

// Mixed is the mix for a reclaim window of at least 45 s: no toleration, short and long
// tolerationSeconds, zero, forever, grace longer than the window, the default grace, a PDB that
// allows no disruption, a DaemonSet pod and a mirror pod.
func Mixed() []Pod {
	return []Pod{
		{Name: "no-toleration", Kind: Plain, Grace: i64(5)},
		{Name: "tolerate-0s", Kind: Plain, Tolerate: i64(0), Grace: i64(3)},
		{Name: "tolerate-10s", Kind: Plain, Tolerate: i64(10), Grace: i64(5)},
		{Name: "tolerate-600s", Kind: Plain, Tolerate: i64(600), Grace: i64(10)},
		{Name: "tolerate-forever", Kind: Plain, Tolerate: i64(Forever), Grace: i64(5)},
		{Name: "default-grace", Kind: Plain},
		{Name: "grace-longer-than-window", Kind: Plain, Grace: i64(300)},
		{Name: "pdb-blocked", Kind: Plain, Grace: i64(5), PDB: true},
		{Name: "daemonset", Kind: DaemonSet, Grace: i64(5)},
		{Name: "mirror", Kind: Mirror, Grace: i64(5)},
	}
}

// Create creates the workload in namespace ns on node (bound directly, as kwok has no
// scheduler), with the DaemonSet and PodDisruptionBudget objects it refers to, and waits until
// every pod runs.
func Create(ctx context.Context, c kubernetes.Interface, ns, node string, taint v1.Taint, pods []Pod) error {
	var ds *appsv1.DaemonSet
	for _, p := range pods {
		if p.Kind == DaemonSet && ds == nil {
			// A real DaemonSet object for the owner reference; no daemonset controller runs, so
			// it creates no pods of its own.
			var err error
			ds, err = c.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{
				ObjectMeta: metav1.ObjectMeta{Name: "agent"},
				Spec: appsv1.DaemonSetSpec{
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}},
					Template: v1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "agent"}},
						Spec: v1.PodSpec{
							NodeSelector: map[string]string{"none": "none"},
							Containers:   []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
						},
					},
				},
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				// An earlier call for another node of the namespace created it.
				ds, err = c.AppsV1().DaemonSets(ns).Get(ctx, "agent", metav1.GetOptions{})
			}
			if err != nil {
				return fmt.Errorf("creating DaemonSet: %w", err)
			}
		}
		if p.PDB {
			zero := intstr.FromInt32(0)
			_, err := c.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
				ObjectMeta: metav1.ObjectMeta{Name: p.Name},
				Spec: policyv1.PodDisruptionBudgetSpec{
					MaxUnavailable: &zero,
					Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"pdb": p.Name}},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("creating PodDisruptionBudget %s: %w", p.Name, err)
			}
		}
	}
	for _, p := range pods {
		obj := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns, Labels: map[string]string{"workload": "scenario"}},
			Spec: v1.PodSpec{
				NodeName:                      node,
				TerminationGracePeriodSeconds: p.Grace,
				Containers:                    []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
				AutomountServiceAccountToken:  new(bool),
				ServiceAccountName:            p.ServiceAccount,
			},
		}
		if p.PDB {
			obj.Labels["pdb"] = p.Name
		}
		if p.Tolerate != nil {
			t := v1.Toleration{Key: taint.Key, Operator: v1.TolerationOpEqual, Value: taint.Value, Effect: v1.TaintEffectNoExecute}
			if *p.Tolerate != Forever {
				t.TolerationSeconds = p.Tolerate
			}
			obj.Spec.Tolerations = []v1.Toleration{t}
		}
		switch p.Kind {
		case DaemonSet:
			obj.Labels["app"] = "agent"
			yes := true
			obj.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: &yes}}
		case Mirror:
			obj.Annotations = map[string]string{v1.MirrorPodAnnotationKey: "static-" + p.Name}
		}
		if p.Edit != nil {
			p.Edit(obj)
		}
		if _, err := c.CoreV1().Pods(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating pod %s: %w", p.Name, err)
		}
	}
	// Only this node's pods: several nodes share a namespace (the pool has 624 pods in one),
	// and a wait that lists all of them every 200 ms, six waits at once, spends the few seats
	// of a 6-seat server that kwok's status updates need (the pool's setup once timed out here).
	onNode := fields.OneTermEqualSelector("spec.nodeName", node).String()
	running := 0
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: onNode})
		if err != nil {
			return false, nil
		}
		want := map[string]bool{}
		for _, p := range pods {
			want[p.Name] = true
		}
		running = 0
		for _, p := range list.Items {
			if want[p.Name] && p.Status.Phase == v1.PodRunning && p.DeletionTimestamp == nil {
				running++
			}
		}
		return running == len(pods), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %d pods to run on %s in %s (%d running at the last look): %w", len(pods), node, ns, running, err)
	}
	return nil
}
