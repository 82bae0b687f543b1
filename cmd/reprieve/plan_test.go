package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	"github.com/reprieve-dev/reprieve/agent/whatif"
)

var planNow = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func planClient(t *testing.T) func(config.Config) (kube.Interface, error) {
	t.Helper()
	sec := func(v int64) *int64 { return &v }
	objs := []*v1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"}, Spec: v1.PodSpec{NodeName: "n1", TerminationGracePeriodSeconds: sec(10),
			Tolerations: []v1.Toleration{{Key: "cloud", Operator: v1.TolerationOpEqual, Value: "spot", Effect: v1.TaintEffectNoExecute, TolerationSeconds: sec(30)}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "batch", Namespace: "jobs"}, Spec: v1.PodSpec{NodeName: "n1", TerminationGracePeriodSeconds: sec(5)}},
		// On another node: the fake clientset ignores the spec.nodeName field selector, so
		// this pod proves the plan keeps only the node's own pods.
		{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere", Namespace: "jobs"}, Spec: v1.PodSpec{NodeName: "n2", TerminationGracePeriodSeconds: sec(5)}},
	}
	c := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	for _, p := range objs {
		if _, err := c.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return func(config.Config) (kube.Interface, error) { return kubetest.Wrap(c), nil }
}

func TestPlanJSON(t *testing.T) {
	var out, errOut bytes.Buffer
	code := runPlan(context.Background(), []string{"--node=n1", "--deadline=120s", "-o", "json"}, &out, &errOut, planNow, planClient(t))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var plan whatif.NodePlan
	if err := json.Unmarshal(out.Bytes(), &plan); err != nil {
		t.Fatalf("output is not a plan: %v\n%s", err, out.String())
	}
	if plan.Node != "n1" || !plan.Deadline.Equal(planNow.Add(120*time.Second)) || !plan.WindowEnd.Equal(planNow.Add(115*time.Second)) {
		t.Errorf("node %s deadline %v window end %v", plan.Node, plan.Deadline, plan.WindowEnd)
	}
	if len(plan.Pods) != 2 {
		t.Fatalf("%d pods planned, want 2", len(plan.Pods))
	}
	got := map[string]whatif.PodPlan{}
	for _, p := range plan.Pods {
		got[p.Namespace+"/"+p.Name] = p
	}
	if p := got["shop/web"]; p.Action != "evict" || !p.EvictAt.Equal(planNow.Add(30*time.Second)) || p.GraceSeconds != 10 {
		t.Errorf("shop/web: %+v", p)
	}
	if p := got["jobs/batch"]; p.Action != "evict" || !p.EvictAt.Equal(planNow) || p.Toleration != "none" {
		t.Errorf("jobs/batch: %+v", p)
	}
	// The JSON field names are documented: a rename breaks users' scripts.
	for _, field := range []string{`"node"`, `"noticeTime"`, `"deadline"`, `"windowEnd"`, `"safetyMarginSeconds"`, `"noExecuteTaints"`, `"pods"`,
		`"namespace"`, `"name"`, `"action"`, `"taint"`, `"toleration"`, `"due"`, `"latest"`, `"evictAt"`, `"sendAt"`, `"podGraceSeconds"`, `"graceSeconds"`} {
		if !strings.Contains(out.String(), field) {
			t.Errorf("JSON lacks %s", field)
		}
	}
}

func TestPlanTable(t *testing.T) {
	var out, errOut bytes.Buffer
	// The NoExecute mode, explicitly (the default is --interruption-eviction=reprieve).
	if code := runPlan(context.Background(), []string{"--node=n1", "--deadline=2026-12-01T10:02:00Z", "--interruption-eviction=kube-controller-manager"}, &out, &errOut, planNow, planClient(t)); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"deadline 2026-12-01T10:02:00Z (T+120.0s)", "shop/web", "T+30.0s", "cloud=spot:NoExecute tolerated cloud=spot:NoExecute for 30s", "jobs/batch",
		"Interruption eviction: kube-controller-manager (the node gets cloud=spot:NoExecute"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := runPlan(context.Background(), []string{"--node=n1", "--deadline=2026-12-01T10:02:00Z", "--interruption-eviction=reprieve"}, &out, &errOut, planNow, planClient(t)); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"Interruption eviction: reprieve (the node gets cloud=spot:NoSchedule", "NoExecute taints: cloud=spot:NoExecute@", "T+30.0s"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("reprieve mode: table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestPlanBadInput(t *testing.T) {
	failing := func(config.Config) (kube.Interface, error) { return nil, errors.New("no cluster here") }
	for _, tc := range []struct {
		args []string
		want int
		msg  string
	}{
		{[]string{"--deadline=120s"}, 2, "--node (or $NODE_NAME) is required"},
		{[]string{"--node=n1", "--deadline=soon"}, 2, `--deadline "soon"`},
		{[]string{"--node=n1", "--deadline=-5s"}, 2, "positive"},
		{[]string{"--node=n1", "--notice-time=now"}, 2, `--notice-time "now"`},
		{[]string{"--node=n1", "-o", "yaml"}, 2, `-o "yaml"`},
		{[]string{"--node=n1", "--deadline=120s"}, 1, "no cluster here"},
	} {
		t.Setenv("NODE_NAME", "")
		var out, errOut bytes.Buffer
		if code := runPlan(context.Background(), tc.args, &out, &errOut, planNow, failing); code != tc.want || !strings.Contains(errOut.String(), tc.msg) {
			t.Errorf("%q: exit %d, stderr %q; want %d naming %q", tc.args, code, errOut.String(), tc.want, tc.msg)
		}
	}
}

// TestPlanKubeletRules: plan says what it knew of the kubelet's graceful node shutdown and
// eviction thresholds, and that they are unknown when no kubelet config is found.
func TestPlanKubeletRules(t *testing.T) {
	const gke = "/home/kubernetes/kubelet-config.yaml"
	tests := []struct {
		name  string
		file  string // a GKE config at its path under the host root; "" none
		args  []string
		found bool
		want  []string // ROOT is the host root
	}{
		{
			name: "none found",
			want: []string{
				"the kubelet's graceful node shutdown: unknown (no kubelet config found at ROOT/etc/kubernetes/kubelet/config.json, ",
				"ROOT/var/lib/kubelet/config.yaml; run plan on the node",
				"the kubelet's eviction thresholds: unknown, the defaults assumed (evictionHard memory.available<100Mi,",
			},
		},
		{
			name: "explicit path missing",
			file: gke,
			args: []string{"--kubelet-config=/etc/kubelet.yaml"},
			want: []string{"the kubelet's graceful node shutdown: unknown (no kubelet config found at ROOT/etc/kubelet.yaml; "},
		},
		{
			name:  "GKE's",
			file:  gke,
			found: true,
			want: []string{
				"the kubelet's graceful node shutdown: shutdownGracePeriod 30s, 15s of it for critical pods (ROOT" + gke + ")",
				"the kubelet's eviction thresholds: evictionHard memory.available<250Mi (ROOT" + gke + ")",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if tt.file != "" {
				path := filepath.Join(root, tt.file)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				body := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 15s\nevictionHard:\n  memory.available: 250Mi\n"
				if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			args := append([]string{"--node=n1", "--deadline=120s", "--host-root=" + root}, tt.args...)
			var out, errOut bytes.Buffer
			if code := runPlan(context.Background(), args, &out, &errOut, planNow, planClient(t)); code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			for _, w := range tt.want {
				if w = strings.ReplaceAll(w, "ROOT", root); !strings.Contains(out.String(), w) {
					t.Errorf("no %q in\n%s", w, out.String())
				}
			}

			out.Reset()
			if code := runPlan(context.Background(), append(args, "-o", "json"), &out, &errOut, planNow, planClient(t)); code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			var got struct {
				whatif.NodePlan
				Kubelet struct {
					ConfigFound bool     `json:"configFound"`
					Searched    []string `json:"searched"`
					Rules       []string `json:"rules"`
				} `json:"kubelet"`
			}
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if got.Node != "n1" || len(got.Pods) != 2 {
				t.Errorf("the plan's own fields: node %q, %d pods", got.Node, len(got.Pods))
			}
			if got.Kubelet.ConfigFound != tt.found || len(got.Kubelet.Rules) != 2 || len(got.Kubelet.Searched) == 0 ||
				!strings.Contains(got.Kubelet.Rules[0], "graceful node shutdown") {
				t.Errorf("kubelet %+v, want configFound %v and the two rules", got.Kubelet, tt.found)
			}
		})
	}
}

// TestPlanVolumes (issue 40, item 2): for each pod with a volume that needs attaching, plan
// says by when it must be gone, and reads its volumes as the agent does (its claim and the
// claim's volume), each with where the node's status has it now: in use, released (attached,
// no longer in use) or not attached; a claim that cannot be read is "unknown" with why.
func TestPlanVolumes(t *testing.T) {
	sec := func(v int64) *int64 { return &v }
	claimed := func(name, claim string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "db"}, Spec: v1.PodSpec{NodeName: "n1", TerminationGracePeriodSeconds: sec(10),
			Volumes: []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
	}
	csiVolume := func(pv, claim, handle string) (*v1.PersistentVolumeClaim, *v1.PersistentVolume) {
		return &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: "db"}, Spec: v1.PersistentVolumeClaimSpec{VolumeName: pv}},
			&v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv}, Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{
				CSI: &v1.CSIPersistentVolumeSource{Driver: "ebs.csi.aws.com", VolumeHandle: handle}}}}
	}
	const a, b, c = "kubernetes.io/csi/ebs.csi.aws.com^vol-a", "kubernetes.io/csi/ebs.csi.aws.com^vol-b", "kubernetes.io/csi/ebs.csi.aws.com^vol-c"
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: v1.NodeStatus{
		VolumesInUse:    []v1.UniqueVolumeName{a},
		VolumesAttached: []v1.AttachedVolume{{Name: a}, {Name: b}}}}
	client := fake.NewClientset(node)
	for i, h := range []string{"vol-a", "vol-b", "vol-c"} {
		claim, pv := csiVolume("pv-"+h, "data-db-"+string(rune('0'+i)), h)
		if _, err := client.CoreV1().PersistentVolumeClaims("db").Create(context.Background(), claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*v1.Pod{claimed("db-0", "data-db-0"), claimed("db-1", "data-db-1"), claimed("db-2", "data-db-2"), claimed("db-3", "data-gone")} {
		if _, err := client.CoreV1().Pods("db").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	clientFor := func(config.Config) (kube.Interface, error) { return kubetest.Wrap(client), nil }

	var out, errOut bytes.Buffer
	if code := runPlan(context.Background(), []string{"--node=n1", "--deadline=120s", "-o", "json"}, &out, &errOut, planNow, clientFor); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var plan whatif.NodePlan
	if err := json.Unmarshal(out.Bytes(), &plan); err != nil {
		t.Fatalf("output is not a plan: %v\n%s", err, out.String())
	}
	want := map[string]string{"db/db-0": a + " " + whatif.VolumeInUse, "db/db-1": b + " " + whatif.VolumeReleased, "db/db-2": c + " " + whatif.VolumeNotAttached}
	for _, p := range plan.Pods {
		key := p.Namespace + "/" + p.Name
		if p.VolumeReleaseBy == nil {
			t.Errorf("%s: no volumeReleaseBy", key)
			continue
		}
		if key == "db/db-3" {
			if len(p.Volumes) != 0 || !strings.Contains(p.VolumesUnknown, `persistentvolumeclaims "data-gone" not found`) {
				t.Errorf("db/db-3: volumes %v, unknown %q; want none and the missing claim named", p.Volumes, p.VolumesUnknown)
			}
			continue
		}
		if len(p.Volumes) != 1 || string(p.Volumes[0].Name)+" "+p.Volumes[0].State != want[key] || p.VolumesUnknown != "" {
			t.Errorf("%s: volumes %+v (unknown %q), want %s", key, p.Volumes, p.VolumesUnknown, want[key])
		}
	}
	if !strings.Contains(out.String(), `"volumes"`) || !strings.Contains(out.String(), `"state"`) || !strings.Contains(out.String(), `"volumesUnknown"`) {
		t.Errorf("JSON lacks the volumes' fields:\n%s", out.String())
	}

	out.Reset()
	if code := runPlan(context.Background(), []string{"--node=n1", "--deadline=120s"}, &out, &errOut, planNow, clientFor); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, w := range []string{"Volumes that must be released before the deadline", "db/db-0: gone by T+", a + ": in use", b + ": released", c + ": not attached",
		`volumes unknown: reading pod db/db-3's volumes: volume data: getting PersistentVolumeClaim data-gone`} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, out.String())
		}
	}
}
