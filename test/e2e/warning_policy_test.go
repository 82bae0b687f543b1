package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/reprieve-dev/reprieve/test/scenario"
)

// warningCollector is a rest.WarningHandler that keeps the warnings of one request.
type warningCollector struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningCollector) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

// warningsOf runs one request with a client of its own and returns the warnings the API server
// answered it with.
func warningsOf(t *testing.T, request func(kubernetes.Interface) error) []string {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	w := &warningCollector{}
	cfg.WarningHandler = w
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := request(c); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	slices.Sort(w.msgs)
	return slices.Clone(w.msgs)
}

// TestAdmissionWarningsForSpotWorkloads applies the chart's warning policy (AWS: a 120 s window,
// the agent's 5 s margin), bound to this test's namespace only, and creates each kind the issue
// lists with templates that target spot capacity or not: the API server's answer carries the
// exact warnings for the ones that cannot finish in the window, and none for the others.
func TestAdmissionWarningsForSpotWorkloads(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, release = "warnpolicy", "warnpolicy"
	c := env.Client
	if err := env.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	// Bound to this namespace only: every end-to-end test shares the API server.
	// Rendered as a release in the test's namespace, so that the agent's pods it leaves alone
	// are in the namespace bound.
	manifest, err := helm(t, "template", release, chartDir, "--namespace", ns, "-f", "deploy/chart/values-aws.yaml",
		"--show-only", "templates/warning-policy.yaml",
		"--set-json", `admissionWarnings={"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "`+ns+`"}}}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := scenario.Apply(ctx, c, manifest); err != nil {
		t.Fatal(err)
	}
	const name = release + "-reprieve-spot-warnings"
	t.Cleanup(func() {
		ctx := context.Background()
		_ = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	})
	prefix := fmt.Sprintf("Validation failed for ValidatingAdmissionPolicy '%s' with binding '%s': ", name, name)
	graceCut := prefix + "grace 600 s will be cut to 115 s on a spot interruption"
	forever := prefix + "this pod will not be evicted and dies with the machine"

	spot := v1.Toleration{Key: "cloud", Operator: v1.TolerationOpEqual, Value: "spot", Effect: v1.TaintEffectNoExecute, TolerationSeconds: ptr64(60)}
	foreverTol := spot
	foreverTol.TolerationSeconds = nil
	cases := []struct {
		name string
		spec func(*v1.PodSpec)
		want []string
	}{
		{"tolerates-grace-600", func(s *v1.PodSpec) {
			s.Tolerations = []v1.Toleration{spot}
			s.TerminationGracePeriodSeconds = ptr64(600)
		}, []string{graceCut}},
		{"tolerates-forever", func(s *v1.PodSpec) {
			s.Tolerations = []v1.Toleration{foreverTol}
			s.TerminationGracePeriodSeconds = ptr64(10)
		}, []string{forever}},
		{"karpenter-spot-grace-600", func(s *v1.PodSpec) {
			s.NodeSelector = map[string]string{"karpenter.sh/capacity-type": "spot"}
			s.TerminationGracePeriodSeconds = ptr64(600)
		}, []string{graceCut}},
		{"compliant", func(s *v1.PodSpec) {
			s.NodeSelector = map[string]string{"karpenter.sh/capacity-type": "spot"}
			s.Tolerations = []v1.Toleration{spot}
			s.TerminationGracePeriodSeconds = ptr64(115)
		}, nil},
		{"not-spot", func(s *v1.PodSpec) {
			s.NodeSelector = map[string]string{"karpenter.sh/capacity-type": "on-demand"}
			s.TerminationGracePeriodSeconds = ptr64(600)
		}, nil},
	}
	// Two more shapes, on pods only: a toleration of every taint, and spot required by node
	// affinity, with the default grace.
	podOnly := []struct {
		name string
		spec func(*v1.PodSpec)
		want []string
	}{
		{"tolerates-everything", func(s *v1.PodSpec) {
			s.Tolerations = []v1.Toleration{{Operator: v1.TolerationOpExists}}
		}, []string{forever}},
		{"default-grace", func(s *v1.PodSpec) {
			s.Tolerations = []v1.Toleration{spot}
		}, nil},
		{"gke-spot-affinity-grace-600", func(s *v1.PodSpec) {
			s.TerminationGracePeriodSeconds = ptr64(600)
			s.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
				NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{
					{Key: "cloud.google.com/gke-spot", Operator: v1.NodeSelectorOpIn, Values: []string{"true"}}}}}}}}
		}, []string{graceCut}},
	}

	podSpec := func(edit func(*v1.PodSpec), restart v1.RestartPolicy) v1.PodSpec {
		s := v1.PodSpec{RestartPolicy: restart, Containers: []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}
		edit(&s)
		return s
	}
	template := func(n string, edit func(*v1.PodSpec), restart v1.RestartPolicy) v1.PodTemplateSpec {
		return v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": n}}, Spec: podSpec(edit, restart)}
	}
	sel := func(n string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"app": n}}
	}
	meta := func(n string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: n, Namespace: ns} }
	create := map[string]func(c kubernetes.Interface, n string, edit func(*v1.PodSpec), dryRun bool) error{
		"pod": func(c kubernetes.Interface, n string, edit func(*v1.PodSpec), dryRun bool) error {
			opts := metav1.CreateOptions{}
			if dryRun {
				opts.DryRun = []string{metav1.DryRunAll}
			}
			_, err := c.CoreV1().Pods(ns).Create(ctx, &v1.Pod{ObjectMeta: meta(n), Spec: podSpec(edit, v1.RestartPolicyAlways)}, opts)
			return err
		},
		"deployment": func(c kubernetes.Interface, n string, edit func(*v1.PodSpec), _ bool) error {
			_, err := c.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: meta(n),
				Spec: appsv1.DeploymentSpec{Selector: sel(n), Template: template(n, edit, v1.RestartPolicyAlways)}}, metav1.CreateOptions{})
			return err
		},
		"statefulset": func(c kubernetes.Interface, n string, edit func(*v1.PodSpec), _ bool) error {
			_, err := c.AppsV1().StatefulSets(ns).Create(ctx, &appsv1.StatefulSet{ObjectMeta: meta(n),
				Spec: appsv1.StatefulSetSpec{ServiceName: n, Selector: sel(n), Template: template(n, edit, v1.RestartPolicyAlways)}}, metav1.CreateOptions{})
			return err
		},
		"replicaset": func(c kubernetes.Interface, n string, edit func(*v1.PodSpec), _ bool) error {
			_, err := c.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: meta(n),
				Spec: appsv1.ReplicaSetSpec{Selector: sel(n), Template: template(n, edit, v1.RestartPolicyAlways)}}, metav1.CreateOptions{})
			return err
		},
		"job": func(c kubernetes.Interface, n string, edit func(*v1.PodSpec), _ bool) error {
			_, err := c.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{ObjectMeta: meta(n),
				Spec: batchv1.JobSpec{Template: template(n, edit, v1.RestartPolicyNever)}}, metav1.CreateOptions{})
			return err
		},
		"cronjob": func(c kubernetes.Interface, n string, edit func(*v1.PodSpec), _ bool) error {
			_, err := c.BatchV1().CronJobs(ns).Create(ctx, &batchv1.CronJob{ObjectMeta: meta(n),
				Spec: batchv1.CronJobSpec{Schedule: "0 3 * * *", JobTemplate: batchv1.JobTemplateSpec{
					Spec: batchv1.JobSpec{Template: template(n, edit, v1.RestartPolicyNever)}}}}, metav1.CreateOptions{})
			return err
		},
	}

	// The API server loads new policies and bindings asynchronously: probe with dry-run pods
	// until the warning arrives.
	probe := cases[0]
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		got := warningsOf(t, func(c kubernetes.Interface) error { return create["pod"](c, "probe", probe.spec, true) })
		return slices.Equal(got, probe.want), nil
	}); err != nil {
		t.Fatalf("the warning policy never warned for a dry-run pod: %v", err)
	}

	checked := 0
	for _, kind := range []string{"pod", "deployment", "statefulset", "replicaset", "job", "cronjob"} {
		all := cases
		if kind == "pod" {
			all = append(slices.Clone(cases), podOnly...)
		}
		for _, tc := range all {
			n := kind + "-" + tc.name
			got := warningsOf(t, func(c kubernetes.Interface) error { return create[kind](c, n, tc.spec, false) })
			if !slices.Equal(got, tc.want) {
				t.Errorf("creating %s: warnings %q, want %q", n, got, tc.want)
			}
			checked++
		}
	}

	// UPDATE is checked too: a compliant Deployment whose grace grows past the window.
	got := warningsOf(t, func(c kubernetes.Interface) error {
		d, err := c.AppsV1().Deployments(ns).Get(ctx, "deployment-compliant", metav1.GetOptions{})
		if err != nil {
			return err
		}
		d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr64(600)
		_, err = c.AppsV1().Deployments(ns).Update(ctx, d, metav1.UpdateOptions{})
		return err
	})
	if want := []string{graceCut}; !slices.Equal(got, want) {
		t.Errorf("updating deployment-compliant to grace 600: warnings %q, want %q", got, want)
	}

	// The agent's own pods (the release's labels in its namespace) and pods a controller owns
	// are left alone, however they tolerate.
	for _, meta := range []metav1.ObjectMeta{
		{Name: "agent", Labels: map[string]string{"app.kubernetes.io/name": "reprieve", "app.kubernetes.io/instance": release}},
		{Name: "owned", OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "replicaset-tolerates-forever",
			UID: "00000000-0000-0000-0000-000000000001", Controller: new(bool)}}},
	} {
		if meta.OwnerReferences != nil {
			*meta.OwnerReferences[0].Controller = true
		}
		got := warningsOf(t, func(c kubernetes.Interface) error {
			_, err := c.CoreV1().Pods(ns).Create(ctx, &v1.Pod{ObjectMeta: meta, Spec: podSpec(podOnly[0].spec, v1.RestartPolicyAlways)},
				metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		})
		if len(got) != 0 {
			t.Errorf("pod %s: warnings %q, want none", meta.Name, got)
		}
	}

	// Another namespace is outside the binding: the same template there gets no warning.
	const other = "warnpolicy-unbound"
	if err := env.CreateNamespace(ctx, other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Namespaces().Delete(context.Background(), other, metav1.DeleteOptions{}) })
	got = warningsOf(t, func(c kubernetes.Interface) error {
		_, err := c.CoreV1().Pods(other).Create(ctx, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: podSpec(probe.spec, v1.RestartPolicyAlways)},
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	})
	if len(got) != 0 {
		t.Errorf("a pod outside the bound namespace got warnings %q", got)
	}
	t.Logf("%d creates and an update checked for their warnings", checked)
}
