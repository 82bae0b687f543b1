package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
)

// auditClient is a cluster with two spot nodes (Karpenter's and GKE's label) and one on-demand
// node, and in namespace shop: a Deployment with a replica off spot, a StatefulSet under a
// PodDisruptionBudget that allows nothing, a CronJob's pod that tolerates forever, a bare pod,
// a ReplicaSet without a Deployment, and a DaemonSet pod. Namespace other has pods only off
// spot. It records every request.
func auditClient(t *testing.T) (*fake.Clientset, func(config.Config) (kube.Interface, error)) {
	t.Helper()
	sec := func(v int64) *int64 { return &v }
	yes := true
	ctrl := func(kind, name, uid string) []metav1.OwnerReference {
		return []metav1.OwnerReference{{Kind: kind, Name: name, UID: types.UID(uid), Controller: &yes}}
	}
	pod := func(name, node string, grace int64, owners []metav1.OwnerReference, tol ...v1.Toleration) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Labels: map[string]string{"app": strings.SplitN(name, "-", 2)[0]}, OwnerReferences: owners},
			Spec:   v1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: sec(grace), Tolerations: tol},
			Status: v1.PodStatus{Phase: v1.PodRunning}}
	}
	spot := v1.Toleration{Key: "cloud", Operator: v1.TolerationOpEqual, Value: "spot", Effect: v1.TaintEffectNoExecute}
	for60 := spot
	for60.TolerationSeconds = sec(60)
	lonely := pod("lonely", "od", 30, nil)
	lonely.Namespace = "other"
	// CSI node plugins (issue 40): one tolerating everything, as the EBS driver's chart
	// does by default, one tolerating only its own taints.
	csi := func(name string, tol ...v1.Toleration) *v1.Pod {
		p := pod(name, "spot-a", 30, ctrl("DaemonSet", "csi-node", "ds-csi"), tol...)
		p.Namespace = "kube-system"
		p.Spec.Volumes = []v1.Volume{{Name: "registration-dir", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/var/lib/kubelet/plugins_registry/"}}}}
		return p
	}
	objs := []runtime.Object{
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "spot-a", Labels: map[string]string{"karpenter.sh/capacity-type": "spot"}}},
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "spot-b", Labels: map[string]string{"cloud.google.com/gke-spot": "true"}}},
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "od", Labels: map[string]string{"karpenter.sh/capacity-type": "on-demand"}}},
		&appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "shop", UID: "rs-web-1", OwnerReferences: ctrl("Deployment", "web", "d-web")}},
		&appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "bare", Namespace: "shop", UID: "rs-bare"}},
		&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "nightly-1", Namespace: "shop", UID: "j-nightly-1", OwnerReferences: ctrl("CronJob", "nightly", "cj-nightly")}},
		&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "shop"},
			Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &intstr.IntOrString{}, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}},
		pod("web-1-a", "spot-a", 30, ctrl("ReplicaSet", "web-1", "rs-web-1")),
		pod("web-1-b", "spot-b", 30, ctrl("ReplicaSet", "web-1", "rs-web-1")),
		pod("web-1-c", "od", 30, ctrl("ReplicaSet", "web-1", "rs-web-1")),
		pod("db-0", "spot-a", 600, ctrl("StatefulSet", "db", "ss-db")),
		pod("db-1", "spot-b", 600, ctrl("StatefulSet", "db", "ss-db")),
		pod("nightly-1-x", "spot-a", 30, ctrl("Job", "nightly-1", "j-nightly-1"), spot),
		pod("solo", "spot-b", 10, nil, for60),
		pod("bare-x", "spot-a", 600, ctrl("ReplicaSet", "bare", "rs-bare")),
		pod("agent-x", "spot-a", 30, ctrl("DaemonSet", "agent", "ds-agent")),
		csi("ebs-csi-node-all", v1.Toleration{Operator: v1.TolerationOpExists}),
		csi("disk-csi-node-own", v1.Toleration{Key: "node.kubernetes.io/not-ready", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute}),
		pod("offspot", "od", 600, nil, spot),
		lonely,
	}
	done := pod("done", "spot-a", 600, nil)
	done.Status.Phase = v1.PodSucceeded
	objs = append(objs, done)
	c := fake.NewClientset(objs...)
	return c, func(config.Config) (kube.Interface, error) { return kubetest.Wrap(c), nil }
}

// The windows: AWS's 120 s (margin 5 s: pods must be gone by T+115) and GCP's and Azure's 30 s
// (gone by T+25); each eviction request allows 250 ms.
const wantAuditTable = `2 nodes match karpenter.sh/capacity-type=spot or eks.amazonaws.com/capacityType=SPOT or cloud.google.com/gke-spot=true or cloud.google.com/gke-preemptible=true or kubernetes.azure.com/scalesetpriority=spot; every namespace; safety margin 5s

WORKLOAD              WINDOW         ON SPOT  FULL GRACE  CUT SHORT          FORCED PAST PDB  DIES WITH MACHINE
shop/CronJob/nightly  120s aws       1/1 all  0           0                  0                1
shop/CronJob/nightly  30s gcp,azure  1/1 all  0           0                  0                1
shop/Deployment/web   120s aws       2/3      2           0                  0                0
shop/Deployment/web   30s gcp,azure  2/3      0           2 (by up to 7s)    0                0
shop/Pod/solo         120s aws       1/1 all  1           0                  0                0
shop/Pod/solo         30s gcp,azure  1/1 all  1           0                  0                0
shop/ReplicaSet/bare  120s aws       1/1 all  0           1 (by up to 487s)  0                0
shop/ReplicaSet/bare  30s gcp,azure  1/1 all  0           1 (by up to 577s)  0                0
shop/StatefulSet/db   120s aws       2/2 all  0           0                  2                0
shop/StatefulSet/db   30s gcp,azure  2/2 all  0           0                  2                0

CSI node plugins that do not tolerate the interruption taint forever: kube-controller-manager deletes them at the
notice, and the volumes of the pods evicted after them are not released (their detach waits six minutes).
Give them a toleration of the interruption taint without tolerationSeconds (or operator: Exists):
  kube-system/disk-csi-node-own on spot-a
`

func TestAuditTable(t *testing.T) {
	c, client := auditClient(t)
	var out, errOut bytes.Buffer
	// The NoExecute mode, explicitly (the default is --interruption-eviction=reprieve), whose
	// taint kube-controller-manager acts on: the CSI node plugins are listed.
	if code := runAudit(context.Background(), []string{"--interruption-eviction=kube-controller-manager"}, &out, &errOut, planNow, client); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if out.String() != wantAuditTable {
		t.Errorf("got\n%s\nwant\n%s", out.String(), wantAuditTable)
	}
	// It only reads.
	for _, a := range c.Actions() {
		if v := a.GetVerb(); v != "list" && v != "get" && v != "watch" {
			t.Errorf("the audit sent a %s of %s", v, a.GetResource().Resource)
		}
	}
	// Namespace other has no pod on a spot node: none of its objects is listed.
	for _, a := range c.Actions() {
		if a.GetNamespace() == "other" {
			t.Errorf("the audit listed %s in namespace other", a.GetResource().Resource)
		}
	}
}

func TestAuditJSON(t *testing.T) {
	_, client := auditClient(t)
	var out, errOut bytes.Buffer
	if code := runAudit(context.Background(), []string{"--window=60s", "-n", "shop", "--node-selector=karpenter.sh/capacity-type=spot", "-o", "json"},
		&out, &errOut, planNow, client); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var got AuditReport
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("output is not a report: %v\n%s", err, out.String())
	}
	// One node, a 60 s window (gone by T+55): web's 30 s fit, bare's 600 s are cut to 53 s (less
	// the allowance and the kubelet's reaction).
	want := AuditReport{
		NodeSelectors: []string{"karpenter.sh/capacity-type=spot"}, Namespace: "shop", Nodes: []string{"spot-a"},
		SafetyMarginSeconds: 5, Windows: []AuditWindow{{Seconds: 60}},
		Workloads: []WorkloadAudit{
			{Namespace: "shop", Kind: "CronJob", Name: "nightly", Pods: 1, PodsOnSpot: 1, AllOnSpot: true,
				Outcomes: []AuditOutcome{{WindowSeconds: 60, DiesWithMachine: 1}}},
			{Namespace: "shop", Kind: "Deployment", Name: "web", Pods: 3, PodsOnSpot: 1,
				Outcomes: []AuditOutcome{{WindowSeconds: 60, FullGrace: 1}}},
			{Namespace: "shop", Kind: "ReplicaSet", Name: "bare", Pods: 1, PodsOnSpot: 1, AllOnSpot: true,
				Outcomes: []AuditOutcome{{WindowSeconds: 60, CutShort: 1, MaxCutSeconds: 547}}},
			{Namespace: "shop", Kind: "StatefulSet", Name: "db", Pods: 2, PodsOnSpot: 1,
				Outcomes: []AuditOutcome{{WindowSeconds: 60, PDBForced: 1}}},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%+v\nwant\n%+v", got, want)
	}
	// The JSON field names are documented (docs/workloads.md): a rename breaks users' scripts.
	for _, field := range []string{`"nodeSelectors"`, `"namespace"`, `"nodes"`, `"safetyMarginSeconds"`, `"windows"`, `"seconds"`, `"workloads"`,
		`"kind"`, `"name"`, `"pods"`, `"podsOnSpot"`, `"allOnSpot"`, `"outcomes"`, `"windowSeconds"`, `"fullGrace"`, `"cutShort"`,
		`"maxCutSeconds"`, `"pdbForced"`, `"diesWithMachine"`} {
		if !strings.Contains(out.String(), field) {
			t.Errorf("JSON lacks %s", field)
		}
	}
}

func TestAuditNoNodes(t *testing.T) {
	_, client := auditClient(t)
	var out, errOut bytes.Buffer
	if code := runAudit(context.Background(), []string{"--node-selector=pool=none"}, &out, &errOut, planNow, client); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if want := "(no workload has a pod on these nodes)\n"; !strings.HasSuffix(out.String(), want) || !strings.HasPrefix(out.String(), "0 nodes match pool=none;") {
		t.Errorf("got %q", out.String())
	}
}

func TestAuditUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "yaml"}, `-o "yaml": want table or json`},
		{[]string{"--window=5s"}, "--window 5s: want longer than the safety margin 5s"},
		{[]string{"--node-selector=a in (b"}, `--node-selector "a in (b"`},
		{[]string{"--interruption-taint=nope"}, `--interruption-taint "nope"`},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		var out, errOut bytes.Buffer
		code := runAudit(context.Background(), tc.args, &out, &errOut, planNow, func(config.Config) (kube.Interface, error) {
			t.Fatalf("%v: a client was made for bad usage", tc.args)
			return nil, nil
		})
		if code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

func TestAuditEnv(t *testing.T) {
	_, client := auditClient(t)
	t.Setenv("REPRIEVE_OUTPUT", "json")
	t.Setenv("REPRIEVE_WINDOW", "60s")
	var out, errOut bytes.Buffer
	if code := runAudit(context.Background(), nil, &out, &errOut, planNow, client); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var got AuditReport
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || len(got.Windows) != 1 || got.Windows[0].Seconds != 60 {
		t.Errorf("with $REPRIEVE_OUTPUT=json and $REPRIEVE_WINDOW=60s: %v, windows %+v", err, got.Windows)
	}
	t.Setenv("REPRIEVE_WINDOW", "soon")
	if code := runAudit(context.Background(), nil, &out, &errOut, planNow, client); code != 2 || !strings.Contains(errOut.String(), "$REPRIEVE_WINDOW") {
		t.Errorf("a variable that does not parse: exit %d, %q", code, errOut.String())
	}
}

func TestAuditListError(t *testing.T) {
	c, client := auditClient(t)
	c.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("fake")
	})
	var out, errOut bytes.Buffer
	if code := runAudit(context.Background(), nil, &out, &errOut, planNow, client); code != 1 || !strings.Contains(errOut.String(), "listing pods: fake") {
		t.Errorf("exit %d, %q; want 1 and the failed action", code, errOut.String())
	}
}
