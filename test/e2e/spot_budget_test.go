package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/providers/aws"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// TestSpotSwitchOfEvictionModeMidWindow (issue 36, item 2): an agent of the default
// --interruption-eviction puts cloud=spot:NoExecute on at T and is killed at T+3; the next agent
// runs with --interruption-eviction=reprieve. It replaces the taint by cloud=spot:NoSchedule
// with the same timeAdded, leaves one taint of the key on the node, and evicts a pod that
// tolerates the taint for 12 s at T+12: the countdown did not start again at the restart.
func TestSpotSwitchOfEvictionModeMidWindow(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node, tolerate = "mode-switch", "mode-switch-node", 12
	taint, obs := observedNode(ctx, t, ns, node, []scenario.Pod{{Name: "tol-12", Kind: scenario.Plain, Tolerate: ptr64(tolerate), Grace: ptr64(1)}})

	deadline := time.Now().Add(45 * time.Second).UTC().Truncate(time.Second)
	mock, endpoint, err := testenv.StartIMDSMock(ctx, logDir, "--imdsv2", "spot", "--action=terminate", "--time="+deadline.Format(time.RFC3339))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mock.Stop() }()
	args := []string{"--kubeconfig=" + agentKubeconfig, "--provider=aws", "--aws-imds-endpoint=" + endpoint}
	first, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Stop() }()
	T := recordOf(waitRecord(ctx, t, node, 30*time.Second, taint, aws.PathSpotInstanceAction), taint).TimeAdded

	sleepUntil(ctx, t, T.Add(3*time.Second))
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	second, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node+"-2", append(args, "--node-name="+node, "--interruption-eviction=reprieve")...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = second.Stop() }()

	var n *v1.Node
	if !eventually(ctx, 15*time.Second, func() bool {
		got, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		n = got
		return hasTaint(got, taint.Key, v1.TaintEffectNoSchedule) && !hasTaint(got, taint.Key, v1.TaintEffectNoExecute)
	}) {
		t.Fatalf("the new agent did not replace the taint: %+v", n.Spec.Taints)
	}
	var ofKey []v1.Taint
	for _, tt := range n.Spec.Taints {
		if tt.Key == taint.Key {
			ofKey = append(ofKey, tt)
		}
	}
	if len(ofKey) != 1 || ofKey[0].TimeAdded == nil || !ofKey[0].TimeAdded.Time.Equal(T) {
		t.Errorf("taints of %s after the switch: %+v; want one, NoSchedule, with timeAdded %v", taint.Key, ofKey, T)
	}
	if own := n.Annotations[record.AnnotationOwned]; !strings.Contains(own, taint.Key+":NoSchedule") || strings.Contains(own, taint.Key+":NoExecute") {
		t.Errorf("%s = %q; want the NoSchedule taint owned, the NoExecute one no more", record.AnnotationOwned, own)
	}
	eventually(ctx, time.Until(T.Add(tolerate*time.Second))+10*time.Second, func() bool {
		return !obs.Records()["tol-12"].DeletedAt.IsZero()
	})
	evictedAt(ctx, t, obs, ns, "tol-12", T.Add(tolerate*time.Second), T, false, first, second)
}
