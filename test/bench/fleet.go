package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// serverRates is kube-apiserver's view over a window: requests per second (watches apart)
// and the watches open at its end, all clients together.
type serverRates struct {
	NonWatchPerSec, WatchPerSec float64
	OpenWatches                 float64
}

// fleetPhase is one window of a fleet size.
type fleetPhase struct {
	Window time.Duration
	// Server is kube-apiserver's view less the same view without agents (the baseline).
	Server serverRates
	// PerAgent* come from each agent's own proxy: requests per minute, averaged over the
	// agents, and the most any one agent made; watches open at the end.
	PerAgentNonWatchPerMin, PerAgentAllPerMin float64
	MaxAgentNonWatchPerMin                    float64
	PerAgentWatches                           float64
	// Reclaimed* are the same for the reclaimed agents only (reclaim phase).
	ReclaimedNonWatchPerMin float64
}

// fleetResult is one fleet size.
type fleetResult struct {
	Agents, PodsPerNode, Reclaimed int
	Baseline                       serverRates
	Idle, Reclaim                  fleetPhase
	RSSPerAgent                    uint64 // median VmRSS over the agents, idle
	// IdleMillicores is the median over the agents of CPU time over the idle window's wall
	// time, in thousandths of a core (issue 51: at most 2).
	IdleMillicores float64
	LeftOver       int // pods still on reclaimed nodes at the deadline
}

func (b *bench) fleet(ctx context.Context, rep *report) error {
	for _, n := range b.o.Fleet {
		r, err := b.fleetSize(ctx, n)
		if err != nil {
			return err
		}
		b.o.Logf("fleet: %d agents: %.2f non-watch requests/min per idle agent, %.1f watches, %.2f idle millicores per agent (median)",
			n, r.Idle.PerAgentNonWatchPerMin, r.Idle.PerAgentWatches, r.IdleMillicores)
		rep.Fleet = append(rep.Fleet, r)
	}
	return nil
}

func (b *bench) fleetSize(ctx context.Context, n int) (*fleetResult, error) {
	ns := b.name(fmt.Sprintf("fleet-%d", n))
	if err := b.env.CreateNamespace(ctx, ns); err != nil {
		return nil, err
	}
	taint, err := interruptionTaint()
	if err != nil {
		return nil, err
	}
	nodes := make([]string, n)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("%s-n%03d", ns, i)
	}
	defer b.removeNodes(context.WithoutCancel(ctx), ns, nodes)
	// Nodes and pods, a few nodes at a time (each Create waits until its pods run).
	due, grace := int64(10), int64(5)
	err = parallel(ctx, n, 6, func(i int) error {
		if _, err := b.env.CreateNode(ctx, nodes[i], nil); err != nil {
			return err
		}
		pods := make([]scenario.Pod, b.o.FleetPods)
		for j := range pods {
			pods[j] = scenario.Pod{Name: fmt.Sprintf("n%03d-p%02d", i, j), Kind: scenario.Plain, Grace: &grace}
			if j%2 == 1 {
				pods[j].Tolerate = &due
			}
		}
		return scenario.Create(ctx, b.env.Client, ns, nodes[i], taint, pods)
	})
	if err != nil {
		return nil, err
	}
	res := &fleetResult{Agents: n, PodsPerNode: b.o.FleetPods, Reclaimed: (n + 4) / 5}

	// Baseline: the same cluster without agents (kwok's heartbeats for n nodes).
	if res.Baseline, err = b.serverWindow(ctx, max(b.o.FleetIdle/2, time.Second)); err != nil {
		return nil, err
	}

	agents := make([]*testenv.Process, n)
	proxies := make([]*apiProxy, n)
	defer func() {
		stopAll(agents)
		for _, p := range proxies {
			if p != nil {
				p.Close()
			}
		}
	}()
	// One at a time: 100 agents starting at once on 2 cores would time out their readiness.
	for i := range nodes {
		if proxies[i], err = startAPIProxy(b.env.Host, b.env.CAData, b.token); err != nil {
			return nil, err
		}
		kc, err := proxies[i].kubeconfig(b.logDir, nodes[i])
		if err != nil {
			return nil, err
		}
		if agents[i], _, err = b.startAgentWith(ctx, kc, nodes[i], "--provider=none"); err != nil {
			return nil, err
		}
	}
	if err := sleepUntil(ctx, time.Now().Add(b.o.Settle)); err != nil {
		return nil, err
	}

	cpu0 := make([]time.Duration, n)
	for i, p := range agents {
		if st, err := readProc(p.Pid()); err == nil {
			cpu0[i] = st.CPU
		}
	}
	idleStart := time.Now()
	res.Idle, err = b.fleetWindow(ctx, res.Baseline, proxies, nil, time.Now().Add(b.o.FleetIdle))
	if err != nil {
		return nil, err
	}
	idleWall := time.Since(idleStart)
	var cpu []float64
	for i, p := range agents {
		if st, err := readProc(p.Pid()); err == nil {
			cpu = append(cpu, float64(st.CPU-cpu0[i])/float64(idleWall)*1000)
		}
	}
	res.IdleMillicores = median(cpu)
	var rss []float64
	for _, p := range agents {
		if st, err := readProc(p.Pid()); err == nil {
			rss = append(rss, float64(st.RSS))
		}
	}
	res.RSSPerAgent = uint64(median(rss))

	// Reclaim: the first 20% of the nodes get a deadline at the same instant.
	deadline := time.Now().Add(b.o.FleetWindow).Truncate(time.Second)
	reclaimed := map[int]bool{}
	for i := 0; i < res.Reclaimed; i++ {
		reclaimed[i] = true
		if err := setDeadline(ctx, b.env.Client, nodes[i], deadline); err != nil {
			return nil, err
		}
	}
	res.Reclaim, err = b.fleetWindow(ctx, res.Baseline, proxies, reclaimed, deadline.Add(2*time.Second))
	if err != nil {
		return nil, err
	}
	for i := range res.Reclaimed {
		pods, err := b.env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", nodes[i]).String()})
		if err != nil {
			return nil, fmt.Errorf("listing the pods of %s: %w", nodes[i], err)
		}
		res.LeftOver += len(pods.Items)
	}
	return res, nil
}

// fleetWindow measures from now until end: kube-apiserver's rates less the baseline, and each
// agent's requests through its proxy.
func (b *bench) fleetWindow(ctx context.Context, baseline serverRates, proxies []*apiProxy, reclaimed map[int]bool, end time.Time) (fleetPhase, error) {
	begin := time.Now()
	before := make([]map[string]int, len(proxies))
	for i, p := range proxies {
		before[i], _ = p.snapshot()
	}
	server, err := b.serverWindow(ctx, time.Until(end))
	if err != nil {
		return fleetPhase{}, err
	}
	wall := time.Since(begin)
	minutes := wall.Minutes()
	ph := fleetPhase{Window: wall, Server: serverRates{
		NonWatchPerSec: server.NonWatchPerSec - baseline.NonWatchPerSec,
		WatchPerSec:    server.WatchPerSec - baseline.WatchPerSec,
		OpenWatches:    server.OpenWatches - baseline.OpenWatches,
	}}
	var nonWatchSum, allSum, watches, reclaimedSum float64
	for i, p := range proxies {
		after, w := p.snapshot()
		d := requestDiff(before[i], after)
		nw := float64(nonWatch(d)) / minutes
		nonWatchSum += nw
		allSum += float64(total(d)) / minutes
		watches += float64(w)
		ph.MaxAgentNonWatchPerMin = max(ph.MaxAgentNonWatchPerMin, nw)
		if reclaimed[i] {
			reclaimedSum += nw
		}
	}
	n := float64(len(proxies))
	ph.PerAgentNonWatchPerMin, ph.PerAgentAllPerMin, ph.PerAgentWatches = nonWatchSum/n, allSum/n, watches/n
	if len(reclaimed) > 0 {
		ph.ReclaimedNonWatchPerMin = reclaimedSum / float64(len(reclaimed))
	}
	return ph, nil
}

// serverWindow returns kube-apiserver's request rates over the next d, all clients together.
func (b *bench) serverWindow(ctx context.Context, d time.Duration) (serverRates, error) {
	m0, err := b.apiserverMetrics(ctx)
	if err != nil {
		return serverRates{}, err
	}
	begin := time.Now()
	if err := sleepUntil(ctx, begin.Add(d)); err != nil {
		return serverRates{}, err
	}
	m1, err := b.apiserverMetrics(ctx)
	if err != nil {
		return serverRates{}, err
	}
	secs := time.Since(begin).Seconds()
	nonWatch := map[string]string{"verb": "!WATCH"}
	watch := map[string]string{"verb": "WATCH"}
	return serverRates{
		NonWatchPerSec: (sum(m1, "apiserver_request_total", nonWatch) - sum(m0, "apiserver_request_total", nonWatch)) / secs,
		WatchPerSec:    (sum(m1, "apiserver_request_total", watch) - sum(m0, "apiserver_request_total", watch)) / secs,
		OpenWatches:    sum(m1, "apiserver_longrunning_requests", watch),
	}, nil
}

// removeNodes deletes the fleet's pods and nodes, so that kwok stops heartbeating them.
func (b *bench) removeNodes(ctx context.Context, ns string, nodes []string) {
	if err := deleteAll(ctx, b.env.Client, ns); err != nil {
		b.o.Logf("fleet: %v", err)
	}
	for _, n := range nodes {
		if err := b.env.Client.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			b.o.Logf("fleet: deleting node %s: %v", n, err)
		}
	}
}

// parallel runs f(0..n-1) with at most width at once and returns every error joined.
func parallel(ctx context.Context, n, width int, f func(int) error) error {
	sem := make(chan struct{}, width)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := f(i); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(append(errs, ctx.Err())...)
}
