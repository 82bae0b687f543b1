package e2e

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// agentIdentity creates ServiceAccount ns/sa bound to the shipped ClusterRole "reprieve", as
// the chart binds the agent's.
func agentIdentity(ctx context.Context, t *testing.T, ns, sa string) {
	t.Helper()
	c := env.Client
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "reprieve"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.RbacV1().ClusterRoleBindings().Delete(context.Background(), sa, metav1.DeleteOptions{}) })
}

// boundAgents is the common ground of the tests that bind the agent to its node: namespace ns
// with nodes nodeA and nodeB, ServiceAccount ns/sa with the shipped ClusterRole and the shipped
// admission policies for it (in force when it returns), and on each node the agent's own pod
// agent-<node> (a DaemonSet pod of ns/sa, so the agent never evicts it) and victim-<node> (it
// tolerates the interruption taint an hour, grace 1 s). It returns the kubeconfig of a token
// bound to agent-<nodeA>, as the kubelet projects it: with nodeA as its node claim.
func boundAgents(ctx context.Context, t *testing.T, ns, sa, nodeA, nodeB string) (kubeA string) {
	t.Helper()
	return setUpBoundAgents(ctx, t, ns, sa, nodeA, nodeB, false)
}

// boundAgentsInstant is boundAgents for the tests that run alone (no t.Parallel): kwok runs
// their pods as soon as it sees them (scenario.Instant), not 2 to 10 s later.
func boundAgentsInstant(ctx context.Context, t *testing.T, ns, sa, nodeA, nodeB string) (kubeA string) {
	t.Helper()
	return setUpBoundAgents(ctx, t, ns, sa, nodeA, nodeB, true)
}

func setUpBoundAgents(ctx context.Context, t *testing.T, ns, sa, nodeA, nodeB string, instant bool) (kubeA string) {
	t.Helper()
	c := env.Client
	setupNode(ctx, t, ns, nodeA, nil)
	if _, err := env.CreateNode(ctx, nodeB, nil); err != nil {
		t.Fatal(err)
	}
	agentIdentity(ctx, t, ns, sa)
	installShippedPolicies(ctx, t, sa, ns)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	for _, node := range []string{nodeA, nodeB} {
		pods := []scenario.Pod{
			{Name: "agent-" + node, Kind: scenario.DaemonSet, ServiceAccount: sa},
			{Name: "victim-" + node, Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(1)},
		}
		if instant {
			pods = scenario.InstantAll(pods)
		}
		if err := scenario.Create(ctx, c, ns, node, taint, pods); err != nil {
			t.Fatal(err)
		}
	}
	agentPod, err := c.CoreV1().Pods(ns).Get(ctx, "agent-"+nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeA, err = env.BoundServiceAccountKubeconfig(ctx, ns, sa, agentPod)
	if err != nil {
		t.Fatal(err)
	}
	return kubeA
}
