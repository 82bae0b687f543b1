package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/whatif"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestPlanMatchesTheAgent runs `reprieve plan` (the real binary, as an operator would with their
// own credentials) for a notice about to arrive, then makes that notice arrive and lets the agent
// handle it: every pod the plan evicts is evicted when and with the grace the plan says, PDB
// refusals end in a delete at the time the plan gives, and every pod the plan skips stays.
func TestPlanMatchesTheAgent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "plan", "plan-node"
	setupNode(ctx, t, ns, node, nil)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	if err := scenario.Create(ctx, env.Client, ns, node, taint, []scenario.Pod{
		{Name: "no-toleration", Kind: scenario.Plain, Grace: ptr64(2)},
		{Name: "tolerate-5", Kind: scenario.Plain, Tolerate: ptr64(5), Grace: ptr64(2)},
		{Name: "tolerate-15", Kind: scenario.Plain, Tolerate: ptr64(15), Grace: ptr64(3)},
		{Name: "tolerate-600", Kind: scenario.Plain, Tolerate: ptr64(600), Grace: ptr64(4)},
		{Name: "pdb-blocked", Kind: scenario.Plain, Tolerate: ptr64(8), Grace: ptr64(2), PDB: true},
		{Name: "forever", Kind: scenario.Plain, Tolerate: ptr64(scenario.Forever), Grace: ptr64(1)},
		{Name: "daemonset", Kind: scenario.DaemonSet, Grace: ptr64(1)},
	}); err != nil {
		t.Fatal(err)
	}
	// kube-controller-manager's disruption controller does not run here, so the budget's
	// status allows no disruption: the API server refuses its evictions, and the plan, which
	// reads the status, says so.
	noticeAt := time.Now().Add(3 * time.Second).Truncate(time.Second)
	deadline := noticeAt.Add(30 * time.Second)
	out, err := exec.CommandContext(ctx, reprieveBin, "plan", "--kubeconfig="+env.Kubeconfig, "--node="+node,
		"--deadline="+deadline.Format(time.RFC3339), "--notice-time="+noticeAt.Format(time.RFC3339), "-o", "json").Output()
	if err != nil {
		t.Fatalf("reprieve plan: %v", err)
	}
	var plan whatif.NodePlan
	if err := json.Unmarshal(out, &plan); err != nil {
		t.Fatalf("reprieve plan printed no plan: %v\n%s", err, out)
	}

	obs, err := scenario.Observe(ctx, env.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Stop()
	// The agent reads the node's deadline annotation at each poll: at the default 1 s, it saw the
	// notice up to 1.1 s after noticeAt, while the taint's timeAdded (whole seconds) said it saw
	// it at noticeAt, so a pod due at once was "late" against the plan by the poll, not by the
	// plan (one run: T+1.05 s). Polling every 200 ms keeps that under the test's slack.
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none", "--poll-interval=200ms")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	select {
	case <-time.After(time.Until(noticeAt.Add(100 * time.Millisecond))):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	setDeadline(ctx, t, node, deadline.UTC().Format(time.RFC3339))
	n := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	taintSeen := time.Now()
	// The agent stamps the taint when it sees the notice; the plan assumed noticeAt. Times the
	// taint decides move with it; times the deadline decides do not.
	shift := taintOf(n, taint).TimeAdded.Sub(noticeAt)
	if shift != 0 {
		t.Logf("the agent saw the notice at %v, %v after the planned notice time", taintOf(n, taint).TimeAdded.Time, shift)
	}
	waitHandled(ctx, t, node, deadline.Add(-config.DefaultConfig().SafetyMargin))

	recs := obs.Records()
	// A plan of no pods would pass every check below.
	if len(plan.Pods) != 7 {
		t.Fatalf("the plan has %d pods, want the 7 created: %+v", len(plan.Pods), plan.Pods)
	}
	// When the API server received each eviction, and the agent's taint (timing_test.go).
	var evicted []string
	for _, p := range plan.Pods {
		if p.Action != "skip" && !recs[p.Name].DeletedAt.IsZero() {
			evicted = append(evicted, p.Name)
		}
	}
	tm := auditTiming(ctx, t, env, ns, agentUser, []string{rp.LogPath()}, evicted...)
	knowable := tm.nodeWritten(node, taintSeen)
	for _, p := range plan.Pods {
		r := recs[p.Name]
		if p.Action == "skip" {
			if !r.DeletedAt.IsZero() {
				t.Errorf("%s: the plan skips it (%s), the agent evicted it at %v", p.Name, p.SkipReason, r.DeletedAt)
			}
			continue
		}
		// The plan's send time: its EvictAt, shifted with the taint when the taint decides;
		// one the deadline decides leaves plan.EvictionLead before it (SendAt) and the margin
		// the agent measures, which checkSent reads from its log.
		want, byDeadline := p.SendAt.Add(shift), p.ByDeadline
		if p.ByDeadline {
			want = *p.EvictAt
		}
		if p.PDB != nil && p.PDB.Blocks {
			// Refused until just before the latest start, then deleted: the time the plan's
			// "then" names.
			want, byDeadline = *p.Latest, true
		}
		if r.DeletedAt.IsZero() {
			t.Errorf("%s: the plan evicts it at %v, the agent never did", p.Name, want)
			continue
		}
		sent := tm.checkSent(t, p.Name, want, noticeAt.Add(shift), knowable, byDeadline)
		// The plan's grace when it fitted as the request left, as TestSpotInterruption
		// checks it: a loaded run's eviction of tolerate-600, sent at its plan with 4 s, waited
		// in the server's queue past its bound (1.17 s), and the force point's DELETE that
		// followed had 2 s left before the window's end (issue 52).
		g := tm.graceFitted(t, p.Name, int64(p.GraceSeconds), tm.carriedAt(p.Name, r.Grace, sent), deadline.Add(-config.DefaultConfig().SafetyMargin))
		tolerance := int64(1)
		if float64(g) == p.GraceSeconds {
			tolerance = 0
		}
		if absDiff(r.Grace, g) > tolerance {
			t.Errorf("%s: evicted with grace %ds, the plan says %gs; %ds (±%d) fitted as the request left, with the agent's queueing margin", p.Name, r.Grace, p.GraceSeconds, g, tolerance)
		}
	}
	t.Logf("plan for %d pods matched the agent (notice seen %v after the planned time)", len(plan.Pods), shift)
}
