package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	for _, want := range []string{"deadline 2026-12-01T10:02:00Z (T+120.0s)", "shop/web", "T+30.0s", "cloud=spot:NoExecute tolerated cloud=spot:NoExecute for 30s", "jobs/batch"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
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
		{[]string{"--deadline=120s"}, 2, "--node-name"},
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
