package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// Tenant pods of TestTenantPodsKeepAgentMemoryBounded: tenantPods pods of about tenantPodBytes
// each, the most a tenant who may create pods in one namespace can write into each (the API
// server takes objects up to about 1.5 MiB, etcd's request limit, and annotations up to 256 KiB
// in all): 80 x 1.3 MiB is 104 MiB of pods that name the node, more than the chart's 112Mi
// limit leaves once the agent's own 40 MiB are counted.
const (
	tenantPods     = 80
	tenantPodBytes = 1331 << 10
	// tenantHeapBound is the agent's heap in use once synced: about 7 MiB idle
	// (docs/benchmarks.md) and the trimmed pods, a few KiB each; the whole pods took 110 MiB.
	tenantHeapBound = 24 << 20
	// tenantRSSBound is what the agent may reach, its peak (VmHWM) from its start until it has
	// settled: its idle footprint (about 40 MiB, of which 16 MiB are the binary's pages,
	// docs/benchmarks.md) and 40 MiB for the decoding of the pods' list and watch events,
	// 1.3 MiB each, which the garbage collector trails on a busy machine: 32 MiB under the
	// chart's 112Mi limit.
	tenantRSSBound = 80 << 20
	// chartMemoryLimit is the chart's limit (resources.limits.memory: 112Mi), which the chart
	// also hands the Go runtime as GOMEMLIMIT.
	chartMemoryLimit = 112 << 20
)

// TestTenantPodsKeepAgentMemoryBounded (issue 39 item 3): a tenant creates 80 pods of 1.3 MiB
// each bound to the agent's node (spec.nodeName set, so no scheduler is asked: anyone who may
// create pods may do it), their bulk in annotations near the 256 KiB limit, labels, environment
// and arguments; half of them tolerate every taint. The real agent, started on that node with
// the chart's GOMEMLIMIT, must hold no more than tenantHeapBound once synced (its pod cache keeps
// only what it reads, agent.trimForCache), and peak under tenantRSSBound from its start to the
// end of an interruption that evicts half of those pods: nothing it does may hold all of the
// node's pods whole at once. Before the fix the cache kept every byte, and the agent peaked past
// the chart's 112Mi limit, where the kubelet OOM-kills it at every start. It prints the figures
// for docs/benchmarks.md.
func TestTenantPodsKeepAgentMemoryBounded(t *testing.T) {
	// Not parallel: the figures are the agent's alone, measured while no other test's agent
	// starts, and GOMEMLIMIT is set for this agent only through the environment.
	t.Setenv("GOMEMLIMIT", strconv.Itoa(chartMemoryLimit))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, node = "tenant-bulk", "tenant-bulk-a"
	setupNode(ctx, t, ns, node, nil)
	defer deleteTenantPods(t, ns)

	begin := time.Now()
	if err := createTenantPods(ctx, ns, node); err != nil {
		t.Fatal(err)
	}
	created := time.Since(begin)

	start := time.Now()
	rp, metrics, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	ready := time.Since(start)
	// The agent's start reads its node's pods once more outside the cache (the check for other
	// interruption handlers, in the background): let it finish, and the runtime give back what
	// it freed, before the settled figure.
	peak := sampleAgent(t, rp.Pid(), 5*time.Second)
	settled := agentMemory(t, rp.Pid())
	text, err := scenario.Scrape(metrics)
	if err != nil {
		t.Fatal(err)
	}
	heap := sumMetric(text, "go_memstats_heap_inuse_bytes")
	t.Logf("%d tenant pods of %.2f MiB created in %v; agent Ready in %v; RSS %.1f MiB settled (heap in use %.1f MiB), peak (VmHWM) %.1f MiB",
		tenantPods, float64(tenantPodBytes)/(1<<20), created.Round(time.Millisecond), ready.Round(time.Millisecond),
		float64(settled.rss)/(1<<20), heap/(1<<20), float64(peak.hwm)/(1<<20))

	// The failure: the agent OOM-killed at every start. Its peak from the start to
	// settled must stay under the bound (it was 376 MiB before the cache was trimmed).
	if peak.hwm > tenantRSSBound {
		t.Errorf("with %d tenant pods of %.1f MiB on its node the agent peaked at %.1f MiB at its start; want at most %d MiB (the chart's limit is %d MiB)",
			tenantPods, float64(tenantPodBytes)/(1<<20), float64(peak.hwm)/(1<<20), tenantRSSBound>>20, chartMemoryLimit>>20)
	}
	if heap > tenantHeapBound {
		t.Errorf("with %d tenant pods of %.1f MiB on its node the agent's heap in use is %.1f MiB once synced; want at most %d MiB: its cache keeps what it does not read",
			tenantPods, float64(tenantPodBytes)/(1<<20), heap/(1<<20), tenantHeapBound>>20)
	}

	// The trimmed cache still drives the agent: an interruption evicts every tenant pod that
	// does not tolerate it, leaves the others, and ends with the summary, for which the agent
	// confirms with a live list of the node's pods which are still there. Its memory stays
	// bounded through it.
	deadline := time.Now().Add(20 * time.Second).UTC().Truncate(time.Second)
	setDeadline(ctx, t, node, deadline.Format(time.RFC3339))
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		pods, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; p.DeletionTimestamp == nil && len(p.Spec.Tolerations) == 0 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Errorf("the agent did not evict every tenant pod that does not tolerate the interruption: %v", err)
	}
	handled := waitHandled(ctx, t, node, deadline.Add(-config.DefaultConfig().SafetyMargin))
	if rp.Exited() {
		t.Fatalf("the agent exited: %s", rp.ExitDescription())
	}
	end := agentMemory(t, rp.Pid())
	t.Logf("after the interruption (%q): RSS %.1f MiB, peak (VmHWM) %.1f MiB; bound %d MiB, chart limit %d MiB",
		handled.Message, float64(end.rss)/(1<<20), float64(end.hwm)/(1<<20), tenantRSSBound>>20, chartMemoryLimit>>20)
	// Through the interruption: the writes of a tenant's pod ask for its metadata only and
	// discard the answer (kube.PatchPod, DeletePod), and the summary's live list reads
	// metadata only (kube.ListPodMetadata). Before, each write decoded the whole 1.3 MiB pod the
	// API server answered with, and the peak reached 122-127 MiB; after, 56.5 MiB in one run.
	// The peak over the agent's life must stay under the chart's limit.
	if end.hwm > chartMemoryLimit-16<<20 {
		t.Errorf("through the interruption the agent peaked at %.1f MiB; want at most %d MiB (16 MiB under the chart's limit)", float64(end.hwm)/(1<<20), (chartMemoryLimit-16<<20)>>20)
	}
}

// sampleAgent reads the agent's memory every 100 ms for d and returns the last reading (VmHWM is
// the kernel's peak over the process's life, so the last reading holds the peak).
func sampleAgent(t *testing.T, pid int, d time.Duration) agentMem {
	t.Helper()
	var m agentMem
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		m = agentMemory(t, pid)
	}
	return m
}

// tenantPod is one pod of about tenantPodBytes that a tenant could write: a 250 KiB annotation
// (the API server allows 256 KiB of annotations in all), 400 labels of 63-character values, and
// the rest in one container's environment and arguments, which have no limit of their own. Every
// other pod tolerates every taint forever, as a DaemonSet's pods do: it stays through an
// interruption.
func tenantPod(ns, node string, i int) *v1.Pod {
	fill := func(n int, c byte) string { return strings.Repeat(string(c), n) }
	labels := map[string]string{"app.kubernetes.io/name": "tenant"}
	for j := range 400 {
		labels[fmt.Sprintf("tenant.example/l%03d", j)] = fill(63, 'l')
	}
	var tolerations []v1.Toleration
	if i%2 == 0 {
		tolerations = []v1.Toleration{{Operator: v1.TolerationOpExists}}
	}
	// A grace that ends inside the test's 15 s window: the evicted pods are gone by its summary.
	grace := int64(5)
	used := 250<<10 + 400*(20+63)
	rest := (tenantPodBytes - used) / 4
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("bulk-%02d", i), Namespace: ns, Labels: labels,
			Annotations: map[string]string{"tenant.example/blob": fill(250<<10, 'a')},
		},
		Spec: v1.PodSpec{
			NodeName: node, Tolerations: tolerations, TerminationGracePeriodSeconds: &grace,
			Containers: []v1.Container{{
				Name: "c", Image: "registry.example/tenant:1",
				Args: []string{fill(rest, 'g'), fill(rest, 'h')},
				Env:  []v1.EnvVar{{Name: "E1", Value: fill(rest, 'e')}, {Name: "E2", Value: fill(rest, 'f')}},
			}},
		},
	}
}

// createTenantPods creates the tenant's pods, four at a time.
func createTenantPods(ctx context.Context, ns, node string) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				_, err := env.Client.CoreV1().Pods(ns).Create(ctx, tenantPod(ns, node, i), metav1.CreateOptions{})
				if err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("creating tenant pod %d: %w", i, err)
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range tenantPods {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// deleteTenantPods removes the tenant's pods at once (grace 0): 104 MiB of pods must not stay in
// the API server's cache for the tests that follow.
func deleteTenantPods(t *testing.T, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	zero := int64(0)
	for i := range tenantPods {
		err := env.Client.CoreV1().Pods(ns).Delete(ctx, fmt.Sprintf("bulk-%02d", i), metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Logf("deleting tenant pod %d: %v", i, err)
		}
	}
}
