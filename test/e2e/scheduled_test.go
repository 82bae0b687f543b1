package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// TestScheduledMaintenance reads events/maintenance/scheduled from amazon-ec2-metadata-mock (its
// own NotBefore date format): an event further away than --maintenance-lead only adds the
// NoSchedule maintenance taint and evicts nothing; within the lead it interrupts, with NotBefore
// as the deadline; once the event is cancelled a restarted agent undoes what it added.
func TestScheduledMaintenance(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, node = "maint", "maint-node"
	setupNode(ctx, t, ns, node, nil)
	interruption, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	maintenance, _ := config.ParseTaint(config.DefaultConfig().MaintenanceTaint)
	if err := scenario.Create(ctx, env.Client, ns, node, interruption, []scenario.Pod{{Name: "evictee", Kind: scenario.Plain, Grace: ptr64(2)}}); err != nil {
		t.Fatal(err)
	}
	notBefore := time.Now().Add(2 * time.Hour).UTC().Truncate(time.Second)
	mock := startEventsMock(ctx, t, "active", notBefore)

	// Phase 1: two hours ahead, lead 10 minutes.
	rp := startAgent(ctx, t, node, mock, "--maintenance-lead=10m")
	n := waitNode(ctx, t, node, "the maintenance taint", func(n *v1.Node) bool { return hasTaint(n, maintenance.Key, maintenance.Effect) })
	if hasTaint(n, interruption.Key, interruption.Effect) {
		t.Fatalf("an event two hours ahead must not add the NoExecute taint: %+v", n.Spec.Taints)
	}
	// Let a few more polls pass (counted by the agent's own metric), then check nothing moved.
	waitPolls(ctx, t, rp, 3)
	if p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "evictee", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("an event outside the lead evicted a pod (err %v)", err)
	}
	stopAgent(t, rp)

	// Phase 2: the same event, now within a three-hour lead.
	rp = startAgent(ctx, t, node, mock, "--maintenance-lead=3h")
	n = waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool {
		return hasTaint(n, interruption.Key, interruption.Effect) && !hasTaint(n, maintenance.Key, maintenance.Effect)
	})
	if got := n.Annotations[record.AnnotationReclaimDeadline]; got != notBefore.Format(time.RFC3339) {
		t.Errorf("deadline annotation %q, want NotBefore %s", got, notBefore.Format(time.RFC3339))
	}
	waitFor(ctx, t, "evictee evicted", func() bool {
		p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "evictee", metav1.GetOptions{})
		return err != nil || p.DeletionTimestamp != nil
	})
	stopAgent(t, rp)
	_ = mock.proc.Stop()

	// Phase 3: the event is cancelled; a new agent undoes what the old one added.
	cancelled := startEventsMock(ctx, t, "canceled", notBefore)
	rp = startAgent(ctx, t, node, cancelled, "--maintenance-lead=3h")
	n = waitNode(ctx, t, node, "the undo", func(n *v1.Node) bool { return !hasTaint(n, interruption.Key, interruption.Effect) })
	if _, ok := n.Annotations[record.AnnotationReclaimDeadline]; ok {
		t.Errorf("deadline annotation left after the event was cancelled: %v", n.Annotations)
	}
	if _, ok := n.Labels[v1.LabelNodeExcludeBalancers]; ok {
		t.Errorf("load-balancer label left after the event was cancelled")
	}
	stopAgent(t, rp)
	_ = cancelled.proc.Stop()
}

type mockIMDS struct {
	proc     *testenv.Process
	endpoint string
}

func startEventsMock(ctx context.Context, t *testing.T, state string, notBefore time.Time) mockIMDS {
	t.Helper()
	p, endpoint, err := testenv.StartIMDSMock(ctx, logDir, "--imdsv2", "events", "--code=instance-stop",
		"--state="+state, "--not-before="+notBefore.Format(time.RFC3339),
		"--not-after="+notBefore.Add(time.Hour).Format(time.RFC3339),
		"--not-before-deadline="+notBefore.Add(2*time.Hour).Format(time.RFC3339))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return mockIMDS{proc: p, endpoint: endpoint}
}

type runningAgent struct {
	proc *testenv.Process
	addr string
}

func startAgent(ctx context.Context, t *testing.T, node string, m mockIMDS, args ...string) runningAgent {
	t.Helper()
	p, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, append([]string{
		"--kubeconfig=" + agentKubeconfig, "--provider=aws", "--aws-imds-endpoint=" + m.endpoint,
	}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return runningAgent{proc: p, addr: addr}
}

func stopAgent(t *testing.T, a runningAgent) {
	t.Helper()
	if err := a.proc.Stop(); err != nil {
		t.Fatal(err)
	}
	if code, err := a.proc.Wait(time.Second); err != nil || code != 0 {
		t.Errorf("reprieve exit %d, %v; want 0 after SIGTERM\n%s", code, err, a.proc.LogTail(20))
	}
}

// waitPolls waits until the agent has made n more successful polls than now.
func waitPolls(ctx context.Context, t *testing.T, a runningAgent, n int) {
	t.Helper()
	count := func() int {
		text, err := scenario.Scrape(a.addr)
		if err != nil {
			return -1
		}
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, `reprieve_metadata_polls_total{outcome="ok"`) {
				f := strings.Fields(line)
				v, _ := strconv.Atoi(f[len(f)-1])
				return v
			}
		}
		return -1
	}
	start := count()
	waitFor(ctx, t, "more polls", func() bool { return count() >= start+n })
}
