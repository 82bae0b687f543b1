package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/test/profiles"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// renderGuard renders the eviction guard's template with args and returns its Deployment and
// PodDisruptionBudget.
func renderGuard(t *testing.T, args ...string) (*appsv1.Deployment, *policyv1.PodDisruptionBudget) {
	t.Helper()
	var d *appsv1.Deployment
	var pdb *policyv1.PodDisruptionBudget
	for _, o := range chartObjects(t, "eviction-guard", render(t, "reprieve", append([]string{"--show-only", "templates/eviction-guard.yaml"}, args...)...)) {
		switch o := o.(type) {
		case *appsv1.Deployment:
			d = o
		case *policyv1.PodDisruptionBudget:
			pdb = o
		}
	}
	if d == nil || pdb == nil {
		t.Fatalf("render %v: no guard Deployment or budget", args)
	}
	return d, pdb
}

// testChartGuardPlacementValues (issue 49, item 1) renders the guard's port, host network,
// tolerations, spread and budget: by default port 10250 (a GKE private cluster's control plane
// reaches it without a firewall rule) on the pod network; 10260 on the host network; a port of
// one's own; CriticalAddonsOnly always tolerated; replicas on separate hosts (DoNotSchedule,
// taints honoured); a budget that lets one replica go; offSpot required keeps it off spot; and
// the host network on the kubelet's port is refused with a message that names it.
func testChartGuardPlacementValues(t *testing.T) {
	port := func(d *appsv1.Deployment) (string, int32) {
		c := d.Spec.Template.Spec.Containers[0]
		var bind string
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--bind-address="); ok {
				bind = v
			}
		}
		if len(c.Ports) != 1 || c.Ports[0].Name != "https" {
			t.Fatalf("guard ports %+v; want one named https", c.Ports)
		}
		return bind, c.Ports[0].ContainerPort
	}
	d, pdb := renderGuard(t)
	spec := d.Spec.Template.Spec
	if bind, p := port(d); bind != ":10250" || p != 10250 || spec.HostNetwork {
		t.Errorf("default: bind %q, port %d, hostNetwork %v; want :10250 on the pod network", bind, p, spec.HostNetwork)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl v1.Toleration) bool {
		return tl.Key == "CriticalAddonsOnly" && tl.Operator == v1.TolerationOpExists
	}) {
		t.Errorf("tolerations %+v; want CriticalAddonsOnly (AKS's system pools)", spec.Tolerations)
	}
	hosts := spec.TopologySpreadConstraints[0]
	if hosts.TopologyKey != v1.LabelHostname || hosts.WhenUnsatisfiable != v1.DoNotSchedule || hosts.NodeTaintsPolicy == nil || *hosts.NodeTaintsPolicy != v1.NodeInclusionPolicyHonor {
		t.Errorf("host spread %+v; want DoNotSchedule across hosts, taints honoured", hosts)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
		t.Errorf("budget %+v; want maxUnavailable 1", pdb.Spec)
	}

	d, _ = renderGuard(t, "--set", "evictionGuard.hostNetwork=true")
	if bind, p := port(d); bind != ":10260" || p != 10260 || !d.Spec.Template.Spec.HostNetwork || d.Spec.Template.Spec.DNSPolicy != v1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork: bind %q, port %d, hostNetwork %v, dnsPolicy %s; want :10260 on the host network", bind, p, d.Spec.Template.Spec.HostNetwork, d.Spec.Template.Spec.DNSPolicy)
	}
	d, _ = renderGuard(t, "--set", "evictionGuard.port=9443,evictionGuard.tolerations[0].key=dedicated,evictionGuard.tolerations[0].operator=Exists")
	if bind, p := port(d); bind != ":9443" || p != 9443 || len(d.Spec.Template.Spec.Tolerations) != 2 {
		t.Errorf("port 9443: bind %q, port %d, tolerations %+v; want :9443 and both tolerations", bind, p, d.Spec.Template.Spec.Tolerations)
	}
	d, _ = renderGuard(t, "--set", "evictionGuard.offSpot=required")
	a := d.Spec.Template.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 0 {
		t.Errorf("offSpot required: affinity %+v; want required node affinity only", a)
	}
	_, pdb = renderGuard(t, "--set", "evictionGuard.replicas=1")
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("replicas 1: budget %+v; want maxUnavailable 1, which never blocks a drain", pdb.Spec)
	}
	if _, err := helm(t, "template", "reprieve", chartDir, "--set", "cloud=aws,evictionGuard.hostNetwork=true,evictionGuard.port=10250"); err == nil ||
		!strings.Contains(err.Error(), "the kubelet's port") {
		t.Errorf("hostNetwork on 10250: %v; want refused, naming the kubelet's port", err)
	}
}

// terms are the DaemonSet's required node selector terms, each as "key op values" strings.
func terms(ds *appsv1.DaemonSet) [][]string {
	var out [][]string
	a := ds.Spec.Template.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		var exprs []string
		for _, e := range term.MatchExpressions {
			exprs = append(exprs, strings.TrimSpace(e.Key+" "+string(e.Operator)+" "+strings.Join(e.Values, ",")))
		}
		out = append(out, exprs)
	}
	return out
}

// testChartSelectionValues (issue 48, item 2) renders the DaemonSet's selection: every term of
// it, the default spot one, nodes=all's, a nodeSelector's and a user's affinity, leaves out
// Fargate and virtual-kubelet nodes, and excludeNodes adds its requirements to each without
// rewriting the rest; a user's affinity keeps its other parts.
func testChartSelectionValues(t *testing.T) {
	const fargate, vk = "eks.amazonaws.com/compute-type NotIn fargate", "type NotIn virtual-kubelet"
	karpenter := "karpenter.sh/nodepool DoesNotExist"
	for _, c := range []struct {
		name  string
		args  []string
		terms int
		want  []string // in every term, after the term's own
	}{
		{"default", nil, 5, []string{fargate, vk}},
		{"karpenter excluded", []string{"--set", "excludeNodes={karpenter.sh/nodepool}"}, 5, []string{fargate, vk, karpenter}},
		{"nodes all", []string{"--set", "nodes=all,excludeNodes={karpenter.sh/nodepool}"}, 1, []string{fargate, vk, karpenter}},
		{"values", []string{"--set-json", `excludeNodes=[{"key":"pool","values":["gpu","batch"]}]`}, 5, []string{fargate, vk, "pool NotIn gpu,batch"}},
		{"nodeSelector", []string{"--set", "nodeSelector.pool=spot,excludeNodes={karpenter.sh/nodepool}"}, 1, []string{fargate, vk, karpenter}},
		{"affinity", []string{"--set-json", `affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[` +
			`{"matchExpressions":[{"key":"pool","operator":"In","values":["a"]}]},{"matchExpressions":[{"key":"pool","operator":"In","values":["b"]}]}]}},` +
			`"podAntiAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":1,"podAffinityTerm":{"topologyKey":"kubernetes.io/hostname","labelSelector":{"matchLabels":{"x":"y"}}}}]}}`,
			"--set", "excludeNodes={karpenter.sh/nodepool}"}, 2, []string{fargate, vk, karpenter}},
	} {
		ds, _ := renderDaemonSet(t, "selection-"+strings.ReplaceAll(c.name, " ", "-"), append([]string{"--set", "cloud=aws"}, c.args...)...)
		got := terms(ds)
		if len(got) != c.terms {
			t.Errorf("%s: %d terms %q; want %d", c.name, len(got), got, c.terms)
			continue
		}
		for _, term := range got {
			if len(term) < len(c.want) || !slices.Equal(term[len(term)-len(c.want):], c.want) {
				t.Errorf("%s: term %q; want it to end with %q", c.name, term, c.want)
			}
		}
		if c.name == "affinity" {
			a := ds.Spec.Template.Spec.Affinity
			if a.PodAntiAffinity == nil || got[0][0] != "pool In a" || got[1][0] != "pool In b" {
				t.Errorf("affinity: %+v, terms %q; want the user's terms and pod anti-affinity kept", a, got)
			}
		}
	}
	if _, err := helm(t, "template", "reprieve", chartDir, "--set", "cloud=aws", "--set-json", `excludeNodes=[{"values":["x"]}]`); err == nil {
		t.Errorf("excludeNodes item without a key: rendered; want refused by the schema")
	}

	// The kubelet's configuration with pressure.source summary (issue 48, item 3): mounted, and
	// readKubeletConfig=false mounts nothing of the host.
	hostPaths := func(ds *appsv1.DaemonSet) []string {
		var out []string
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.HostPath != nil {
				out = append(out, v.HostPath.Path)
			}
		}
		return out
	}
	for _, c := range []struct {
		args []string
		want []string
		init bool
	}{
		{[]string{"--set", "cloud=aws,pressure.source=summary"}, []string{"/etc/kubernetes/kubelet", "/etc/eks/kubelet"}, false},
		{[]string{"--set", "cloud=gcp,pressure.source=off"}, []string{"/home/kubernetes/kubelet-config.yaml"}, false},
		{[]string{"--set", "cloud=azure,pressure.source=summary"}, []string{"/etc/default"}, true},
		{[]string{"--set", "cloud=gcp,pressure.source=summary,readKubeletConfig=false"}, nil, false},
		{[]string{"--set", "cloud=gcp,pressure.source=summary,pressure.kubeletConfig=/etc/kubelet.yaml"}, []string{"/etc/kubelet.yaml"}, false},
	} {
		ds, _ := renderDaemonSet(t, "kubelet-config", c.args...)
		if got := hostPaths(ds); !slices.Equal(got, c.want) {
			t.Errorf("%v: host paths %q; want %q", c.args, got, c.want)
		}
		var hostRoot string
		for _, e := range ds.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "REPRIEVE_HOST_ROOT" {
				hostRoot = e.Value
			}
		}
		if (hostRoot == "/host") != (len(c.want) > 0) {
			t.Errorf("%v: REPRIEVE_HOST_ROOT %q with host paths %q", c.args, hostRoot, c.want)
		}
		if got := len(ds.Spec.Template.Spec.InitContainers) > 0; got != c.init {
			t.Errorf("%v: init container %v, want %v", c.args, got, c.init)
		}
	}
}

// guardPlacementOnNodes (issue 49, item 1) places the guard as the chart renders it by default,
// with the real kube-scheduler, on the nodes of three clusters, each confined to its own nodes
// by evictionGuard.nodeSelector:
//   - AKS: a system pool node (on-demand, tainted CriticalAddonsOnly=true:NoSchedule as AKS
//     recommends) and two spot nodes (tainted kubernetes.azure.com/scalesetpriority=spot:
//     NoSchedule): both replicas on the system node, none Pending;
//   - EKS with spot capacity only (managed node group spot nodes): the replicas run, on separate
//     spot hosts;
//   - EKS with two on-demand and two spot nodes: the replicas on the two on-demand ones.
//
// Then its budget with replicas: 1, on the real Eviction API with the disruption controller:
// the only replica may be evicted (a drain of its node proceeds), where minAvailable 1 refused it.
func guardPlacementOnNodes(ctx context.Context, t *testing.T) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	const label = "reprieve.test/guard-placement"
	mngSpot := profiles.EKSManagedNodeGroup()
	mngOnDemand := mngSpot
	mngOnDemand.Labels = withLabels(mngSpot.Labels, map[string]string{"eks.amazonaws.com/capacityType": "ON_DEMAND"})
	aksSpot := profiles.AKSSpot()
	// An AKS system pool node: on-demand, mode system, tainted as AKS recommends.
	aksSystem := aksSpot
	aksSystem.Labels = withLabels(aksSpot.Labels, map[string]string{"kubernetes.azure.com/mode": "system", "agentpool": "system", "kubernetes.azure.com/agentpool": "system"})
	delete(aksSystem.Labels, "kubernetes.azure.com/scalesetpriority")
	aksSystem.Taints = []v1.Taint{{Key: "CriticalAddonsOnly", Value: "true", Effect: v1.TaintEffectNoSchedule}}
	type node struct {
		name string
		p    profiles.Profile
	}
	for _, c := range []struct {
		name  string
		nodes []node
		want  []string // the nodes the replicas run on, sorted
	}{
		{"aks", []node{{"gp-aks-system", aksSystem}, {"gp-aks-spot-1", aksSpot}, {"gp-aks-spot-2", aksSpot}}, []string{"gp-aks-system", "gp-aks-system"}},
		{"spot-only", []node{{"gp-spot-1", mngSpot}, {"gp-spot-2", mngSpot}}, []string{"gp-spot-1", "gp-spot-2"}},
		{"mixed", []node{{"gp-od-1", mngOnDemand}, {"gp-od-2", mngOnDemand}, {"gp-mixed-spot-1", mngSpot}, {"gp-mixed-spot-2", mngSpot}},
			[]string{"gp-od-1", "gp-od-2"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, n := range c.nodes {
				createProfileNode(ctx, t, n.name, n.p, map[string]string{label: c.name})
			}
			d, _ := renderGuard(t, "--set", "evictionGuard.nodeSelector."+strings.ReplaceAll(label, ".", `\.`)+"="+c.name)
			got := runGuardPods(ctx, t, "guard-placement-"+c.name, d, 2)
			if !slices.Equal(got, c.want) {
				t.Errorf("%s: the guard's replicas run on %q; want %q", c.name, got, c.want)
			}
		})
	}

	t.Run("budget-replicas-1", func(t *testing.T) {
		createProfileNode(ctx, t, "gp-budget", mngSpot, map[string]string{label: "budget"})
		d, pdb := renderGuard(t, "--set", "evictionGuard.replicas=1,evictionGuard.nodeSelector."+strings.ReplaceAll(label, ".", `\.`)+"=budget")
		const ns = "guard-budget"
		got := runGuardPods(ctx, t, ns, d, 1)
		if len(got) != 1 {
			t.Fatalf("the guard's one replica runs on %q", got)
		}
		old := pdb.DeepCopy()
		old.Name, old.Spec.MaxUnavailable, old.Spec.MinAvailable = "old-min-available", nil, ptrIntStr(1)
		for _, b := range []*policyv1.PodDisruptionBudget{old, pdb} {
			b.Namespace = ns
			if _, err := env.Client.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, b, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			// The disruption controller computes the budget's status for the pod.
			waitFor(ctx, t, "budget "+b.Name+" observed", func() bool {
				got, err := env.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, b.Name, metav1.GetOptions{})
				return err == nil && got.Status.ObservedGeneration == got.Generation && got.Status.ExpectedPods == 1
			})
		}
		pods, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("guard pods %v (%v)", pods, err)
		}
		evict := func() error {
			return env.Client.PolicyV1().Evictions(ns).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pods.Items[0].Name, Namespace: ns},
				DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}})
		}
		// Both budgets select the pod: the API server refuses an eviction of a pod under two
		// (500). The old one alone first, then the chart's alone.
		if err := env.Client.PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, pdb.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := evict(); !apierrors.IsTooManyRequests(err) {
			t.Errorf("with the old minAvailable 1, evicting the only replica: %v; want 429 (a drain blocked)", err)
		}
		if err := env.Client.PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		pdb.ResourceVersion = ""
		if _, err := env.Client.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(ctx, t, "the chart's budget observed", func() bool {
			got, err := env.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, pdb.Name, metav1.GetOptions{})
			return err == nil && got.Status.ObservedGeneration == got.Generation && got.Status.ExpectedPods == 1 && got.Status.DisruptionsAllowed == 1
		})
		if err := evict(); err != nil {
			t.Errorf("with the chart's budget, evicting the only replica: %v; want it allowed (a drain proceeds)", err)
		}
	})
}

func ptrIntStr(i int) *intstr.IntOrString { v := intstr.FromInt32(int32(i)); return &v }

// runGuardPods creates in ns, as the guard's ReplicaSet would, n pods of d's template, owned by
// a ReplicaSet of n replicas (no replicaset controller runs here; the disruption controller
// reads its scale), and returns the nodes kube-scheduler put them on, sorted, once all are
// Running, or fails with where they are after a minute.
func runGuardPods(ctx context.Context, t *testing.T, ns string, d *appsv1.Deployment, n int32) []string {
	t.Helper()
	if err := env.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	tmpl := d.Spec.Template.DeepCopy()
	// The namespace's identity and no priority class: the test is about placement.
	tmpl.Spec.ServiceAccountName, tmpl.Spec.PriorityClassName = "default", ""
	// A subtest of TestWithTaintEvictionController, in the serial phase: kwok runs them at once.
	scenario.InstantTemplate(tmpl)
	rs, err := env.Client.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "guard"},
		Spec:       appsv1.ReplicaSetSpec{Replicas: &n, Selector: d.Spec.Selector, Template: *tmpl},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("guard-%d", i), Namespace: ns, Labels: tmpl.Labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptrBool(true)}}},
			Spec: tmpl.Spec}
		if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: ptr64(0)}, metav1.ListOptions{})
	})
	var nodes []string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		nodes = nodes[:0]
		running := 0
		for _, p := range list.Items {
			nodes = append(nodes, p.Spec.NodeName)
			if p.Status.Phase == v1.PodRunning {
				running++
			}
		}
		return running == int(n), nil
	})
	slices.Sort(nodes)
	if err != nil {
		t.Fatalf("%s: guard pods on %q (\"\" = Pending), not all running: %v", ns, nodes, err)
	}
	return nodes
}

func ptrBool(b bool) *bool { return &b }

// selectionOnNodes (issue 48, item 2) runs the chart's DaemonSet, with the daemonset controller
// and kube-scheduler, on nodes of EKS: a Karpenter spot node, a managed node group's spot and
// on-demand nodes, a Fargate node and a virtual-kubelet node (each as the platform taints it).
// nodes=all with excludeNodes=[karpenter.sh/nodepool] runs an agent on the managed node group's
// two only: Karpenter's is left to it, and Fargate and virtual-kubelet nodes get none (the chart
// tolerates every taint, so only the selection keeps it off them); the default spot selection
// runs on both spot nodes.
func selectionOnNodes(ctx context.Context, t *testing.T) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	const label = "reprieve.test/selection"
	mngSpot := profiles.EKSManagedNodeGroup()
	mngOnDemand := mngSpot
	mngOnDemand.Labels = withLabels(mngSpot.Labels, map[string]string{"eks.amazonaws.com/capacityType": "ON_DEMAND"})
	// EKS Fargate registers a node per pod with this label and taint (EKS, "Fargate pod
	// configuration"; aws-node-termination-handler's chart leaves the label out).
	fargate := mngOnDemand
	fargate.Labels = withLabels(mngOnDemand.Labels, map[string]string{"eks.amazonaws.com/compute-type": "fargate"})
	delete(fargate.Labels, "eks.amazonaws.com/capacityType")
	fargate.Taints = []v1.Taint{{Key: "eks.amazonaws.com/compute-type", Value: "fargate", Effect: v1.TaintEffectNoSchedule}}
	// virtual-kubelet's nodes: label type=virtual-kubelet, taint virtual-kubelet.io/provider
	// (virtual-kubelet/virtual-kubelet node.go; AKS virtual nodes' provider is azure).
	vk := mngOnDemand
	vk.Labels = withLabels(mngOnDemand.Labels, map[string]string{"type": "virtual-kubelet"})
	delete(vk.Labels, "eks.amazonaws.com/capacityType")
	vk.Taints = []v1.Taint{{Key: "virtual-kubelet.io/provider", Value: "azure", Effect: v1.TaintEffectNoSchedule}}
	nodes := map[string]profiles.Profile{"sel-karpenter": profiles.KarpenterAL2023(), "sel-mng-spot": mngSpot,
		"sel-mng-on-demand": mngOnDemand, "sel-fargate": fargate, "sel-vk": vk}
	for name, p := range nodes {
		createProfileNode(ctx, t, name, p, map[string]string{label: "yes"})
	}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"all-but-karpenter", []string{"--set", "nodes=all,excludeNodes={karpenter.sh/nodepool}"}, []string{"sel-mng-on-demand", "sel-mng-spot"}},
		{"spot", nil, []string{"sel-karpenter", "sel-mng-spot"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := "selection-" + c.name
			ds, _ := renderDaemonSet(t, name, append([]string{"-f", "deploy/chart/values-aws.yaml", "--set", "metrics.port=10372"}, c.args...)...)
			got := runDaemonSet(ctx, t, name, ds, label, len(c.want))
			if !slices.Equal(got, c.want) {
				t.Errorf("%s: agents on %q; want %q", c.name, got, c.want)
			}
		})
	}
}

// runDaemonSet creates ds in kube-system under name, confined to the nodes labelled label=yes,
// waits until it has want running pods and 2 s more, and returns the nodes its pods are on,
// sorted. The DaemonSet and its pods are deleted when the test ends.
func runDaemonSet(ctx context.Context, t *testing.T, name string, ds *appsv1.DaemonSet, label string, want int) []string {
	t.Helper()
	ds.Name = name
	for _, m := range []map[string]string{ds.Labels, ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels} {
		m["app.kubernetes.io/instance"] = name
	}
	ds.Spec.Template.Spec.NodeSelector[label] = "yes"
	scenario.InstantTemplate(&ds.Spec.Template) // the serial phase (TestWithTaintEvictionController)
	if _, err := env.Client.AppsV1().DaemonSets("kube-system").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	selector := "app.kubernetes.io/name=reprieve,app.kubernetes.io/instance=" + name
	t.Cleanup(func() {
		bg := context.Background()
		_ = env.Client.AppsV1().DaemonSets("kube-system").Delete(bg, name, metav1.DeleteOptions{})
		_ = env.Client.CoreV1().Pods("kube-system").DeleteCollection(bg, metav1.DeleteOptions{GracePeriodSeconds: ptr64(0)},
			metav1.ListOptions{LabelSelector: selector})
	})
	placed := func() (all []string, running int) {
		list, err := env.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			all = append(all, p.Spec.NodeName)
			if p.Status.Phase == v1.PodRunning {
				running++
			}
		}
		slices.Sort(all)
		return all, running
	}
	var got []string
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		var running int
		got, running = placed()
		return running >= want, nil
	})
	// For 2 s more, no agent lands anywhere else.
	time.Sleep(2 * time.Second)
	got, _ = placed()
	return got
}
