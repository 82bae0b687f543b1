package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/test/fakes/slowproxy"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// apiLatency is what the proxy adds to every request of the agent's.
const apiLatency = 200 * time.Millisecond

// TestLoadSlowAPIServer: 250 pods on the node, and every request of the agent's reaches the API
// server 200 ms late (a TCP proxy delays its bytes), as a loaded server answers during a
// fleet-wide interruption. Pods due at once, pods due in a spread over the window and pods whose
// toleration outlasts the deadline (forced at their latest start) must all be gone before the
// window's end, and the summary and the missed-deadline metric must say so.
func TestLoadSlowAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const ns, node, n = "load", "load-node", 250
	setupNode(ctx, t, ns, node, nil)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	pods := make([]scenario.Pod, n)
	for i := range pods {
		p := scenario.Pod{Name: fmt.Sprintf("p%03d", i), Kind: scenario.Plain}
		switch i % 4 {
		case 0: // no toleration: due at once
			p.Grace = ptr64(int64(1 + i%10))
		case 1: // due within the window, spread over it
			p.Tolerate, p.Grace = ptr64(int64(3+i%20)), ptr64(2)
		case 2: // tolerates past the deadline: forced at its latest start
			p.Tolerate, p.Grace = ptr64(600), ptr64(int64(5+i%15))
		case 3: // tolerates 0 s with a long grace
			p.Tolerate, p.Grace = ptr64(0), ptr64(20)
		}
		pods[i] = p
	}
	// Instant: it runs alone and only waits for its pods to run before the agent starts.
	obs := createObserved(ctx, t, ns, node, taint, scenario.InstantAll(pods))

	slowKubeconfig := slowAgentKubeconfig(t, apiLatency)
	rp, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+slowKubeconfig, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	deadline := time.Now().Add(35 * time.Second).UTC().Truncate(time.Second)
	setDeadline(ctx, t, node, deadline.Format(time.RFC3339))
	nd := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	seen := time.Now()
	timeAdded := taintOf(nd, taint).TimeAdded.Time
	end := deadline.Add(-config.DefaultConfig().SafetyMargin)

	select {
	case <-time.After(time.Until(end)):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	// The summary from the log: its event waits behind the pods' events, which client-go's
	// broadcaster writes one at a time, each 200 ms late here.
	var summary string
	waitFor(ctx, t, "the window's summary in the log", func() bool {
		for _, l := range strings.Split(rp.LogTail(100), "\n") {
			if strings.Contains(l, `"Interruption window ended"`) {
				summary = l
				return true
			}
		}
		return false
	})
	recs := obs.Records()
	var late []string
	var lateness []time.Duration
	for _, p := range pods {
		r := recs[p.Name]
		if r.GoneAt.IsZero() || r.GoneAt.After(end) {
			late = append(late, fmt.Sprintf("%s (deleted T%+.2fs, gone %v)", p.Name, r.DeletedAt.Sub(timeAdded).Seconds(), r.GoneAt))
		}
		// Against its plan: due at timeAdded + toleration, or at once, or at its latest start.
		planned := timeAdded
		if p.Tolerate != nil {
			planned = timeAdded.Add(time.Duration(*p.Tolerate) * time.Second)
		}
		if latest := lastStart(end, time.Duration(*p.Grace)*time.Second); planned.After(latest) {
			planned = latest
		}
		// Pods due at once are due at the notice, not at the whole second timeAdded records.
		if !r.DeletedAt.IsZero() && planned.After(seen) {
			lateness = append(lateness, r.DeletedAt.Sub(planned))
		}
	}
	if len(late) > 0 {
		t.Errorf("%d of %d pods not gone by the window's end T%+.0fs: %s", len(late), n, end.Sub(timeAdded).Seconds(), strings.Join(late, ", "))
	}
	if !strings.Contains(summary, "stillPresent=0") || !strings.Contains(summary, fmt.Sprintf("goneInTime=%d", n)) {
		t.Errorf("summary %q, want all %d gone in time and 0 still present", summary, n)
	}
	text, err := scenario.Scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "reprieve_evictions_missed_deadline_total 0") {
		t.Errorf("missed-deadline metric: %s", grep(text, "reprieve_evictions_missed_deadline_total"))
	}
	sort.Slice(lateness, func(i, j int) bool { return lateness[i] < lateness[j] })
	if len(lateness) == 0 {
		t.Error("no pod with a plan after the notice was evicted: nothing to measure")
	}
	if len(lateness) > 0 {
		p50, p99 := lateness[len(lateness)/2], lateness[len(lateness)*99/100]
		// The promise is every eviction within 1 s of its plan (slack); the proxy adds its
		// latency on top (docs/benchmarks.md measured max 316 ms here).
		if worst := lateness[len(lateness)-1]; worst > slack+apiLatency || lateness[0] < -slack {
			t.Errorf("eviction minus plan ranges %v to %v, want within %v and %v", lateness[0].Round(time.Millisecond), worst.Round(time.Millisecond), -slack, slack+apiLatency)
		}
		t.Logf("%d pods with a plan after the notice, behind a %v API latency: eviction (as the watch saw it) minus plan p50 %v, p99 %v, max %v",
			len(lateness), apiLatency, p50.Round(time.Millisecond), p99.Round(time.Millisecond), lateness[len(lateness)-1].Round(time.Millisecond))
	}
	t.Logf("summary: %s", summary[strings.Index(summary, `"Interruption`):])
}

// slowAgentKubeconfig is the agent's kubeconfig through a TCP proxy that delays every byte of
// the agent's requests and answers by latency each way (the serving certificate names
// 127.0.0.1): a loaded or congested API server as the agent sees it. The proxy closes with t.
func slowAgentKubeconfig(t *testing.T, latency time.Duration) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(agentKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cluster := cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster]
	proxy, err := slowproxy.Start(strings.TrimPrefix(cluster.Server, "https://"), latency)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	cluster.Server = "https://" + proxy.Addr()
	path := filepath.Join(t.TempDir(), "slow.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
