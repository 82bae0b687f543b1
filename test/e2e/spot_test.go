package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/record"

	v1 "k8s.io/api/core/v1"

	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

const (
	window = 45 * time.Second
	margin = 5 * time.Second
	// slack is how far an eviction may stray from its plan: the 1 s, which covers the
	// poll interval for pods due the moment the notice arrives.
	slack = time.Second
)

// expectation is the hand-computed plan for a pod of scenario.Mixed, relative to the taint's
// timeAdded (T), the reclaim deadline (D) and the window's end (E = D - margin).
type expectation struct {
	plan func(T, E time.Time) time.Time // nil: left alone
	// acted is when the eviction or delete should land, when it differs from the plan.
	acted func(T, E time.Time) time.Time
	grace func(at, E time.Time) int64
}

func atT(T, _ time.Time) time.Time { return T }

func fixed(g int64) func(time.Time, time.Time) int64 {
	return func(time.Time, time.Time) int64 { return g }
}

var expected = map[string]expectation{
	"no-toleration": {plan: atT, grace: fixed(5)},
	"tolerate-0s":   {plan: atT, grace: fixed(3)},
	"tolerate-10s":  {plan: func(T, E time.Time) time.Time { return T.Add(10 * time.Second) }, grace: fixed(5)},
	"tolerate-600s": {plan: func(T, E time.Time) time.Time { return lastStart(E, 10*time.Second) }, grace: fixed(10)},
	"default-grace": {plan: atT, grace: fixed(30)},
	// Latest (E - 300 s - the kubelet's reaction) is long past when the notice comes: evicted
	// at once, grace shortened to what is left of the window less the kubelet's reaction.
	"grace-longer-than-window": {plan: func(T, E time.Time) time.Time { return lastStart(E, 300*time.Second) },
		grace: func(at, E time.Time) int64 { return int64(lastStart(E, 0).Sub(at) / time.Second) }},
	// A PDB that allows nothing: due at T, retried until its last safe moment, then deleted
	// with its grace.
	"pdb-blocked":      {plan: atT, acted: func(T, E time.Time) time.Time { return lastStart(E, 5*time.Second) }, grace: fixed(5)},
	"tolerate-forever": {},
	"daemonset":        {},
	"mirror":           {},
}

func TestSpotInterruption(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hook := newReceiver(t)
	res := run(ctx, t, "spot", "--webhook-url="+hook.URL, "--webhook-allow-http", "--webhook-header=X-Test: spot")
	defer func() {
		if t.Failed() {
			t.Logf("reprieve's log, the lines about pods and errors:\n%s", res.AgentLines(80))
		}
	}()

	// The webhook: one message per notice (spot and the mock's rebalance recommendation) and
	// one when the interruption was handled, in Slack's {"text": ...} shape.
	msgs := hook.bodies()
	var texts []string
	for _, m := range msgs {
		var body struct{ Text string }
		if err := json.Unmarshal([]byte(m.body), &body); err != nil || body.Text == "" {
			t.Errorf("webhook body %q is not {\"text\": ...}: %v", m.body, err)
		}
		if m.header.Get("X-Test") != "spot" {
			t.Errorf("webhook header missing: %v", m.header)
		}
		texts = append(texts, body.Text)
	}
	for _, want := range []string{"Node spot-node: aws spot-interruption (terminate), deadline", "Node spot-node: Interruption handled: 7 pods evicted, 7 gone before"} {
		found := false
		for _, txt := range texts {
			found = found || strings.HasPrefix(txt, want)
		}
		if !found {
			t.Errorf("no webhook message starting %q in %q", want, texts)
		}
	}

	// The node: the taint with timeAdded, the deadline annotation, the load-balancer label.
	if d := res.TaintSeenAt.Sub(res.TimeAdded); d < 0 || d > 3*time.Second {
		t.Errorf("timeAdded %v is %v before the taint was seen; want within 3s", res.TimeAdded, d)
	}
	if got := res.Node.Annotations[record.AnnotationReclaimDeadline]; got != res.Deadline.UTC().Format(time.RFC3339) {
		t.Errorf("annotation %s = %q, want %s", record.AnnotationReclaimDeadline, got, res.Deadline.UTC().Format(time.RFC3339))
	}
	if res.Node.Labels[v1.LabelNodeExcludeBalancers] != "true" {
		t.Errorf("label %s missing: %v", v1.LabelNodeExcludeBalancers, res.Node.Labels)
	}
	// amazon-ec2-metadata-mock serves a rebalance recommendation from the start: its soft taint.
	if !hasTaint(res.Node, "reprieve.io/rebalance-recommended", v1.TaintEffectPreferNoSchedule) {
		t.Errorf("rebalance taint missing: %+v", res.Node.Spec.Taints)
	}

	assertAsPlanned(t, res, expected)
	// Events, as the API server holds them.
	reasons := res.EventReasons()
	node := "spot-node"
	for _, want := range []string{
		node + " " + events.ReasonSpotInterruption, node + " " + events.ReasonTaintApplied, node + " " + events.ReasonInterruptionHandled,
		"no-toleration " + events.ReasonEvicted, "tolerate-10s " + events.ReasonEvictionScheduled, "tolerate-10s " + events.ReasonEvicted,
		"tolerate-600s " + events.ReasonEvictionScheduled, "grace-longer-than-window " + events.ReasonGraceShortened,
		"pdb-blocked " + events.ReasonEvictionBlocked, "pdb-blocked " + events.ReasonForceDeleted,
	} {
		if reasons[want] == 0 {
			t.Errorf("no event %q; events: %v", want, reasons)
		}
	}
	for _, e := range res.NodeEvents {
		if e.Reason == events.ReasonInterruptionHandled && !strings.Contains(e.Message, "7 pods evicted, 7 gone before") {
			t.Errorf("summary = %q, want 7 pods evicted, all gone before the window's end", e.Message)
		}
	}
	for _, bad := range []string{"tolerate-forever", "daemonset", "mirror"} {
		for r := range reasons {
			if strings.HasPrefix(r, bad+" ") {
				t.Errorf("event about a pod reprieve leaves alone: %s", r)
			}
		}
	}
	for _, m := range []string{
		`reprieve_evictions_missed_deadline_total 0`,
		`reprieve_evictions_requests_total{result="evicted"} 6`,
		`reprieve_evictions_requests_total{result="forced_delete"} 1`,
		`reprieve_notices_received_total{kind="spot-interruption",provider="aws"} 1`,
	} {
		if !strings.Contains(res.Metrics, m) {
			t.Errorf("metrics lack %q", m)
		}
	}
	if res.ExitCode != 0 {
		t.Errorf("reprieve exited %d after SIGTERM, want 0", res.ExitCode)
	}
}

// assertAsPlanned checks every pod of expected against its hand-computed plan: left alone, or
// evicted at its planned moment as the API server received it (spotTiming: never before it, at
// most slack after it or after the agent's taint, plus the time the agent's other requests were
// in the server's hands), with the grace expected, and gone by the window's end.
func assertAsPlanned(t *testing.T, res *scenario.SpotResult, expected map[string]expectation) {
	t.Helper()
	end := res.Window.End()
	var evicted []string
	for name, exp := range expected {
		if row, ok := res.Row(name); ok && exp.plan != nil && !row.Record.DeletedAt.IsZero() {
			evicted = append(evicted, name)
		}
	}
	tm, knowable := spotTiming(t, res, evicted...)
	for name, exp := range expected {
		row, ok := res.Row(name)
		if !ok {
			t.Errorf("pod %s: no row", name)
			continue
		}
		rec := row.Record
		if exp.plan == nil {
			if !rec.DeletedAt.IsZero() {
				t.Errorf("pod %s: must be left alone, was deleted at %v", name, rec.DeletedAt)
			}
			if !row.Planned.IsZero() {
				t.Errorf("pod %s: planned at %v, want left alone", name, row.Planned)
			}
			continue
		}
		plan := exp.plan(res.TimeAdded, end)
		if !row.Planned.Equal(plan) {
			t.Errorf("pod %s: agent plan %v, hand-computed plan %v", name, row.Planned, plan)
		}
		want := plan
		if exp.acted != nil {
			want = exp.acted(res.TimeAdded, end)
		}
		if rec.DeletedAt.IsZero() {
			t.Errorf("pod %s: never evicted (plan %v)", name, want)
			continue
		}
		// A pod due before reprieve could know (timeAdded is truncated to the second; a latest
		// already past) is evicted when the notice is seen: no earlier than T, and due from
		// when the agent wrote its taint at the latest. A deadline-bound pod, and a
		// budget-held one at its force point, leaves the lead and the measured margin before
		// the moment it must go.
		sent := tm.checkSent(t, name, want, res.TimeAdded, knowable, row.ByDeadline || exp.acted != nil)
		// A pod's own grace must be given in full when it fitted as the request left: from
		// then, the agent allows the request its allowance and the queueing margin it
		// measured (a figure of the run: answers of seconds on a loaded machine cut a 5 s
		// grace to 4, issue 52). A grace cut to the window may differ by a second (the agent
		// computes it a little before it logs the send).
		carried := tm.carriedAt(name, rec.Grace, sent)
		g := tm.graceFitted(t, name, exp.grace(carried, end), carried, end)
		tolerance := int64(1)
		if g == row.Grace {
			tolerance = 0
		}
		if absDiff(rec.Grace, g) > tolerance {
			t.Errorf("pod %s: grace %ds, want %ds (±%d): what fitted as the request left, with the agent's queueing margin", name, rec.Grace, g, tolerance)
		}
		tm.checkInTime(t, name, rec.DeletionTimestamp, end)
	}
}

// spotTiming reads the run's audit log for the agent of res and the pods named (its identity
// is the shipped ServiceAccount's, agentKubeconfig), and returns it with when the API server
// received the agent's write of the interruption taint: the agent plans its pods as it writes
// (interrupt.Reconcile), so a pod due at the notice is due from then at the latest.
func spotTiming(t *testing.T, res *scenario.SpotResult, pods ...string) (timing, time.Time) {
	t.Helper()
	tm := auditTiming(context.Background(), t, env, res.Namespace, agentUser, []string{res.LogPath}, pods...)
	if w := tm.nodeWritten(res.Node.Name, res.TaintSeenAt); !w.IsZero() {
		return tm, w
	}
	t.Errorf("the API server's audit log has no write of node %s by %s before the test saw its taint", res.Node.Name, agentUser)
	return tm, res.TaintSeenAt
}

// TestWithTaintEvictionController runs the tests that need kube-controller-manager's
// taint-eviction, node-lifecycle, disruption and daemonset controllers (and kube-scheduler, for
// the DaemonSet's pods), as in every real cluster, side by side on one controller manager.
// Those controllers act on every tainted node, so the group is kept apart from the other tests
// (test/README.md); within it each test has its own nodes and namespaces, and each already
// expects the controllers to act on its nodes. The scheduler places only the shipped
// DaemonSet's pods: every other test's pods are bound to their node when created.
func TestWithTaintEvictionController(t *testing.T) {
	// Parallel subtests run once this function has returned, and t.Cleanup runs after them:
	// the context and the controller manager must outlive the function, so no defer.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	if err := env.StartControllerManager(ctx, "taint-eviction-controller", "nodelifecycle", "disruption", "daemonset"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.StopControllerManager)
	if err := env.StartScheduler(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.StopScheduler)
	t.Run("InstallDaemonSet", func(t *testing.T) {
		t.Parallel()
		installDaemonSets(ctx, t)
	})
	t.Run("InstallOnProfiles", func(t *testing.T) { t.Parallel(); installOnProfiles(ctx, t) })
	t.Run("SpotInterruption", func(t *testing.T) {
		t.Parallel()
		spotInterruptionWithTaintEvictionController(ctx, t)
	})
	t.Run("SpotInterruptionBudgetMode", func(t *testing.T) {
		t.Parallel()
		spotInterruptionBudgetMode(ctx, t)
	})
	t.Run("DefaultModeKeepsDaemonSetsAndBudgets", func(t *testing.T) {
		t.Parallel()
		defaultModeKeepsDaemonSetsAndBudgets(ctx, t)
	})
	t.Run("GuardPlacement", func(t *testing.T) { t.Parallel(); guardPlacementOnNodes(ctx, t) })
	t.Run("SelectionOnNodes", func(t *testing.T) { t.Parallel(); selectionOnNodes(ctx, t) })
	t.Run("RecordForeverIgnoresOtherTaints", func(t *testing.T) {
		t.Parallel()
		recordForeverIgnoresOtherTaints(ctx, t)
	})
}

// spotInterruptionWithTaintEvictionController runs the same scenario as TestSpotInterruption
// with kube-controller-manager's taint-eviction-controller acting on the same NoExecute taint:
// it deletes untolerating pods at once with their full grace and without a PDB check. The
// deadline must still hold for every pod.
func spotInterruptionWithTaintEvictionController(ctx context.Context, t *testing.T) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	// Without the DaemonSet pod: the group's daemonset controller would delete it at once, on a
	// node its DaemonSet object's template does not select (podsShouldBeOnNode,
	// pkg/controller/daemon/daemon_controller.go), before the notice. Like the mirror pod, it has
	// no plan to check here; TestSpotInterruption checks that reprieve leaves it alone.
	pods := mixedWithoutDaemonSet()
	// Serial phase (see TestWithTaintEvictionController): the pods run as soon as kwok sees them.
	res := runPods(ctx, t, "spot-kcm", scenario.InstantAll(pods))
	end := res.Window.End()
	for name, exp := range expected {
		row, _ := res.Row(name)
		if exp.plan == nil {
			continue // kube-controller-manager deletes DaemonSet and mirror pods it finds untolerating
		}
		assertInTime(t, name, row, end)
	}
	if row, _ := res.Row("tolerate-forever"); !row.Record.DeletedAt.IsZero() {
		t.Errorf("pod tolerate-forever: deleted at %v, want left alone", row.Record.DeletedAt)
	}
	// The pod with a 300 s grace was deleted by the controller with its full grace, ending
	// far past the deadline; reprieve must have shortened it.
	if row, _ := res.Row("grace-longer-than-window"); row.Record.LastGrace >= 300 {
		t.Errorf("grace-longer-than-window: grace %ds, want shortened to fit the window", row.Record.LastGrace)
	}
	// What the default mode costs a budget (issue 36, item 2): the controller deletes the
	// budget-blocked pod at once, with its full grace, never asking the budget, long before
	// the last safe moment at which reprieve would have forced it (E - 5 s).
	row, _ := res.Row("pdb-blocked")
	rec := row.Record
	if !row.KubeControllerManager {
		t.Errorf("pdb-blocked: no %s event; want kube-controller-manager to have marked it for deletion", scenario.ReasonTaintManagerEviction)
	}
	if rec.DeletedAt.IsZero() || rec.DeletedAt.After(res.TaintSeenAt.Add(5*time.Second)) || rec.Grace != 5 {
		t.Errorf("pdb-blocked: deleted at T%+.2fs with grace %ds (taint seen T%+.2fs); want at once, with its 5 s, by kube-controller-manager",
			rec.DeletedAt.Sub(res.TimeAdded).Seconds(), rec.Grace, res.TaintSeenAt.Sub(res.TimeAdded).Seconds())
	}
	if n := res.EventReasons()["pdb-blocked "+events.ReasonForceDeleted]; n != 0 {
		t.Errorf("pdb-blocked: reprieve forced it (%d %s events); want it deleted by kube-controller-manager before its last safe moment", n, events.ReasonForceDeleted)
	}
	if !strings.Contains(scenarioTable(res), "deleted by kube-controller-manager, past its budget") {
		t.Errorf("the table does not say that kube-controller-manager deleted pdb-blocked past its budget:\n%s", scenarioTable(res))
	}
}

// spotInterruptionBudgetMode (issue 36, item 2) runs the scenario with
// --interruption-eviction=reprieve beside kube-controller-manager's taint-eviction controller:
// the taint is NoSchedule, the controller deletes nothing, and every pod leaves exactly when
// reprieve alone plans it, as in TestSpotInterruption without the controller: no pod under a
// budget is deleted before its last safe moment, and each is forced then.
func spotInterruptionBudgetMode(ctx context.Context, t *testing.T) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	// Without the DaemonSet pod (see spotInterruptionWithTaintEvictionController); with a second
	// budget-blocked pod, due at T+10 by its toleration.
	pods := mixedWithoutDaemonSet()
	pods = append(pods, scenario.Pod{Name: "pdb-tolerate-10s", Kind: scenario.Plain, Tolerate: ptr64(10), Grace: ptr64(5), PDB: true})
	exp := map[string]expectation{}
	for name, e := range expected {
		if name != "daemonset" {
			exp[name] = e
		}
	}
	forcePoint := func(T, E time.Time) time.Time { return lastStart(E, 5*time.Second) }
	exp["pdb-tolerate-10s"] = expectation{plan: func(T, E time.Time) time.Time { return T.Add(10 * time.Second) }, acted: forcePoint, grace: fixed(5)}

	res := runSpot(ctx, t, scenario.SpotOptions{Namespace: "spot-budget", Node: "spot-budget-node", Pods: scenario.InstantAll(pods), Eviction: plan.EvictionReprieve})
	defer func() {
		if t.Failed() {
			t.Logf("reprieve's log, the lines about pods and errors:\n%s", res.AgentLines(80))
		}
	}()
	if !hasTaint(res.Node, "cloud", v1.TaintEffectNoSchedule) || hasTaint(res.Node, "cloud", v1.TaintEffectNoExecute) {
		t.Errorf("taints %+v; want cloud=spot:NoSchedule and no NoExecute one", res.Node.Spec.Taints)
	}
	if !env.ControllerManagerRunning("taint-eviction-controller") {
		t.Fatal("kube-controller-manager's taint-eviction controller is not running: the test proves nothing")
	}
	assertAsPlanned(t, res, exp)
	for _, row := range res.Rows {
		if row.KubeControllerManager {
			t.Errorf("pod %s: kube-controller-manager marked it for deletion under the NoSchedule taint", row.Pod)
		}
	}
	// Each budget-protected pod: refused until its last safe moment, deleted then and not
	// before, by reprieve.
	reasons := res.EventReasons()
	end := res.Window.End()
	for _, name := range []string{"pdb-blocked", "pdb-tolerate-10s"} {
		row, _ := res.Row(name)
		last := lastStart(end, 5*time.Second).Add(-plan.EvictionLead)
		if d := row.Record.DeletedAt; d.IsZero() || d.Before(last.Add(-slack)) {
			t.Errorf("%s: deleted at T%+.2fs; want not before its last safe moment T%+.2fs", name, d.Sub(res.TimeAdded).Seconds(), last.Sub(res.TimeAdded).Seconds())
		}
		if reasons[name+" "+events.ReasonEvictionBlocked] == 0 || reasons[name+" "+events.ReasonForceDeleted] == 0 {
			t.Errorf("%s: events %v; want %s, then %s", name, reasons, events.ReasonEvictionBlocked, events.ReasonForceDeleted)
		}
	}
	if !strings.Contains(scenarioTable(res), "budget held, then forced") {
		t.Errorf("the table does not say budget held, then forced:\n%s", scenarioTable(res))
	}
	for _, m := range []string{`reprieve_evictions_missed_deadline_total 0`, `reprieve_evictions_requests_total{result="forced_delete"} 2`} {
		if !strings.Contains(res.Metrics, m) {
			t.Errorf("metrics lack %q", m)
		}
	}
}

// scenarioTable is the demo's table of res.
func scenarioTable(res *scenario.SpotResult) string {
	var buf bytes.Buffer
	_ = scenario.PrintTable(&buf, res.TimeAdded, res.Rows)
	return buf.String()
}

func run(ctx context.Context, t *testing.T, name string, args ...string) *scenario.SpotResult {
	t.Helper()
	return runPods(ctx, t, name, scenario.Mixed(), args...)
}

// runPods is run with a workload of its own.
func runPods(ctx context.Context, t *testing.T, name string, pods []scenario.Pod, args ...string) *scenario.SpotResult {
	t.Helper()
	return runSpot(ctx, t, scenario.SpotOptions{Namespace: name, Node: name + "-node", Pods: pods, ExtraArgs: args})
}

// runSpot runs o with the package's binary, agent identity, window and margin.
func runSpot(ctx context.Context, t *testing.T, o scenario.SpotOptions) *scenario.SpotResult {
	t.Helper()
	o.Env, o.ReprieveBin, o.LogDir, o.Kubeconfig = env, reprieveBin, logDir, agentKubeconfig
	o.NoticeDelay, o.Window, o.SafetyMargin = 3*time.Second, window, margin
	res, err := scenario.RunSpot(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	logTable(t, res)
	return res
}

func logTable(t *testing.T, res *scenario.SpotResult) {
	t.Helper()
	var buf bytes.Buffer
	_ = scenario.PrintTable(&buf, res.TimeAdded, res.Rows)
	t.Logf("deadline T%+.1fs, window end T%+.1fs\n%s", res.Deadline.Sub(res.TimeAdded).Seconds(), res.Window.End().Sub(res.TimeAdded).Seconds(), buf.String())
}

// assertInTime checks that an evicted pod was gone by the window's end, both as kwok ended it
// and as a kubelet would: the request (seen by the watcher, so no earlier than sent) plus the
// grace the pod was finally given must not pass the end either. The second check does not
// depend on kwok's timing, which follows deletionTimestamp, stored in whole seconds.
func assertInTime(t *testing.T, name string, row scenario.Row, end time.Time) {
	t.Helper()
	rec := row.Record
	if rec.GoneAt.IsZero() || rec.GoneAt.After(end) {
		t.Errorf("pod %s: gone at %v, after the window's end %v", name, rec.GoneAt, end)
	}
	if rec.LastGrace > 0 {
		// DeletedAt is when the watch showed the request, a little after the API server took
		// it; watchDelay allows for that delivery on a loaded 2-core machine.
		const watchDelay = 250 * time.Millisecond
		if kubeletEnd := rec.DeletedAt.Add(time.Duration(rec.LastGrace) * time.Second); kubeletEnd.After(end.Add(watchDelay)) {
			t.Errorf("pod %s: deleted at %v with grace %ds would end at %v, after the window's end %v", name, rec.DeletedAt, rec.LastGrace, kubeletEnd, end)
		}
	}
}

type received struct {
	body   string
	header http.Header
}

type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	msgs []received
}

// newReceiver is a webhook receiver on loopback that records every request.
func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.msgs = append(r.msgs, received{body: string(b), header: req.Header.Clone()})
		r.mu.Unlock()
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) bodies() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.msgs...)
}

func hasTaint(n *v1.Node, key string, effect v1.TaintEffect) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key && t.Effect == effect {
			return true
		}
	}
	return false
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func absDiff(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}

// mixedWithoutDaemonSet is scenario.Mixed without its DaemonSet pod, for the runs beside
// kube-controller-manager (spotInterruptionWithTaintEvictionController says why).
func mixedWithoutDaemonSet() []scenario.Pod {
	var pods []scenario.Pod
	for _, p := range scenario.Mixed() {
		if p.Kind != scenario.DaemonSet {
			pods = append(pods, p)
		}
	}
	return pods
}
