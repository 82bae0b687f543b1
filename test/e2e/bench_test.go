package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/agent"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// BenchmarkEvictionBurst measures how precisely reprieve evicts many pods due at the same
// instant: every pod tolerates the interruption taint for 10 s, so all are due at timeAdded +
// 10 s. It reports the spread between the first and the last eviction the API server shows and
// the lateness of each against its plan, as seen by a watch (so including the watch's delay).
// Run: make bench (go test -run '^$' -bench EvictionBurst -benchtime 1x ./test/e2e).
func BenchmarkEvictionBurst(b *testing.B) {
	for _, n := range []int{110, 250} {
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				evictionBurst(b, n, i)
			}
		})
	}
}

func evictionBurst(b *testing.B, n, iter int) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := fmt.Sprintf("burst-%d-%d", n, iter)
	node := ns + "-node"
	setupNode(ctx, b, ns, node, nil)
	taint, _ := agent.ParseTaint(agent.DefaultConfig().InterruptionTaint)
	pods := make([]scenario.Pod, n)
	for i := range pods {
		pods[i] = scenario.Pod{Name: fmt.Sprintf("p%03d", i), Kind: scenario.Plain, Tolerate: ptr64(10), Grace: ptr64(1)}
	}
	obs := createObserved(ctx, b, ns, node, taint, pods)
	rp, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, append([]string{"--kubeconfig=" + agentKubeconfig, "--provider=none"}, benchArgs...)...)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	b.ResetTimer()
	deadline := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second).Format(time.RFC3339)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, agent.AnnotationReclaimDeadline, deadline)
	if _, err := env.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		b.Fatal(err)
	}
	var added time.Time
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		nd, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, t := range nd.Spec.Taints {
			if t.Key == taint.Key && t.Effect == v1.TaintEffectNoExecute && t.TimeAdded != nil {
				added = t.TimeAdded.Time
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	planned := added.Add(10 * time.Second)
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Until(planned)+30*time.Second, true, func(context.Context) (bool, error) {
		evicted := 0
		for _, r := range obs.Records() {
			if !r.DeletedAt.IsZero() {
				evicted++
			}
		}
		return evicted == n, nil
	})
	if err != nil {
		b.Fatalf("not every pod was evicted: %v", err)
	}
	b.StopTimer()
	var late []float64
	first, last := time.Time{}, time.Time{}
	for _, r := range obs.Records() {
		late = append(late, r.DeletedAt.Sub(planned).Seconds()*1000)
		if first.IsZero() || r.DeletedAt.Before(first) {
			first = r.DeletedAt
		}
		if r.DeletedAt.After(last) {
			last = r.DeletedAt
		}
	}
	sort.Float64s(late)
	metrics, _ := scenario.Scrape(addr)
	b.ReportMetric(float64(last.Sub(first).Milliseconds()), "spread-ms")
	b.ReportMetric(quantile(late, 0.5), "p50-late-ms")
	b.ReportMetric(quantile(late, 0.99), "p99-late-ms")
	b.ReportMetric(late[len(late)-1], "max-late-ms")
	b.ReportMetric(late[0], "min-late-ms")
	b.Logf("agent's own lateness histogram:\n%s", grep(metrics, "reprieve_evictions_lateness_seconds"))
}

// benchArgs are extra reprieve flags for a benchmark run (REPRIEVE_BENCH_ARGS, space-separated).
var benchArgs = strings.Fields(os.Getenv("REPRIEVE_BENCH_ARGS"))

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func grep(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
