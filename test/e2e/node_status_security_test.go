package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/agent/record"
)

// TestAgentTokenNodeStatus takes the token bound to node A's agent pod, with the shipped RBAC
// (patch on nodes/status) and the shipped policies on the real API server: it may set
// reprieve.io/Interruption on A, and is refused, naming the rule, when it sets it on node B,
// turns the kubelet's Ready off on A, sets a lifecycle condition the shipped values do not
// enable, changes another field of A's status, or A's labels through nodes/status.
func TestAgentTokenNodeStatus(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, sa, nodeA, nodeB = "status-attack", "reprieve-status", "status-a", "status-b"
	clientA := clientFor(t, boundAgents(ctx, t, ns, sa, nodeA, nodeB))
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	cond := func(typ v1.NodeConditionType, status v1.ConditionStatus) map[string]any {
		return map[string]any{"status": map[string]any{"conditions": []v1.NodeCondition{{Type: typ, Status: status,
			Reason: "SpotInterruption", Message: "from the agent's token", LastHeartbeatTime: now, LastTransitionTime: now}}}}
	}
	patch := func(node string, p map[string]any) error {
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = clientA.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status")
		return err
	}
	denied := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want 403 Forbidden naming %q", what, err, want)
		} else {
			t.Logf("refused as expected: %s: %v", what, err)
		}
	}

	if err := patch(nodeA, cond(record.ConditionInterruption, v1.ConditionTrue)); err != nil {
		t.Fatalf("setting reprieve.io/Interruption on its own node: %v", err)
	}
	denied("set the condition on node B", patch(nodeB, cond(record.ConditionInterruption, v1.ConditionTrue)),
		"bound to ("+nodeA+"), not "+nodeB)
	denied("turn the kubelet's Ready off", patch(nodeA, cond(v1.NodeReady, v1.ConditionFalse)), "only its own node conditions")
	denied("set MaintenancePlanned (lifecycle conditions off in the shipped values)", patch(nodeA, cond(v1.NodeMaintenancePlanned, v1.ConditionTrue)),
		"only its own node conditions")
	denied("raise the node's capacity", patch(nodeA, map[string]any{"status": map[string]any{"capacity": map[string]string{"pods": "1000"}}}),
		"no field of its node's status but its conditions")
	denied("label the node through nodes/status", patch(nodeA, map[string]any{"metadata": map[string]any{"labels": map[string]string{"evil": "true"}}}),
		"metadata through nodes/status")

	n, err := env.Client.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := nodeCondition(n, record.ConditionInterruption); c == nil || c.Status != v1.ConditionTrue {
		t.Errorf("the allowed condition is not on node A: %+v", n.Status.Conditions)
	}
	if !conditionIs(n, v1.NodeReady, v1.ConditionTrue) || nodeCondition(n, v1.NodeMaintenancePlanned) != nil || n.Labels["evil"] != "" {
		t.Errorf("a refused write landed: conditions %+v, labels %v", n.Status.Conditions, n.Labels)
	}
}

// testChartNodeConditionValues: nodeConditions.enabled grants patch on nodes/status (and false
// takes it away with the flag), and nodeConditions.lifecycle passes the flag and widens the
// status policy's allowlist by exactly KEP-5683's three conditions.
func testChartNodeConditionValues(t *testing.T) {
	const statusRule = "resources: [\"nodes/status\"]\n    verbs: [\"patch\"]"
	const lifecycleTypes = `'reprieve.io/Interruption', 'MaintenancePlanned', 'DrainInProgress', 'Drained'`
	for _, tc := range []struct {
		set             string
		rule, lifecycle bool
		env             string
	}{
		{"", true, false, ""},
		{"nodeConditions.enabled=false", false, false, "name: REPRIEVE_NODE_CONDITIONS, value: \"false\""},
		{"nodeConditions.lifecycle=true", true, true, "name: REPRIEVE_LIFECYCLE_CONDITIONS, value: \"true\""},
	} {
		var args []string
		if tc.set != "" {
			args = []string{"--set", tc.set}
		}
		out := string(render(t, "reprieve", args...))
		if got := strings.Contains(out, statusRule); got != tc.rule {
			t.Errorf("%q: ClusterRole grants nodes/status %v, want %v", tc.set, got, tc.rule)
		}
		if got := strings.Contains(out, lifecycleTypes); got != tc.lifecycle {
			t.Errorf("%q: the status policy allows the lifecycle conditions %v, want %v", tc.set, got, tc.lifecycle)
		}
		if !strings.Contains(out, "conditionsMayChange") {
			t.Errorf("%q: no status policy rendered", tc.set)
		}
		for _, e := range []string{"REPRIEVE_NODE_CONDITIONS", "REPRIEVE_LIFECYCLE_CONDITIONS"} {
			if want := tc.env != "" && strings.Contains(tc.env, e+","); strings.Contains(out, "name: "+e+",") != want {
				t.Errorf("%q: env %s rendered %v, want %v", tc.set, e, !want, want)
			}
		}
	}
}
