package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestSoak runs interruptions back to back against one agent and one control plane and checks
// that its goroutines and memory do not grow: a leak per interruption (a timer, a watch, a
// queue entry, an event correlator key) shows over 50 of them. Not part of make test; run it
// with make soak (REPRIEVE_SOAK=1, REPRIEVE_SOAK_ROUNDS to change the count).
func TestSoak(t *testing.T) {
	if os.Getenv("REPRIEVE_SOAK") != "1" {
		t.Skip("soak run: REPRIEVE_SOAK=1 (make soak)")
	}
	rounds := 50
	if s := os.Getenv("REPRIEVE_SOAK_ROUNDS"); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 10 {
			t.Fatalf("REPRIEVE_SOAK_ROUNDS=%q: want a number of at least 10", s)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rounds)*30*time.Second)
	defer cancel()
	const ns, node, perRound = "soak", "soak-node", 5
	setupNode(ctx, t, ns, node, nil)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	rp, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none", "-v=1")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	type sample struct{ goroutines, heap, rss float64 }
	measure := func() sample {
		text, err := scenario.Scrape(addr)
		if err != nil {
			t.Fatal(err)
		}
		return sample{sumMetric(text, "go_goroutines"), sumMetric(text, "go_memstats_heap_inuse_bytes"), sumMetric(text, "process_resident_memory_bytes")}
	}
	var warm sample
	begin := time.Now()
	for round := range rounds {
		pods := make([]scenario.Pod, perRound)
		for i := range pods {
			pods[i] = scenario.Pod{Name: fmt.Sprintf("r%02d-p%d", round, i), Kind: scenario.Plain, Tolerate: ptr64(int64(i % 2)), Grace: ptr64(1)}
		}
		if err := scenario.Create(ctx, env.Client, ns, node, taint, pods); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(9 * time.Second).UTC().Truncate(time.Second)
		setDeadline(ctx, t, node, deadline.Format(time.RFC3339))
		waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
		waitFor(ctx, t, "this round's pods gone", func() bool {
			for _, p := range pods {
				if _, err := env.Client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					return false
				}
			}
			return true
		})
		// Let the window end, so the summary runs, then withdraw the notice.
		select {
		case <-time.After(time.Until(deadline.Add(-config.DefaultConfig().SafetyMargin).Add(500 * time.Millisecond))):
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		setDeadline(ctx, t, node, "")
		waitNode(ctx, t, node, "the taint removed", func(n *v1.Node) bool { return !hasTaint(n, taint.Key, taint.Effect) })
		if rp.Exited() {
			t.Fatalf("reprieve exited in round %d: %s", round, rp.ExitDescription())
		}
		if round == 4 {
			warm = measure()
		}
	}
	last := measure()
	t.Logf("%d interruptions of %d pods in %v; after 5: %v goroutines, heap in use %.1f MiB, RSS %.1f MiB; after %d: %v goroutines, heap in use %.1f MiB, RSS %.1f MiB",
		rounds, perRound, time.Since(begin).Round(time.Second), warm.goroutines, warm.heap/(1<<20), warm.rss/(1<<20),
		rounds, last.goroutines, last.heap/(1<<20), last.rss/(1<<20))
	text, err := scenario.Scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	if got := sumMetric(text, "reprieve_evictions_missed_deadline_total"); got != 0 {
		t.Errorf("%v pods missed their deadline over the soak", got)
	}
	if last.goroutines > warm.goroutines+10 {
		t.Errorf("goroutines grew from %v to %v over %d interruptions", warm.goroutines, last.goroutines, rounds-5)
	}
	// Heap in use moves with the garbage collector's cycle; a leak of even 100 KiB per
	// interruption would show as 4.5 MiB.
	if last.heap > warm.heap*1.5+(4<<20) {
		t.Errorf("heap in use grew from %.1f to %.1f MiB over %d interruptions", warm.heap/(1<<20), last.heap/(1<<20), rounds-5)
	}
}
