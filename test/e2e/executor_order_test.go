package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestCongestedServerMorePodsThanWorkers (issue 38, case 1, on the real control plane): two
// eviction workers, 20 pods with a 10 s grace due at the notice, every request of the agent's
// about 3 s on the wire (a TCP proxy delays its bytes 1.5 s each way, a congested server as
// the agent sees it), and one pod with a 60 s grace that tolerates the taint 20 s: due at
// T+20, its last safe moment at T+55 (deadline T+120, margin 5 s). It must be sent by its last
// safe moment with its whole grace, ahead of the pods queued at the notice whose moments are
// later. With the gate holding the worker of each waiting request, the queue behind them was
// first in, first out: in the unit model of this scenario it went at T+80 with 30 s.
func TestCongestedServerMorePodsThanWorkers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const ns, node = "order", "order-node"
	setupNode(ctx, t, ns, node, nil)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	var pods []scenario.Pod
	for i := range 20 {
		pods = append(pods, scenario.Pod{Name: fmt.Sprintf("p%02d", i), Kind: scenario.Plain, Grace: ptr64(10)})
	}
	pods = append(pods, scenario.Pod{Name: "late", Kind: scenario.Plain, Tolerate: ptr64(20), Grace: ptr64(60)})
	obs := createObserved(ctx, t, ns, node, taint, pods)

	slow := slowAgentKubeconfig(t, 1500*time.Millisecond)
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+slow, "--provider=none", "--eviction-workers=2")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	deadline := time.Now().Add(120 * time.Second).UTC().Truncate(time.Second)
	setDeadline(ctx, t, node, deadline.Format(time.RFC3339))
	nd := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	timeAdded := taintOf(nd, taint).TimeAdded.Time
	end := deadline.Add(-config.DefaultConfig().SafetyMargin)
	last := lastStart(end, 60*time.Second)
	waitFor(ctx, t, "the late pod's eviction", func() bool { return !obs.Records()["late"].DeletedAt.IsZero() })
	r := obs.Records()["late"]
	t.Logf("late pod: due T+20, last safe moment T+%.0fs; evicted T+%.2fs with %d s", last.Sub(timeAdded).Seconds(), r.DeletedAt.Sub(timeAdded).Seconds(), r.Grace)
	// The observer sees the deletion a watch event after the server made it (up to a second
	// here): within that of its last safe moment.
	if r.DeletedAt.After(last.Add(time.Second)) || r.Grace < 60 {
		t.Fatalf("the pod due at T+20 with its last safe moment at T+%.0fs was evicted at T+%.2fs with %d s; want by its last safe moment with its whole 60 s",
			last.Sub(timeAdded).Seconds(), r.DeletedAt.Sub(timeAdded).Seconds(), r.Grace)
	}
	waitFor(ctx, t, "every pod evicted", func() bool {
		recs := obs.Records()
		for _, p := range pods {
			if recs[p.Name].DeletedAt.IsZero() {
				return false
			}
		}
		return true
	})
	for _, p := range pods {
		if d := obs.Records()[p.Name].DeletedAt; d.After(end) {
			t.Errorf("%s evicted at T+%.2fs, after the window's end", p.Name, d.Sub(timeAdded).Seconds())
		}
	}
}
