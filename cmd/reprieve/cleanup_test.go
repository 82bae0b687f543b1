package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	"github.com/reprieve-dev/reprieve/agent/record"
)

func TestCleanupFlags(t *testing.T) {
	noClient := func(config.Config) (kube.Interface, error) {
		t.Fatal("a client was made for flags that are wrong")
		return nil, nil
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "give --node NAME or --all-nodes"},
		{[]string{"--node=a", "--all-nodes"}, "give --node NAME or --all-nodes"},
		{[]string{"--all-nodes", "--wait-for-pods-gone=kube-system"}, `--wait-for-pods-gone "kube-system": want NAMESPACE/SELECTOR`},
		{[]string{"--all-nodes", "extra"}, `unexpected argument "extra"`},
	} {
		var out, errOut bytes.Buffer
		if code := runCleanup(context.Background(), c.args, &out, &errOut, noClient); code != 2 || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("cleanup %q: exit %d, %q; want 2 and %q", c.args, code, errOut.String(), c.want)
		}
	}
}

// The whole command on the fake clientset, whose tracker applies merge and strategic merge
// patches (k8s.io/client-go/testing's ObjectTracker). What the API server and the cleanup
// policy enforce is the e2e test's (test/e2e/lifecycle_uninstall_test.go).
func TestCleanupRemovesReprievesMarks(t *testing.T) {
	owned := `{"taints":["reprieve.io/memory-pressure:NoSchedule"],"labels":["` + record.LabelExcludeFromLB + `"]}`
	c := fake.NewClientset(
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{record.LabelExcludeFromLB: "true", "pool": "spot"},
			Annotations: map[string]string{record.AnnotationOwned: owned, "keep": "me"}},
			Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "reprieve.io/memory-pressure", Value: "true", Effect: v1.TaintEffectNoSchedule},
				{Key: "dedicated", Value: "gpu", Effect: v1.TaintEffectNoSchedule}}},
			Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue},
				{Type: record.ConditionInterruption, Status: v1.ConditionFalse, Reason: record.ReasonNoInterruption}}}},
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"}},
		// Another release's agent still runs on c: its marks are that agent's.
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "c", Annotations: map[string]string{record.AnnotationOwned: "{}"}}},
		&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "reprieve-gpu-x", Namespace: "kube-system", Labels: map[string]string{"app.kubernetes.io/name": "reprieve"}},
			Spec: v1.PodSpec{NodeName: "c"}})
	clientFor := func(config.Config) (kube.Interface, error) { return kubetest.Wrap(c), nil }
	var out, errOut bytes.Buffer
	if code := runCleanup(context.Background(), []string{"--all-nodes", "--skip-nodes-with-pods=app.kubernetes.io/name=reprieve"}, &out, &errOut, clientFor); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	n, err := c.CoreV1().Nodes().Get(context.Background(), "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "dedicated" || n.Labels[record.LabelExcludeFromLB] != "" || n.Labels["pool"] != "spot" ||
		n.Annotations[record.AnnotationOwned] != "" || n.Annotations["keep"] != "me" || len(n.Status.Conditions) != 1 || n.Status.Conditions[0].Type != v1.NodeReady {
		t.Errorf("node a after cleanup: taints %v, labels %v, annotations %v, conditions %v; want only what others wrote",
			n.Spec.Taints, n.Labels, n.Annotations, n.Status.Conditions)
	}
	if n, _ := c.CoreV1().Nodes().Get(context.Background(), "c", metav1.GetOptions{}); n.Annotations[record.AnnotationOwned] == "" {
		t.Error("node c, where another release's agent runs, was cleaned; want it left alone")
	}
	if !strings.Contains(out.String(), "cleaned 1 of 2 node(s)") || !strings.Contains(out.String(), "node c: left alone") {
		t.Errorf("output %q; want it to count the one node cleaned", out.String())
	}
}
