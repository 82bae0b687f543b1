package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
)

// The messages are k8s.io/apiserver's: ErrCallingWebhook.Error() inside NewInternalError
// (admission/plugin/webhook/validating/dispatcher.go) for a guard that does not answer or whose
// certificate the caBundle does not verify.
func TestGuardUnreachable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{apierrors.NewInternalError(errors.New(`failed calling webhook "eviction-guard.reprieve.io": failed to call webhook: Post "https://reprieve-eviction-guard.kube-system.svc:443/validate-eviction?timeout=3s": dial tcp 10.0.0.1:443: connect: connection refused`)), true},
		{apierrors.NewInternalError(errors.New(`failed calling webhook "eviction-guard.reprieve.io": failed to call webhook: Post "https://127.0.0.1:1/validate-eviction": tls: failed to verify certificate: x509: certificate signed by unknown authority`)), true},
		// Another webhook, the guard's refusal (403), a budget (429): not the guard down.
		{apierrors.NewInternalError(errors.New(`failed calling webhook "other.example.com": connection refused`)), false},
		{apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New(`admission webhook "eviction-guard.reprieve.io" denied the request`)), false},
		{apierrors.NewTooManyRequests("budget", 1), false},
		{nil, false},
	} {
		if got := guardUnreachable(c.err); got != c.want {
			t.Errorf("guardUnreachable(%v) = %v; want %v", c.err, got, c.want)
		}
	}
}

// TestCheckGuardPlacement (issue 49, item 1): doctor says where the eviction guard runs: off spot
// capacity on separate hosts is ok; a replica on a spot node (evictionGuard.offSpot preferred on
// a spot-only cluster) is a warning with its cost; two on one host, or one not scheduled, too.
func TestCheckGuardPlacement(t *testing.T) {
	node := func(name string, l map[string]string) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
	}
	guardPod := func(name, node string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name,
			Labels: map[string]string{"app.kubernetes.io/component": "eviction-guard"}}, Spec: v1.PodSpec{NodeName: node},
			Status: v1.PodStatus{Phase: v1.PodRunning}}
	}
	spot, od := map[string]string{"eks.amazonaws.com/capacityType": "SPOT"}, map[string]string{"eks.amazonaws.com/capacityType": "ON_DEMAND"}
	for _, c := range []struct {
		name string
		objs []runtime.Object
		want []string
	}{
		{"off spot, separate hosts", []runtime.Object{node("a", od), node("b", od), guardPod("g1", "a"), guardPod("g2", "b")},
			[]string{"ok    eviction guard: 2 replica(s) off spot capacity, on separate hosts"}},
		{"spot-only cluster", []runtime.Object{node("s1", spot), node("s2", spot), guardPod("g1", "s1"), guardPod("g2", "s2")},
			[]string{"WARN  eviction guard: kube-system/g1 on s1 (eks.amazonaws.com/capacityType=SPOT), kube-system/g2 on s2", "past their PodDisruptionBudgets"}},
		{"one host", []runtime.Object{node("a", od), guardPod("g1", "a"), guardPod("g2", "a")},
			[]string{"WARN  eviction guard: kube-system/g1 and kube-system/g2 on a: one host's loss"}},
		{"pending", []runtime.Object{node("a", od), guardPod("g1", "a"), guardPod("g2", "")},
			[]string{"WARN  eviction guard: kube-system/g2 not scheduled"}},
		{"none", []runtime.Object{node("a", od)}, []string{"skip  eviction guard placement: no guard pod"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			r := &doctorReport{w: &out}
			checkGuardPlacement(context.Background(), r, kubetest.Wrap(fake.NewClientset(c.objs...)))
			for _, w := range c.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("no %q in\n%s", w, out.String())
				}
			}
			if r.failed != 0 {
				t.Errorf("%d failures; placement is only ever a warning", r.failed)
			}
		})
	}
}
