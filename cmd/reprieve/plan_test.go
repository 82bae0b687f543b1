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

	"github.com/reprieve-dev/reprieve/agent"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
)

var planNow = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func planClient(t *testing.T) func(agent.Config) (kube.Interface, error) {
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
	return func(agent.Config) (kube.Interface, error) { return kubetest.Wrap(c), nil }
}

func TestPlanJSON(t *testing.T) {
	var out, errOut bytes.Buffer
	code := runPlan(context.Background(), []string{"--node=n1", "--deadline=120s", "-o", "json"}, &out, &errOut, planNow, planClient(t))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var plan agent.NodePlan
	if err := json.Unmarshal(out.Bytes(), &plan); err != nil {
		t.Fatalf("output is not a plan: %v\n%s", err, out.String())
	}
	if plan.Node != "n1" || !plan.Deadline.Equal(planNow.Add(120*time.Second)) || !plan.WindowEnd.Equal(planNow.Add(115*time.Second)) {
		t.Errorf("node %s deadline %v window end %v", plan.Node, plan.Deadline, plan.WindowEnd)
	}
	if len(plan.Pods) != 2 {
		t.Fatalf("%d pods planned, want 2", len(plan.Pods))
	}
	got := map[string]agent.PodPlan{}
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
	if code := runPlan(context.Background(), []string{"--node=n1", "--deadline=2026-12-01T10:02:00Z"}, &out, &errOut, planNow, planClient(t)); code != 0 {
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
	failing := func(agent.Config) (kube.Interface, error) { return nil, errors.New("no cluster here") }
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
				agent.NodePlan
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
