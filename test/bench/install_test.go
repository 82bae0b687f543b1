package main

import (
	"context"
	"errors"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/reprieve-dev/reprieve/test/testenv"
)

// The pool makes every node's agent pod and token at once (poolRun, parallel); each keeps the
// pod's name for the uninstall. Unguarded, the appends raced (the race detector in CI's smoke
// run) and a lost one left an agent pod behind. Run under -race, this fails on that code.
func TestAgentTokensMadeAtOnceKeepEveryPod(t *testing.T) {
	ctx := context.Background()
	nodes := []string{"pool-1-n00", "pool-1-n01", "pool-1-n02", "pool-1-n03"}
	for range 50 {
		c := fake.NewClientset()
		// kwok's part: a pod runs as soon as it exists, so scenario.Create's first poll passes.
		c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
			a.(k8stesting.CreateAction).GetObject().(*v1.Pod).Status.Phase = v1.PodRunning
			return false, nil, nil
		})
		// No TokenRequest: agentToken fails after it kept the pod, and writes no kubeconfig.
		c.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetSubresource() == "token" {
				return true, nil, errors.New("no tokens in this test")
			}
			return false, nil, nil
		})
		inst := &chartInstall{b: &bench{env: &testenv.Env{Client: c}, o: options{Logf: t.Logf}}}
		_ = parallel(ctx, len(nodes), 4, func(i int) error {
			_, _, err := inst.agentToken(ctx, nodes[i])
			return err
		})
		got := slices.Sorted(slices.Values(inst.agentPods))
		want := []string{"reprieve-pool-1-n00", "reprieve-pool-1-n01", "reprieve-pool-1-n02", "reprieve-pool-1-n03"}
		if !slices.Equal(got, want) {
			t.Fatalf("agent pods kept for the uninstall: %v, want %v", got, want)
		}
	}
}
