package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// auditRows are `reprieve audit -n audit`'s rows for the workload TestAuditMixedWorkload
// creates, for AWS's 120 s window (pods gone by T+115) and GCP's and Azure's 30 s (T+25):
// web's 30 s grace fits the first and is cut to 24 s in the second (the request allows 250 ms),
// bare's 600 s is cut to 114 s and 24 s, db is refused by its budget and deleted past it,
// nightly tolerates the taint forever, solo tolerates it 60 s with a 10 s grace and keeps it.
const auditRows = `WORKLOAD               WINDOW         ON SPOT  FULL GRACE  CUT SHORT          FORCED PAST PDB  DIES WITH MACHINE
audit/CronJob/nightly  120s aws       1/1 all  0           0                  0                1
audit/CronJob/nightly  30s gcp,azure  1/1 all  0           0                  0                1
audit/Deployment/web   120s aws       2/3      2           0                  0                0
audit/Deployment/web   30s gcp,azure  2/3      0           2 (by up to 7s)    0                0
audit/Pod/solo         120s aws       1/1 all  1           0                  0                0
audit/Pod/solo         30s gcp,azure  1/1 all  1           0                  0                0
audit/ReplicaSet/bare  120s aws       1/1 all  0           1 (by up to 487s)  0                0
audit/ReplicaSet/bare  30s gcp,azure  1/1 all  0           1 (by up to 577s)  0                0
audit/StatefulSet/db   120s aws       2/2 all  0           0                  2                0
audit/StatefulSet/db   30s gcp,azure  2/2 all  0           0                  2                0
`

// TestAuditMixedWorkload runs `reprieve audit` (the real binary, with the operator's admin
// kubeconfig and the default spot selectors) against a mixed workload on a Karpenter spot node,
// a GKE Spot node and an on-demand node: owners resolved through ReplicaSets and Jobs, the
// exact rows of the table, and the same figures in the JSON.
func TestAuditMixedWorkload(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, spotA, spotB, onDemand = "audit", "audit-spot-a", "audit-spot-b", "audit-on-demand"
	c := env.Client
	setupNode(ctx, t, ns, spotA, map[string]string{"karpenter.sh/capacity-type": "spot"})
	for node, labels := range map[string]map[string]string{
		spotB:    {"cloud.google.com/gke-spot": "true"},
		onDemand: {"karpenter.sh/capacity-type": "on-demand"},
	} {
		if _, err := env.CreateNode(ctx, node, labels); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = c.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		for _, n := range []string{spotA, spotB, onDemand} {
			_ = c.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
		}
	})

	// The owners are real objects (their UIDs are in the pods' owner references); no
	// controller runs for them here, so the pods are the ones below.
	tmpl := func(app string) v1.PodTemplateSpec {
		restart := v1.RestartPolicyAlways
		if app == "nightly" {
			restart = v1.RestartPolicyNever // a Job's
		}
		return v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app}},
			Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}, RestartPolicy: restart}}
	}
	sel := func(app string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}
	}
	meta := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: ns} }
	owner := func(obj metav1.Object, kind, apiVersion string) []metav1.OwnerReference {
		yes := true
		return []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: obj.GetName(), UID: obj.GetUID(), Controller: &yes}}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	zero := int32(0)
	suspend := true
	dep, err := c.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: meta("web"),
		Spec: appsv1.DeploymentSpec{Replicas: &zero, Selector: sel("web"), Template: tmpl("web")}}, metav1.CreateOptions{})
	must(err)
	rsMeta := meta("web-1")
	rsMeta.OwnerReferences = owner(dep, "Deployment", "apps/v1")
	rs, err := c.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: rsMeta,
		Spec: appsv1.ReplicaSetSpec{Replicas: &zero, Selector: sel("web"), Template: tmpl("web")}}, metav1.CreateOptions{})
	must(err)
	bare, err := c.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: meta("bare"),
		Spec: appsv1.ReplicaSetSpec{Replicas: &zero, Selector: sel("bare"), Template: tmpl("bare")}}, metav1.CreateOptions{})
	must(err)
	ss, err := c.AppsV1().StatefulSets(ns).Create(ctx, &appsv1.StatefulSet{ObjectMeta: meta("db"),
		Spec: appsv1.StatefulSetSpec{Replicas: &zero, ServiceName: "db", Selector: sel("db"), Template: tmpl("db")}}, metav1.CreateOptions{})
	must(err)
	cj, err := c.BatchV1().CronJobs(ns).Create(ctx, &batchv1.CronJob{ObjectMeta: meta("nightly"),
		Spec: batchv1.CronJobSpec{Schedule: "0 3 * * *", Suspend: &suspend, JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: tmpl("nightly")}}}},
		metav1.CreateOptions{})
	must(err)
	jobMeta := meta("nightly-1")
	jobMeta.OwnerReferences = owner(cj, "CronJob", "batch/v1")
	job, err := c.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{ObjectMeta: jobMeta,
		Spec: batchv1.JobSpec{Suspend: &suspend, Template: tmpl("nightly")}}, metav1.CreateOptions{})
	must(err)
	// On no node, should a daemonset controller run: its pod is the one below.
	agentTmpl := tmpl("agent")
	agentTmpl.Spec.NodeSelector = map[string]string{"none": "none"}
	ds, err := c.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{ObjectMeta: meta("agent"),
		Spec: appsv1.DaemonSetSpec{Selector: sel("agent"), Template: agentTmpl}}, metav1.CreateOptions{})
	must(err)
	maxUnavailable := intstr.FromInt32(0)
	_, err = c.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: meta("db"),
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &maxUnavailable, Selector: sel("db")}}, metav1.CreateOptions{})
	must(err)

	forever := v1.Toleration{Key: "cloud", Operator: v1.TolerationOpEqual, Value: "spot", Effect: v1.TaintEffectNoExecute}
	for60 := forever
	for60.TolerationSeconds = ptr64(60)
	for _, p := range []struct {
		name, app, node string
		grace           int64
		owners          []metav1.OwnerReference
		tolerations     []v1.Toleration
	}{
		{"web-1-a", "web", spotA, 30, owner(rs, "ReplicaSet", "apps/v1"), nil},
		{"web-1-b", "web", spotB, 30, owner(rs, "ReplicaSet", "apps/v1"), nil},
		{"web-1-c", "web", onDemand, 30, owner(rs, "ReplicaSet", "apps/v1"), nil},
		{"db-0", "db", spotA, 600, owner(ss, "StatefulSet", "apps/v1"), nil},
		{"db-1", "db", spotB, 600, owner(ss, "StatefulSet", "apps/v1"), nil},
		{"nightly-1-x", "nightly", spotA, 30, owner(job, "Job", "batch/v1"), []v1.Toleration{forever}},
		{"solo", "solo", spotB, 10, nil, []v1.Toleration{for60}},
		{"bare-x", "bare", spotA, 600, owner(bare, "ReplicaSet", "apps/v1"), nil},
		{"agent-x", "agent", spotA, 30, owner(ds, "DaemonSet", "apps/v1"), nil},
		{"off-spot", "off", onDemand, 600, nil, []v1.Toleration{forever}},
	} {
		_, err := c.CoreV1().Pods(ns).Create(ctx, &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: map[string]string{"app": p.app}, OwnerReferences: p.owners},
			Spec: v1.PodSpec{NodeName: p.node, TerminationGracePeriodSeconds: ptr64(p.grace), Tolerations: p.tolerations,
				AutomountServiceAccountToken: new(bool), Containers: []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
		}, metav1.CreateOptions{})
		must(err)
	}

	run := func(args ...string) []byte {
		t.Helper()
		cmd := exec.CommandContext(ctx, reprieveBin, append([]string{"audit", "--kubeconfig=" + env.Kubeconfig, "-n", ns}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("reprieve audit %v: %v\n%s", args, err, stderr.String())
		}
		return out
	}

	// Other tests' nodes may carry spot labels too: the header counts them, the rows are this
	// namespace's alone.
	table := string(run())
	header, rows, _ := strings.Cut(table, "\n\n")
	if !strings.Contains(header, " nodes match karpenter.sh/capacity-type=spot or ") || !strings.HasSuffix(header, "; namespace audit; safety margin 5s") {
		t.Errorf("table header %q", header)
	}
	if rows != auditRows {
		t.Errorf("table rows:\n%s\nwant\n%s", rows, auditRows)
	}

	var report struct {
		Nodes   []string `json:"nodes"`
		Windows []struct {
			Seconds float64  `json:"seconds"`
			Clouds  []string `json:"clouds"`
		} `json:"windows"`
		Workloads []json.RawMessage `json:"workloads"`
	}
	out := run("-o", "json")
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("reprieve audit -o json: %v\n%s", err, out)
	}
	if !slices.Contains(report.Nodes, spotA) || !slices.Contains(report.Nodes, spotB) || slices.Contains(report.Nodes, onDemand) {
		t.Errorf("nodes %v: want %s and %s, not %s", report.Nodes, spotA, spotB, onDemand)
	}
	var windows []string
	for _, w := range report.Windows {
		windows = append(windows, strings.Join(append([]string{time.Duration(w.Seconds * float64(time.Second)).String()}, w.Clouds...), " "))
	}
	if want := []string{"2m0s aws", "30s gcp azure"}; !reflect.DeepEqual(windows, want) {
		t.Errorf("windows %q, want %q", windows, want)
	}
	var got []string
	for _, w := range report.Workloads {
		got = append(got, string(w))
	}
	want := []string{
		`{"namespace":"audit","kind":"CronJob","name":"nightly","pods":1,"podsOnSpot":1,"allOnSpot":true,"outcomes":[` +
			`{"windowSeconds":120,"fullGrace":0,"cutShort":0,"pdbForced":0,"diesWithMachine":1},{"windowSeconds":30,"fullGrace":0,"cutShort":0,"pdbForced":0,"diesWithMachine":1}]}`,
		`{"namespace":"audit","kind":"Deployment","name":"web","pods":3,"podsOnSpot":2,"allOnSpot":false,"outcomes":[` +
			`{"windowSeconds":120,"fullGrace":2,"cutShort":0,"pdbForced":0,"diesWithMachine":0},{"windowSeconds":30,"fullGrace":0,"cutShort":2,"maxCutSeconds":7,"pdbForced":0,"diesWithMachine":0}]}`,
		`{"namespace":"audit","kind":"Pod","name":"solo","pods":1,"podsOnSpot":1,"allOnSpot":true,"outcomes":[` +
			`{"windowSeconds":120,"fullGrace":1,"cutShort":0,"pdbForced":0,"diesWithMachine":0},{"windowSeconds":30,"fullGrace":1,"cutShort":0,"pdbForced":0,"diesWithMachine":0}]}`,
		`{"namespace":"audit","kind":"ReplicaSet","name":"bare","pods":1,"podsOnSpot":1,"allOnSpot":true,"outcomes":[` +
			`{"windowSeconds":120,"fullGrace":0,"cutShort":1,"maxCutSeconds":487,"pdbForced":0,"diesWithMachine":0},{"windowSeconds":30,"fullGrace":0,"cutShort":1,"maxCutSeconds":577,"pdbForced":0,"diesWithMachine":0}]}`,
		`{"namespace":"audit","kind":"StatefulSet","name":"db","pods":2,"podsOnSpot":2,"allOnSpot":true,"outcomes":[` +
			`{"windowSeconds":120,"fullGrace":0,"cutShort":0,"pdbForced":2,"diesWithMachine":0},{"windowSeconds":30,"fullGrace":0,"cutShort":0,"pdbForced":2,"diesWithMachine":0}]}`,
	}
	for i := range got {
		got[i] = compactJSON(t, got[i])
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("JSON workloads:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// compactJSON is s without the indentation `-o json` adds.
func compactJSON(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
