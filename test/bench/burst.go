package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/kubectl/pkg/drain"

	"github.com/reprieve-dev/reprieve/test/scenario"
)

// Client settings of the drain comparison, as aws-node-termination-handler runs it: a client
// from rest.InClusterConfig() without QPS or Burst (client-go's defaults, 5 and 10), and a
// drain.Helper with Force, the pods' own grace (GracePeriodSeconds -1, its
// podTerminationGracePeriod default), IgnoreAllDaemonSets, and its nodeTerminationGracePeriod
// (120 s) as the timeout (aws-node-termination-handler pkg/node/node.go, getDrainHelper).
const (
	drainQPS     = 5
	drainBurst   = 10
	drainTimeout = 120 * time.Second
)

// burstRun is one burst: n pods due at one instant.
type burstRun struct {
	Who string // "reprieve" or "drain"
	N   int
	// Spread is first to last eviction as a watch saw them; Late* are (seen - planned).
	Spread             time.Duration
	P50, P99, Max, Min time.Duration
	Within1s           int
	AgentWithin        map[string]float64 // the agent's own histogram: bucket -> count
	PeakRSS            uint64             // VmHWM of the agent, bytes
	AllEvicted         bool
	LastGone           time.Duration // planned to the last pod gone
}

func (b *bench) burst(ctx context.Context, rep *report) error {
	for _, n := range b.o.Burst {
		for i := 0; i < b.o.Runs; i++ {
			r, err := b.reprieveBurst(ctx, n)
			if err != nil {
				return err
			}
			b.o.Logf("burst: reprieve, %d pods, run %d: spread %s, p99 %s", n, i+1, r.Spread, r.P99)
			rep.Burst = append(rep.Burst, r)
		}
		for i := 0; i < b.o.Runs; i++ {
			r, err := b.limitBurst(ctx, n)
			if err != nil {
				return err
			}
			b.o.Logf("burst: machine limit, %d pods, run %d: spread %s, p99 %s", n, i+1, r.Spread, r.P99)
			rep.Burst = append(rep.Burst, r)
		}
		for i := 0; i < b.o.DrainRuns; i++ {
			r, err := b.drainBurst(ctx, n)
			if err != nil {
				return err
			}
			b.o.Logf("burst: drain, %d pods, run %d: spread %s, p99 %s", n, i+1, r.Spread, r.P99)
			rep.Burst = append(rep.Burst, r)
		}
	}
	return nil
}

// reprieveBurst puts n pods on a node, each tolerating the interruption taint for BurstDue, and
// gives the node a deadline far enough away that every pod is due at timeAdded + BurstDue.
func (b *bench) reprieveBurst(ctx context.Context, n int) (*burstRun, error) {
	ns := b.name(fmt.Sprintf("burst-%d", n))
	due := int64(b.o.BurstDue / time.Second)
	grace := int64(1)
	pods := make([]scenario.Pod, n)
	for i := range pods {
		pods[i] = scenario.Pod{Name: fmt.Sprintf("p%03d", i), Kind: scenario.Plain, Tolerate: &due, Grace: &grace}
	}
	obs, err := b.nodeWithPods(ctx, ns, ns, pods)
	if err != nil {
		return nil, err
	}
	defer obs.Stop()
	tw, err := watchTaint(ctx, b.env.Client, ns)
	if err != nil {
		return nil, err
	}
	defer tw.Stop()
	p, addr, err := b.startAgent(ctx, ns, "--provider=none")
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.Stop() }()
	if err := setDeadline(ctx, b.env.Client, ns, time.Now().Add(2*time.Minute).Truncate(time.Second)); err != nil {
		return nil, err
	}
	ch, err := tw.Next(ctx, true, 30*time.Second)
	if err != nil {
		return nil, err
	}
	planned := ch.TimeAdded.Add(b.o.BurstDue)
	r, err := waitEvicted(ctx, obs, n, planned)
	if err != nil {
		return nil, fmt.Errorf("reprieve, %d pods: %w\n%s", n, err, p.LogTail(20))
	}
	r.Who = "reprieve"
	metrics, err := scenario.Scrape(addr)
	if err == nil {
		r.AgentWithin, err = histogram(metrics, "reprieve_evictions_lateness_seconds")
	}
	if err != nil {
		return nil, fmt.Errorf("reading reprieve's lateness histogram: %w", err)
	}
	if st, err := readProc(p.Pid()); err == nil {
		r.PeakRSS = st.HWM
	}
	return r, deleteAll(ctx, b.env.Client, ns)
}

// limitWho names the machine-limit rows: the fastest this API server, on this machine, accepts
// evictions of the same pods.
const limitWho = "machine limit (a minimal client, every eviction in flight at once)"

// limitBurst evicts n pods, each with a 1 s grace as in reprieveBurst, from one instant with a
// minimal client: no rate limit (QPS -1), one goroutine per pod, every request in flight at
// once, the Eviction API as reprieve posts it (no retries). It is the fastest the API server
// on the same machine accepts these evictions; reprieve's burst is reported against it.
func (b *bench) limitBurst(ctx context.Context, n int) (*burstRun, error) {
	ns := b.name(fmt.Sprintf("limit-%d", n))
	pods, obs, err := b.plainPods(ctx, ns, n)
	if err != nil {
		return nil, err
	}
	defer obs.Stop()
	grace := int64(1)
	cfg := rest.CopyConfig(b.env.Config)
	cfg.QPS = -1 // no client-side rate limit
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the minimal client: %w", err)
	}
	planned := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, p := range pods {
		wg.Go(func() {
			ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns},
				DeleteOptions: &metav1.DeleteOptions{GracePeriodSeconds: &grace}}
			errs[i] = client.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name(p.Name).
				SubResource("eviction").MaxRetries(0).Body(ev).Do(ctx).Error()
		})
	}
	r, err := waitEvicted(ctx, obs, n, planned)
	wg.Wait()
	if err != nil {
		return nil, fmt.Errorf("machine limit, %d pods: %w (first request error: %v)", n, err, errors.Join(errs...))
	}
	r.Who = limitWho
	return r, deleteAll(ctx, b.env.Client, ns)
}

// plainPods puts n pods with a 1 s grace and no toleration on a new node named ns, and returns
// them with the observer of their evictions (the caller stops it).
func (b *bench) plainPods(ctx context.Context, ns string, n int) ([]scenario.Pod, *scenario.Observer, error) {
	grace := int64(1)
	pods := make([]scenario.Pod, n)
	for i := range pods {
		pods[i] = scenario.Pod{Name: fmt.Sprintf("p%03d", i), Kind: scenario.Plain, Grace: &grace}
	}
	obs, err := b.nodeWithPods(ctx, ns, ns, pods)
	return pods, obs, err
}

// drainBurst drains a node of n pods through k8s.io/kubectl/pkg/drain with the settings of
// aws-node-termination-handler, started at one instant (the plan of every pod).
func (b *bench) drainBurst(ctx context.Context, n int) (*burstRun, error) {
	ns := b.name(fmt.Sprintf("drain-%d", n))
	_, obs, err := b.plainPods(ctx, ns, n)
	if err != nil {
		return nil, err
	}
	defer obs.Stop()
	cfg := rest.CopyConfig(b.env.Config)
	cfg.QPS, cfg.Burst = drainQPS, drainBurst
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the drain client: %w", err)
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var errOut strings.Builder
	helper := &drain.Helper{
		Ctx: dctx, Client: client, Force: true, GracePeriodSeconds: -1, IgnoreAllDaemonSets: true,
		Timeout: drainTimeout, Out: io.Discard, ErrOut: &errOut,
	}
	planned := time.Now()
	var wg sync.WaitGroup
	var drainErr error
	wg.Go(func() {
		node, err := client.CoreV1().Nodes().Get(dctx, ns, metav1.GetOptions{})
		if err != nil {
			drainErr = fmt.Errorf("reading node %s: %w", ns, err)
			return
		}
		if err := drain.RunCordonOrUncordon(helper, node, true); err != nil {
			drainErr = fmt.Errorf("cordoning %s: %w", ns, err)
			return
		}
		if err := drain.RunNodeDrain(helper, ns); err != nil && dctx.Err() == nil {
			drainErr = fmt.Errorf("draining %s: %w: %s", ns, err, errOut.String())
		}
	})
	r, err := waitEvicted(ctx, obs, n, planned)
	cancel()
	wg.Wait()
	if err != nil {
		return nil, fmt.Errorf("drain, %d pods: %w (drain: %v)", n, err, drainErr)
	}
	r.Who = "kubectl drain (aws-node-termination-handler settings)"
	return r, deleteAll(ctx, b.env.Client, ns)
}

// waitEvicted waits until every one of n pods has a deletionTimestamp and is gone, then scores
// the evictions against planned.
func waitEvicted(ctx context.Context, obs *scenario.Observer, n int, planned time.Time) (*burstRun, error) {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Until(planned)+drainTimeout+30*time.Second, true, func(context.Context) (bool, error) {
		gone := 0
		for _, r := range obs.Records() {
			if !r.GoneAt.IsZero() {
				gone++
			}
		}
		return gone >= n, nil
	})
	recs := obs.Records()
	r := &burstRun{N: n, AllEvicted: err == nil}
	var late []float64
	var first, last, lastGone time.Time
	for _, rec := range recs {
		if rec.DeletedAt.IsZero() {
			continue
		}
		d := rec.DeletedAt.Sub(planned)
		late = append(late, ms(d))
		if d <= time.Second {
			r.Within1s++
		}
		if first.IsZero() || rec.DeletedAt.Before(first) {
			first = rec.DeletedAt
		}
		if rec.DeletedAt.After(last) {
			last = rec.DeletedAt
		}
		if rec.GoneAt.After(lastGone) {
			lastGone = rec.GoneAt
		}
	}
	if len(late) == 0 {
		return nil, fmt.Errorf("no pod was evicted: %w", err)
	}
	r.Spread = last.Sub(first)
	r.P50 = time.Duration(quantile(late, 0.5) * float64(time.Millisecond))
	r.P99 = time.Duration(quantile(late, 0.99) * float64(time.Millisecond))
	r.Max = time.Duration(quantile(late, 1) * float64(time.Millisecond))
	r.Min = time.Duration(quantile(late, 0) * float64(time.Millisecond))
	r.LastGone = lastGone.Sub(planned)
	if err != nil {
		return r, fmt.Errorf("%d of %d pods evicted: %w", len(late), n, err)
	}
	return r, nil
}

// histogram returns the cumulative bucket counts of a Prometheus histogram, by le.
func histogram(text, name string) (map[string]float64, error) {
	samples, err := parseMetrics(text)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, s := range samples {
		if s.Name == name+"_bucket" {
			out[s.Labels["le"]] += s.Value
		}
	}
	return out, nil
}
