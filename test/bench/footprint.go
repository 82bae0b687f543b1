package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"k8s.io/client-go/rest"

	"github.com/reprieve-dev/reprieve/test/testenv"
)

// usage is what one agent cost over a window.
type usage struct {
	Window time.Duration
	// RSS samples (bytes) taken every second; HWM the peak the kernel recorded.
	RSSMedian, RSSMax, HWM uint64
	// Anon and File split the last sample (see procStat).
	Anon, File uint64
	// Millicores is CPU time over wall time, in thousandths of a core.
	Millicores float64
	// Requests are the agent's API requests in the window, by "VERB resource"; Watches the
	// watches it held open at the end.
	Requests map[string]int
	Watches  int
}

// footprintResult is measurement 4.
type footprintResult struct {
	Pods                 int
	Idle, Interruption   usage
	InterruptionEvicted  int
	InterruptionLeftOver int
	// StartToReady is from the agent's process start to its first 200 on /readyz (polled
	// every 50 ms): the client, the informers' first list and sync of the node and its pods,
	// and the first answer of the metadata service, which both answer from the start.
	StartToReady time.Duration
}

func (b *bench) footprint(ctx context.Context, rep *report) error {
	node := b.name("footprint")
	pods := complianceMix(b.o.Pods)
	obs, err := b.nodeWithPods(ctx, node, node, pods)
	if err != nil {
		return err
	}
	defer obs.Stop()
	fake, err := startIMDSFake()
	if err != nil {
		return err
	}
	defer fake.Close()
	proxy, err := startAPIProxy(b.env.Host, b.env.CAData, b.token)
	if err != nil {
		return err
	}
	defer proxy.Close()
	kc, err := proxy.kubeconfig(b.logDir, node)
	if err != nil {
		return err
	}
	started := time.Now()
	p, _, err := b.startAgentWith(ctx, kc, node, "--provider=aws", "--aws-imds-endpoint="+fake.URL,
		"--safety-margin="+b.o.SafetyMargin.String())
	if err != nil {
		return err
	}
	defer func() { _ = p.Stop() }()
	startToReady := time.Since(started)
	// After the first sync: the agent is ready once its informers synced; give it a little
	// longer for start-up work (events, the first polls) to pass.
	if err := sleepUntil(ctx, time.Now().Add(b.o.Settle)); err != nil {
		return err
	}
	res := &footprintResult{Pods: len(pods), StartToReady: startToReady}
	if res.Idle, err = measure(ctx, p, proxy, time.Now().Add(b.o.Idle), time.Second); err != nil {
		return err
	}
	deadline := time.Now().Add(b.o.FootprintWindow).Truncate(time.Second)
	fake.Post(deadline)
	if res.Interruption, err = measure(ctx, p, proxy, deadline.Add(2*time.Second), 500*time.Millisecond); err != nil {
		return err
	}
	for _, r := range obs.Records() {
		if !r.DeletedAt.IsZero() {
			res.InterruptionEvicted++
		}
		if r.GoneAt.IsZero() {
			res.InterruptionLeftOver++
		}
	}
	rep.Footprint = res
	return deleteAll(ctx, b.env.Client, node)
}

// measure samples p's memory every interval until end and returns its usage over the window.
func measure(ctx context.Context, p *testenv.Process, proxy *apiProxy, end time.Time, interval time.Duration) (usage, error) {
	begin := time.Now()
	st0, err := readProc(p.Pid())
	if err != nil {
		return usage{}, err
	}
	c0, _ := proxy.snapshot()
	var rss []float64
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	last := st0
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return usage{}, ctx.Err()
		case <-ticker.C:
		}
		st, err := readProc(p.Pid())
		if err != nil {
			return usage{}, err
		}
		rss = append(rss, float64(st.RSS))
		last = st
	}
	c1, watches := proxy.snapshot()
	wall := time.Since(begin)
	return usage{
		Window:     wall,
		RSSMedian:  uint64(median(rss)),
		RSSMax:     uint64(quantile(rss, 1)),
		HWM:        last.HWM,
		Anon:       last.Anon,
		File:       last.File,
		Millicores: float64(last.CPU-st0.CPU) / float64(wall) * 1000,
		Requests:   requestDiff(c0, c1),
		Watches:    watches,
	}, nil
}

// apiserverMetrics scrapes kube-apiserver's /metrics as the admin.
func (b *bench) apiserverMetrics(ctx context.Context) ([]sample, error) {
	client, err := rest.HTTPClientFor(b.env.Config)
	if err != nil {
		return nil, fmt.Errorf("creating an HTTP client for kube-apiserver: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.env.Host+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("scraping kube-apiserver: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping kube-apiserver: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping kube-apiserver: status %d: %v", resp.StatusCode, err)
	}
	return parseMetrics(string(body))
}
