package main

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// The pool scenario (issue 24): a spot pool reclaimed at once. Every node of the pool gets its
// notice at the same instant and every agent evicts at the same moment, through a kube-apiserver
// with API Priority and Fairness on and a given number of seats. The agents run as the shipped
// ServiceAccount in kube-system, so APF puts them in workload-high with kube-controller-manager,
// which runs as itself (testenv does so when APF is on). reprieve runs as the chart installs it
// (install.go, issue 46): its eviction guard, each agent's token bound to its node, the
// admission policies, and APF as the chart leaves it.

// poolSides are who handles the notice: reprieve as installed (with or without its guard, with
// or without the chart's flowControl level), the taint alone with kube-controller-manager's
// taint-eviction controller, or aws-node-termination-handler.
const (
	poolReprieve    = "reprieve as the chart installs it (eviction guard, bound tokens, admission policies)"
	poolNoGuard     = "reprieve as installed, without the eviction guard"
	poolFlowControl = "reprieve as installed, with the chart's flowControl level"
	poolTaint       = "the taint alone, with kube-controller-manager's taint-eviction controller"
	poolNTH         = "aws-node-termination-handler, IMDS mode, on every node"
)

// poolKeys name each side's files in the log folder (poolFileName).
var poolKeys = map[string]string{poolReprieve: "reprieve", poolNoGuard: "noguard", poolFlowControl: "flowcontrol", poolTaint: "taint", poolNTH: "nth"}

// isReprieve says whether side runs reprieve's agents (and so the chart's install).
func isReprieve(side string) bool {
	return side == poolReprieve || side == poolNoGuard || side == poolFlowControl
}

// poolGraces are the evictable pods' terminationGracePeriodSeconds, in turn: one longer than
// the window (its budget can never be met: the grace is cut), the rest within it.
var poolGraces = []int64{45, 30, 20, 10, 5, 2}

// poolRun is one side at one seat count.
type poolRun struct {
	Side           string
	Seats          int
	Nodes, Pods    int // Pods: the evictable pods, on all nodes
	InTime         int // evictable pods gone by D - margin
	ForeverEvicted int // pods that tolerate the taint forever and were evicted anyway
	Throttled      int // 429 answers to the handler's evictions and pod deletes (APF's own; no PDB in the workload)
	// OtherThrottled are 429 answers to the handler's other requests: NTH's drain polls every
	// evicted pod with a GET each second until it is gone (kubectl's waitForDelete).
	OtherThrottled  int
	Evictions       int // eviction requests
	Deletes         int // DELETE requests of pods
	Warnings        int // pods/status patches (the early warning)
	WorstLate       time.Duration
	LostByGrace     map[int64]int // evictable pods not gone by D - margin, by grace
	RejectedByAPF   float64       // apiserver_flowcontrol_rejected_requests_total, all clients
	WaitedInQueues  float64       // apiserver_flowcontrol_request_wait_duration_seconds_sum, all clients
	Window, Margin  time.Duration
	NoticeToLastEnd time.Duration // the notice to the last evictable pod gone
	// PodsByGrace, InTimeByGrace and FullGraceByGrace count the evictable pods, those gone
	// by D - margin, and those gone with their whole grace, by grace.
	PodsByGrace, InTimeByGrace, FullGraceByGrace map[int64]int
	// Rate is the evictions a second the fleet got accepted (acceptRate); FeasibleByGrace and
	// MaxInTime what the best order could have done at that rate (feasibleAt), and
	// LostFeasible the pods lost whose budget that order would have kept.
	Rate            float64
	FeasibleByGrace map[int64]int
	MaxInTime       int
	LostFeasible    int
	// Load is the machine's load average (1, 5, 15 minutes) when the run ended.
	Load string
	// Answers are the handler's answered requests by "VERB resource code", and Sent its
	// requests by "VERB resource", answered or not, watches apart (the proxies' counts).
	Answers, Sent map[string]int
	// LateP50 and LateP99 are quantiles, over the evictable pods, of how late each was gone
	// against its plan (negative: before it, as a pod whose grace was cut to the window).
	LateP50, LateP99 time.Duration
	// WebhookFailed are evictions answered 500 (the API server's failurePolicy Fail, when the
	// guard did not answer in time or refused before judging) and Forbidden those answered 403
	// (a policy's or the guard's refusal).
	WebhookFailed, Forbidden int
	// Guard is what the guard's replicas counted, when the side runs it.
	Guard *guardFigures
	// ForcedDeletes and FailedRequests are the agents' own counts
	// (reprieve_evictions_requests_total{result="forced_delete"|"failed"}): the pods deleted
	// at their last safe moment past their budgets, and the requests refused by an error (a 500
	// when the guard could not answer).
	ForcedDeletes, FailedRequests float64
	// AgentLateP50 and AgentLateP99 are the agents' own reprieve_evictions_lateness_seconds
	// (each eviction's effect against its planned time), added over the agents, as
	// histogram_quantile reads it: what a cluster's dashboard shows.
	AgentLateP50, AgentLateP99 float64
}

// poolStartup and poolStartupPerNode are how far ahead of the handlers' start the notice is
// set: every agent must be up and polling its IMDS before it appears.
const (
	poolStartup        = 10 * time.Second
	poolStartupPerNode = time.Second
)

// apfFor splits seats as kube-apiserver's defaults do (400 + 200): two thirds read-only.
func apfFor(seats int) *testenv.APF {
	ro := seats * 2 / 3
	return &testenv.APF{MaxRequestsInflight: ro, MaxMutatingRequestsInflight: seats - ro}
}

func (b *bench) pool(ctx context.Context, rep *report) error {
	// Restore the shared server as the other measurements expect it.
	defer func() {
		if err := b.env.RestartAPIServerWith(context.WithoutCancel(ctx), nil); err != nil {
			b.o.Logf("pool: %v", err)
		}
	}()
	if err := noBudgetsLeft(ctx, b.env.Client); err != nil {
		return err
	}
	for _, seats := range poolRounds(b.o) {
		if err := b.env.RestartAPIServerWith(ctx, apfFor(seats)); err != nil {
			return err
		}
		// kwok's pod controller can stall for a minute after the restart, and as the admin
		// its requests are exempt from APF, unlike the kubelets' it stands in for (RestartKwok).
		if err := b.env.RestartKwok(ctx, true); err != nil {
			return err
		}
		var sides []string
		for _, c := range []struct {
			side  string
			seats []int
		}{{poolReprieve, b.o.PoolSeats}, {poolNoGuard, b.o.PoolNoGuardSeats}, {poolFlowControl, b.o.PoolFlowControlSeats}, {poolTaint, b.o.PoolBaselineSeats}} {
			if slices.Contains(c.seats, seats) {
				sides = append(sides, c.side)
			}
		}
		if slices.Contains(b.o.PoolNTHSeats, seats) {
			if _, err := nthPath(); err != nil {
				b.o.Logf("pool: no aws-node-termination-handler row at %d seats: %v", seats, err)
			} else {
				sides = append(sides, poolNTH)
			}
		}
		for _, side := range sides {
			r, err := b.poolRun(ctx, side, seats)
			if err != nil {
				return err
			}
			b.o.Logf("pool: %s at %d seats: %d/%d in time, %d evictions, %d 429s (%d to other requests), %d answered 500, %d deletes (%.0f forced, %.0f failed requests: the agents' counts), late p50 %s p99 %s worst %s, lost %s, %.1f accepted/s, lost though feasible %d, load %s",
				side, seats, r.InTime, r.Pods, r.Evictions, r.Throttled, r.OtherThrottled, r.WebhookFailed, r.Deletes, r.ForcedDeletes, r.FailedRequests, r.LateP50.Round(100*time.Millisecond),
				r.LateP99.Round(100*time.Millisecond), r.WorstLate.Round(10*time.Millisecond), byGrace(r.LostByGrace, "none"), r.Rate, r.LostFeasible, r.Load)
			if isReprieve(side) {
				b.o.Logf("pool: %s at %d seats: the agents' reprieve_evictions_lateness_seconds p50 %.1f s, p99 %.1f s", side, seats, r.AgentLateP50, r.AgentLateP99)
			}
			if side != poolTaint {
				b.o.Logf("pool: %s at %d seats: requests sent %s; answers %s", side, seats, counts(r.Sent), counts(r.Answers))
			}
			if g := r.Guard; g != nil {
				b.o.Logf("pool: %s at %d seats: guard reviews %v, pod lookups %v, most in flight from one source %.0f, connections refused %.0f, RSS %.1f MiB, index %.0f pods",
					side, seats, g.Results, g.Lookups, g.InFlight, g.ConnRefused, g.RSS/(1<<20), g.IndexPods)
			}
			rep.Pool = append(rep.Pool, r)
		}
	}
	return nil
}

// poolRounds are the seat counts of every side, each once, in the order given.
func poolRounds(o options) []int {
	var out []int
	for _, l := range [][]int{o.PoolSeats, o.PoolNoGuardSeats, o.PoolFlowControlSeats, o.PoolBaselineSeats, o.PoolNTHSeats} {
		for _, s := range l {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

func (b *bench) poolRun(ctx context.Context, side string, seats int) (*poolRun, error) {
	ns := b.name("pool")
	if err := b.env.CreateNamespace(ctx, ns); err != nil {
		return nil, err
	}
	taint, err := interruptionTaint()
	if err != nil {
		return nil, err
	}
	n := b.o.PoolNodes
	nodes := make([]string, n)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("%s-n%02d", ns, i)
	}
	defer b.removeNodes(context.WithoutCancel(ctx), ns, nodes)
	grace := map[string]int64{}
	forever := map[string]bool{}
	perNode := make([][]scenario.Pod, n)
	for i := range nodes {
		for j := range b.o.PoolPods {
			g := poolGraces[j%len(poolGraces)]
			p := scenario.Pod{Name: fmt.Sprintf("n%02d-g%02d-%02d", i, g, j), Kind: scenario.Plain, Grace: &g}
			grace[p.Name] = g
			perNode[i] = append(perNode[i], p)
		}
		f := int64(scenario.Forever)
		p := scenario.Pod{Name: fmt.Sprintf("n%02d-forever", i), Kind: scenario.Plain, Tolerate: &f}
		forever[p.Name] = true
		perNode[i] = append(perNode[i], p)
	}
	if err := parallel(ctx, n, 6, func(i int) error {
		if _, err := b.env.CreateNode(ctx, nodes[i], nil); err != nil {
			return err
		}
		return scenario.Create(ctx, b.env.Client, ns, nodes[i], taint, perNode[i])
	}); err != nil {
		return nil, err
	}
	obs, err := scenario.Observe(ctx, b.env.Client, ns)
	if err != nil {
		return nil, err
	}
	defer obs.Stop()
	var inst *chartInstall
	if isReprieve(side) {
		if inst, err = b.installChart(ctx, side != poolNoGuard, side == poolFlowControl); err != nil {
			return nil, err
		}
		defer inst.uninstall(context.WithoutCancel(ctx))
	}

	// The notice, on every node at the same instant: a moment far enough ahead for every
	// agent to be up and polling (a few hundred ms each on two cores), whole seconds as IMDS
	// gives them.
	notice := time.Now().Add(poolStartup + time.Duration(n)*poolStartupPerNode).Truncate(time.Second).Add(time.Second)
	deadline := notice.Add(b.o.PoolWindow)
	end := deadline.Add(-b.o.SafetyMargin)

	var proxies []*apiProxy
	var agents []*testenv.Process
	defer func() {
		stopAll(agents)
		for _, p := range proxies {
			if p != nil {
				p.Close()
			}
		}
	}()
	var nthBinary, nthTok string
	if side == poolNTH {
		if nthBinary, err = nthPath(); err != nil {
			return nil, err
		}
		if nthTok, err = b.nthToken(ctx); err != nil {
			return nil, err
		}
	}
	kubeconfigs := make([]string, n)
	metricsAddrs := make([]string, n)
	switch side {
	case poolReprieve, poolNoGuard, poolFlowControl, poolNTH:
		proxies = make([]*apiProxy, n)
		procs := make([][]*testenv.Process, n)
		defer func() {
			for _, ps := range procs {
				agents = append(agents, ps...)
			}
		}()
		// Four at a time: each waits for its program to answer, and two cores start 32.
		if err := parallel(ctx, n, 4, func(i int) error {
			// Each node's own IMDS: amazon-ec2-metadata-mock, with the spot notice from the
			// shared instant on and the reclaim time at the deadline.
			mock, endpoint, err := testenv.StartIMDSMock(ctx, b.logDir, "--imdsv2",
				"--mock-trigger-time="+notice.UTC().Format(time.RFC3339),
				"spot", "--action=terminate", "--time="+deadline.UTC().Format(time.RFC3339))
			if err != nil {
				return err
			}
			procs[i] = append(procs[i], mock)
			if side == poolNTH {
				h, p, err := b.startNTH(ctx, nthBinary, nodes[i], endpoint, nthTok)
				if err != nil {
					return err
				}
				proxies[i] = p
				procs[i] = append(procs[i], h)
				return nil
			}
			// The token the kubelet would mount: bound to the agent's pod on its node.
			token, bound, err := inst.agentToken(ctx, nodes[i])
			if err != nil {
				return err
			}
			kubeconfigs[i] = bound
			p, err := startAPIProxy(b.env.Host, b.env.CAData, token)
			if err != nil {
				return err
			}
			proxies[i] = p
			kc, err := p.kubeconfig(b.logDir, nodes[i])
			if err != nil {
				return err
			}
			a, addr, err := b.startAgentWith(ctx, kc, nodes[i], "--provider=aws", "--aws-imds-endpoint="+endpoint,
				"--safety-margin="+b.o.SafetyMargin.String())
			if err != nil {
				return err
			}
			procs[i] = append(procs[i], a)
			metricsAddrs[i] = addr
			return nil
		}); err != nil {
			return nil, err
		}
	case poolTaint:
		if err := b.env.StartControllerManager(ctx); err != nil {
			return nil, err
		}
		defer b.env.StopControllerManager()
	}
	if side == poolReprieve || side == poolFlowControl {
		if err := inst.waitGuardInForce(ctx, kubeconfigs[0]); err != nil {
			return nil, err
		}
	}
	if left := time.Until(notice); left < 2*time.Second {
		return nil, fmt.Errorf("pool: the handlers took too long to start: %s left before the notice at %s, want 2 s", left.Round(time.Millisecond), notice.Format(time.RFC3339))
	}
	before, sentBefore := map[string]int{}, map[string]int{}
	for _, p := range proxies {
		for k, v := range p.codeCounts() {
			before[k] += v
		}
		c, _ := p.snapshot()
		for k, v := range c {
			sentBefore[k] += v
		}
	}
	m0, err := b.apiserverMetrics(ctx)
	if err != nil {
		return nil, err
	}
	if side == poolTaint {
		// A taint-only handler writes the taint when the notice appears.
		if err := sleepUntil(ctx, notice); err != nil {
			return nil, err
		}
		if err := parallel(ctx, n, n, func(i int) error { return setTaint(ctx, b.env.Client, nodes[i], notice) }); err != nil {
			return nil, err
		}
	}
	var timeline *apfTimeline
	if b.o.PoolTimeline > 0 {
		timeline = b.startAPFTimeline(ctx, b.o.PoolTimeline)
		defer timeline.cancel() // an early return ends the sampling too
	}
	if err := sleepUntil(ctx, end.Add(3*time.Second)); err != nil {
		return nil, err
	}
	if timeline != nil {
		if err := timeline.stop(filepath.Join(b.logDir, poolFileName(side, seats, "-apf.csv")), notice); err != nil {
			b.o.Logf("pool: %v", err)
		}
	}
	m1, err := b.apiserverMetrics(ctx)
	if err != nil {
		return nil, err
	}
	recs := obs.Records()
	r := &poolRun{Side: side, Seats: seats, Nodes: n, Pods: len(grace), LostByGrace: map[int64]int{},
		Window: b.o.PoolWindow, Margin: b.o.SafetyMargin, Load: loadAverage(),
		PodsByGrace: map[int64]int{}, InTimeByGrace: map[int64]int{}, FullGraceByGrace: map[int64]int{}}
	var accepted []time.Time
	var graces []int64
	var late []time.Duration
	for name, g := range grace {
		rec := recs[name]
		r.PodsByGrace[g]++
		graces = append(graces, g)
		accepted = append(accepted, rec.DeletedAt)
		// kwok removes a pod at its deletionTimestamp, but lags behind hundreds of deletes at
		// one instant (30 s seen with 608): a pod is gone at the earlier of its removal and
		// the end the API server promised it, as the compliance measurement projects.
		gone := rec.GoneAt
		if dt := rec.DeletionTimestamp; !dt.IsZero() && (gone.IsZero() || dt.Before(gone)) {
			gone = dt
		}
		if !gone.IsZero() && !gone.After(end) {
			r.InTime++
			r.InTimeByGrace[g]++
			if rec.Grace >= g {
				r.FullGraceByGrace[g]++
			}
		} else {
			r.LostByGrace[g]++
		}
		if gone.IsZero() {
			gone = time.Now()
		}
		// The plan of a pod due at the notice: gone after its grace, or by the window's end
		// when its grace is longer than what is left.
		planned := notice.Add(time.Duration(g) * time.Second)
		if planned.After(end) {
			planned = end
		}
		r.WorstLate = max(r.WorstLate, gone.Sub(planned))
		late = append(late, gone.Sub(planned))
		r.NoticeToLastEnd = max(r.NoticeToLastEnd, gone.Sub(notice))
	}
	slices.Sort(late)
	r.LateP50, r.LateP99 = nearestRank(late, 0.50), nearestRank(late, 0.99)
	if err := writePoolRecords(b.logDir, side, seats, notice, grace, recs); err != nil {
		b.o.Logf("pool: %v", err)
	}
	if side != poolTaint {
		// The taint's side sends nothing of its own: kube-controller-manager's client limit,
		// not the server, sets its pace, so the model does not apply.
		r.Rate = acceptRate(accepted, notice, end)
		r.FeasibleByGrace, r.MaxInTime = feasibleAt(graces, end.Sub(notice), r.Rate)
		r.LostFeasible = lostThoughFeasible(r.PodsByGrace, r.LostByGrace, r.FeasibleByGrace)
	}
	for name := range forever {
		if !recs[name].DeletedAt.IsZero() {
			r.ForeverEvicted++
		}
	}
	after, sentAfter := map[string]int{}, map[string]int{}
	for _, p := range proxies {
		for k, v := range p.codeCounts() {
			after[k] += v
		}
		c, _ := p.snapshot()
		for k, v := range c {
			sentAfter[k] += v
		}
	}
	r.Answers, r.Sent = requestDiff(before, after), requestDiff(sentBefore, sentAfter)
	for k := range r.Sent {
		if strings.HasPrefix(k, "WATCH ") {
			delete(r.Sent, k)
		}
	}
	for k, v := range r.Answers {
		f := strings.Fields(k) // VERB resource code
		if len(f) != 3 {
			continue
		}
		if f[2] == "429" {
			if (f[0] == "CREATE" && f[1] == "pods/eviction") || (f[0] == "DELETE" && f[1] == "pods") {
				r.Throttled += v
			} else {
				r.OtherThrottled += v
			}
		}
		if f[0] == "CREATE" && f[1] == "pods/eviction" {
			switch f[2] {
			case "500":
				r.WebhookFailed += v
			case "403":
				r.Forbidden += v
			}
		}
		switch {
		case f[0] == "CREATE" && f[1] == "pods/eviction":
			r.Evictions += v
		case f[0] == "DELETE" && f[1] == "pods":
			r.Deletes += v
		case f[0] == "PATCH" && f[1] == "pods/status":
			r.Warnings += v
		}
	}
	if side == poolTaint {
		// Not proxied: kube-apiserver's count of pod deletes (kube-controller-manager's).
		del := map[string]string{"verb": "DELETE", "resource": "pods", "subresource": ""}
		r.Deletes = int(sum(m1, "apiserver_request_total", del) - sum(m0, "apiserver_request_total", del))
	}
	if isReprieve(side) {
		buckets := map[float64]float64{}
		for _, addr := range metricsAddrs {
			text, err := httpText(ctx, http.DefaultClient, "http://"+addr+"/metrics")
			if err != nil {
				return nil, err
			}
			s, err := parseMetrics(text)
			if err != nil {
				return nil, err
			}
			r.ForcedDeletes += sum(s, "reprieve_evictions_requests_total", map[string]string{"result": "forced_delete"})
			r.FailedRequests += sum(s, "reprieve_evictions_requests_total", map[string]string{"result": "failed"})
			for _, x := range s {
				if x.Name != "reprieve_evictions_lateness_seconds_bucket" {
					continue
				}
				le, err := strconv.ParseFloat(x.Labels["le"], 64)
				if err != nil {
					return nil, fmt.Errorf("reading the agents' lateness histogram: %w", err)
				}
				buckets[le] += x.Value
			}
		}
		r.AgentLateP50, r.AgentLateP99 = histogramQuantile(buckets, 0.50), histogramQuantile(buckets, 0.99)
	}
	if side == poolReprieve || side == poolFlowControl {
		g, err := inst.guardMetrics(ctx)
		if err != nil {
			return nil, err
		}
		r.Guard = &g
	}
	r.RejectedByAPF = sum(m1, "apiserver_flowcontrol_rejected_requests_total", nil) - sum(m0, "apiserver_flowcontrol_rejected_requests_total", nil)
	r.WaitedInQueues = sum(m1, "apiserver_flowcontrol_request_wait_duration_seconds_sum", nil) - sum(m0, "apiserver_flowcontrol_request_wait_duration_seconds_sum", nil)
	return r, nil
}

// poolMD writes the pool table.
func (r *report) poolMD(p printer, o options) {
	if len(r.Pool) == 0 {
		return
	}
	first := r.Pool[0]
	p("\n### 6. A pool reclaimed at once\n\n")
	p("%d kwok nodes with %d evictable pods each (graces %v s, in turn; %d pods in all) and one pod that\n"+
		"tolerates the taint forever, one agent per node. reprieve runs as the chart installs it by default (`helm template`\n"+
		"in kube-system): each agent with a token bound to a pod of its own on its node, as the kubelet mounts it; the\n"+
		"admission policies; the eviction guard's two replicas with the Deployment's arguments behind a proxy for its\n"+
		"Service, its webhook as rendered (`failurePolicy: Fail`, 3 s), its ServiceAccount, RBAC and priority level; APF as\n"+
		"the chart leaves it (the agents in workload-high, with kube-controller-manager running as itself). Rows without the\n"+
		"guard, or with the chart's `flowControl` level for the evictions, change that alone. Every node gets its notice at\n"+
		"the same instant from its own amazon-ec2-metadata-mock (IMDSv2, `--mock-trigger-time`, the reclaim time fixed), a %s\n"+
		"window and a %s margin. kube-apiserver runs with APF on and the seats given (`--max-requests-inflight` +\n"+
		"`--max-mutating-requests-inflight`, split 2:1; 600 is its default). Requests and answers are the handlers' own, counted by a proxy in\n"+
		"front of each (429s: to evictions and deletes, and in brackets to other requests; *500s*: evictions the API server refused\n"+
		"because the guard's call failed); a pod is gone at the earlier of its removal and the deletionTimestamp the API server gave it\n"+
		"(kwok lags behind hundreds of deletes at one instant); *late* is when a pod was gone against\n"+
		"its plan (the notice plus its grace, or the window's end when the grace is longer), p50 / p99 / worst over the pods. *Accepted/s* is the\n"+
		"evictions a second the fleet got accepted by the window's end; *feasible* is what the best order could\n"+
		"have done at that rate (earliest last safe moment first, skipping a pod it would serve past it: the pods\n"+
		"whose budget the window could meet); *lost though feasible* are the pods lost beyond those it could not.\n"+
		"*Load* is the machine's load average (1, 5, 15 min) at the run's end. One run per row.\n\n",
		first.Nodes, o.PoolPods, poolGraces, first.Pods, first.Window, first.Margin)
	p("| seats | who handles the notice | gone by `D - margin` | forever-tolerating evicted | eviction requests (per pod) | 429s | 500s | deletes (agents' forced deletes) | early-warning patches | late p50 / p99 / worst | the agents' lateness histogram p50 / p99 | lost, by grace | accepted/s | best order: in time, budgets kept | lost though feasible | APF rejected / queued s (all clients) | load |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.Pool {
		best, lf, rate := "-", "-", "-"
		if x.Side != poolTaint {
			kept := 0
			for _, c := range x.FeasibleByGrace {
				kept += c
			}
			best = fmt.Sprintf("%d, %d", x.MaxInTime, kept)
			lf = fmt.Sprint(x.LostFeasible)
			rate = fmt.Sprintf("%.1f", x.Rate)
		}
		throttled := fmt.Sprint(x.Throttled)
		if x.OtherThrottled > 0 {
			throttled += fmt.Sprintf(" (+%d other)", x.OtherThrottled)
		}
		deletes := fmt.Sprint(x.Deletes)
		if isReprieve(x.Side) {
			deletes += fmt.Sprintf(" (%.0f)", x.ForcedDeletes)
		}
		hist := "-"
		if isReprieve(x.Side) {
			hist = fmt.Sprintf("%.1f / %.1f s", x.AgentLateP50, x.AgentLateP99)
		}
		p("| %d | %s | %d/%d | %d | %d (%.2f) | %s | %d | %s | %d | %+.1f / %+.1f / %+.1f s | %s | %s | %s | %s | %s | %.0f / %.1f | %s |\n", x.Seats, x.Side, x.InTime, x.Pods,
			x.ForeverEvicted, x.Evictions, float64(x.Evictions)/float64(max(1, x.Pods)), throttled, x.WebhookFailed, deletes, x.Warnings,
			x.LateP50.Seconds(), x.LateP99.Seconds(), x.WorstLate.Seconds(), hist, byGrace(x.LostByGrace, "none"), rate, best, lf, x.RejectedByAPF, x.WaitedInQueues, x.Load)
	}
	guarded := false
	for _, x := range r.Pool {
		guarded = guarded || x.Guard != nil
	}
	if guarded {
		p("\nThrough the guard: its reviews by result (both replicas), where it found each pod (its index, or a GET), the\n" +
			"most reviews one source address had in flight at once (the API server, through the proxy: against\n" +
			"`evictionGuard.limits.sourceReviewsInFlight`), connections it refused, and the larger replica's resident memory at the run's end.\n\n")
		p("| seats | who handles the notice | allowed | denied | error | rejected | pods from the index / by GET | most in flight from one source | connections refused | RSS |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, x := range r.Pool {
			g := x.Guard
			if g == nil {
				continue
			}
			p("| %d | %s | %.0f | %.0f | %.0f | %.0f | %.0f / %.0f | %.0f | %.0f | %.1f MiB |\n", x.Seats, x.Side, g.Results["allowed"], g.Results["denied"],
				g.Results["error"], g.Results["rejected"], g.Lookups["index"], g.Lookups["api"], g.InFlight, g.ConnRefused, g.RSS/(1<<20))
		}
	}
	for _, x := range r.Pool {
		if x.Side == poolTaint || x.InTime == x.Pods {
			continue
		}
		p("\nAt %d seats (%s), per grace: pods / feasible at %.1f accepted/s / gone in time / with full grace.\n\n", x.Seats, x.Side, x.Rate)
		p("| grace | pods | feasible | in time | full grace | lost | lost though feasible |\n|---|---|---|---|---|---|---|\n")
		for _, g := range poolGraces {
			lost := x.LostByGrace[g]
			p("| %d s | %d | %d | %d | %d | %d | %d |\n", g, x.PodsByGrace[g], x.FeasibleByGrace[g], x.InTimeByGrace[g],
				x.FullGraceByGrace[g], lost, max(0, lost-(x.PodsByGrace[g]-x.FeasibleByGrace[g])))
		}
	}
}

// byGrace writes counts per grace, in poolGraces' order ("45 s: 3, 2 s: 1"), or none.
func byGrace(m map[int64]int, none string) string {
	var parts []string
	for _, g := range poolGraces {
		if c := m[g]; c > 0 {
			parts = append(parts, fmt.Sprintf("%d s: %d", g, c))
		}
	}
	if len(parts) == 0 {
		return none
	}
	return strings.Join(parts, ", ")
}

// loadAverage is /proc/loadavg's first three fields ("?" where it cannot be read): the
// machine is shared, and its load is part of every figure.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// counts writes a count map sorted by key ("GET pods: 3, LIST pods: 1").
func counts(m map[string]int) string {
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// writePoolRecords keeps one run's per-pod records in the log folder, as seconds from the
// notice, for reading a run afterwards (which pods were accepted when): pool-<side>-<seats>.csv,
// and the notice's time in pool-<side>-<seats>.notice.
func writePoolRecords(dir, side string, seats int, notice time.Time, grace map[string]int64, recs map[string]scenario.Record) error {
	since := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return fmt.Sprintf("%.3f", t.Sub(notice).Seconds())
	}
	var b strings.Builder
	b.WriteString("pod,grace,accepted,granted_grace,deletion_timestamp,gone\n")
	for _, name := range slices.Sorted(maps.Keys(grace)) {
		r := recs[name]
		fmt.Fprintf(&b, "%s,%d,%s,%d,%s,%s\n", name, grace[name], since(r.DeletedAt), r.Grace, since(r.DeletionTimestamp), since(r.GoneAt))
	}
	path := filepath.Join(dir, poolFileName(side, seats, ".csv"))
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("writing the per-pod records: %w", err)
	}
	// The notice itself, to line the agents' logs up with the records.
	if err := os.WriteFile(strings.TrimSuffix(path, ".csv")+".notice", []byte(notice.UTC().Format(time.RFC3339Nano)+"\n"), 0o644); err != nil {
		return fmt.Errorf("writing the per-pod records: %w", err)
	}
	return nil
}

// poolFileName names a file of one pool run: pool-<side's key>-<seats><suffix>.
func poolFileName(side string, seats int, suffix string) string {
	return fmt.Sprintf("pool-%s-%d%s", poolKeys[side], seats, suffix)
}

// histogramQuantile is Prometheus's histogram_quantile over cumulative buckets by upper bound:
// linear within the bucket the rank falls in, the last finite bound when it falls past it.
func histogramQuantile(buckets map[float64]float64, q float64) float64 {
	bounds := slices.Sorted(maps.Keys(buckets))
	if len(bounds) == 0 || buckets[bounds[len(bounds)-1]] == 0 {
		return math.NaN()
	}
	rank := q * buckets[bounds[len(bounds)-1]]
	lower, below := 0.0, 0.0
	for _, b := range bounds {
		if c := buckets[b]; c >= rank {
			if math.IsInf(b, 1) {
				return lower
			}
			return lower + (b-lower)*(rank-below)/(c-below)
		}
		lower, below = b, buckets[b]
	}
	return lower
}

// nearestRank is the q-quantile of sorted (nearest rank); 0 for none.
func nearestRank(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(float64(len(sorted))*q)) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// apfTimeline samples kube-apiserver's APF gauges while a pool run goes: which priority
// level's seats were busy, and how many requests waited, second by second.
type apfTimeline struct {
	cancel context.CancelFunc
	done   chan struct{}
	rows   []apfRow
}

type apfRow struct {
	at                             time.Time
	level, schema                  string
	limit, executing, queued, sent float64 // current limit and executing seats, requests in queue, dispatched so far
}

func (b *bench) startAPFTimeline(ctx context.Context, every time.Duration) *apfTimeline {
	ctx, cancel := context.WithCancel(ctx)
	t := &apfTimeline{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if m, err := b.apiserverMetrics(ctx); err == nil {
				t.add(time.Now(), m)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return t
}

func (t *apfTimeline) add(at time.Time, m []sample) {
	limits := map[string]float64{}
	byKey := map[[2]string]*apfRow{}
	for _, s := range m {
		level := s.Labels["priority_level"]
		if s.Name == "apiserver_flowcontrol_current_limit_seats" {
			limits[level] = s.Value
			continue
		}
		// The gauges kept, by priority level and flow schema (k8s.io/apiserver
		// pkg/util/flowcontrol/metrics).
		var field func(r *apfRow) *float64
		switch s.Name {
		case "apiserver_flowcontrol_current_executing_seats":
			field = func(r *apfRow) *float64 { return &r.executing }
		case "apiserver_flowcontrol_current_inqueue_requests":
			field = func(r *apfRow) *float64 { return &r.queued }
		case "apiserver_flowcontrol_dispatched_requests_total":
			field = func(r *apfRow) *float64 { return &r.sent }
		default:
			continue
		}
		k := [2]string{level, s.Labels["flow_schema"]}
		r := byKey[k]
		if r == nil {
			r = &apfRow{at: at, level: k[0], schema: k[1]}
			byKey[k] = r
		}
		*field(r) += s.Value
	}
	for _, k := range slices.SortedFunc(maps.Keys(byKey), func(a, b [2]string) int { return strings.Compare(a[0]+"/"+a[1], b[0]+"/"+b[1]) }) {
		r := byKey[k]
		r.limit = limits[r.level]
		t.rows = append(t.rows, *r)
	}
}

// stop ends the sampling and writes the rows, in seconds from the notice.
func (t *apfTimeline) stop(path string, notice time.Time) error {
	t.cancel()
	<-t.done
	var b strings.Builder
	b.WriteString("t,priority_level,flow_schema,limit_seats,executing_seats,inqueue_requests,dispatched_total\n")
	for _, r := range t.rows {
		fmt.Fprintf(&b, "%.3f,%s,%s,%g,%g,%g,%g\n", r.at.Sub(notice).Seconds(), r.level, r.schema, r.limit, r.executing, r.queued, r.sent)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("writing the APF timeline: %w", err)
	}
	return nil
}
