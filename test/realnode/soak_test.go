package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/test/nodeenv"
)

// soakLength is how long the healthy soak runs its workloads; soakImageFsSize the image
// filesystem TestMain gives the node for it and for the recording of the series.
const (
	soakLength      = 10 * time.Minute
	soakImageFsSize = 3 << 30
)

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// statfsSize is the size of dir's filesystem, in bytes.
func statfsSize(dir string) (float64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return float64(st.Blocks) * float64(st.Bsize), nil
}

// soakHardBelowMiB places the kubelet's memory.available threshold under the machine's at the
// soak's start: the soak's workloads together (a kept 800 MiB step, a 1000 MiB sawtooth, 1500 MiB
// of page cache and 600 ± 60 MiB) take up to 3960 MiB and typically about 2600, so that they come
// within reprieve's derived threshold (the kubelet's plus 5% of 24 GiB, 1229 MiB) at their peaks
// and never reach the kubelet's.
const soakHardBelowMiB = 4600

// Issue 47: on a node the kubelet leaves alone, reprieve evicts nothing. reprieve as the chart
// runs it (the host source, thresholds derived from the kubelet's) on the real node for ten
// minutes of the healthy workloads of the replay's corpus at once (a step kept, a garbage
// collector's sawtooth, page cache filled and dropped, jittery usage), while image pulls fill a
// 3 GiB image filesystem of its own past 85% with the kubelet's image garbage collection on (85%
// to 80%, its reclaim at imagefs.available<15%). Nothing may be evicted: no pod is deleted or
// evicted, by reprieve or by the kubelet, and reprieve_pressure_evictions_total stays 0. How long
// reprieve's pressure taints were on, and how full the image filesystem got, are logged.
//
// Not part of make test (ten minutes): make soak-pressure, or REPRIEVE_PRESSURE_SOAK=1.
func TestHealthyPressureSoakOnRealNode(t *testing.T) {
	if os.Getenv("REPRIEVE_PRESSURE_SOAK") != "1" {
		t.Skip("set REPRIEVE_PRESSURE_SOAK=1 for the ten-minute healthy soak (make soak-pressure)")
	}
	if size, err := statfsSize(node.ContainerdRoot); err != nil || size > soakImageFsSize {
		t.Fatalf("the image filesystem is %v bytes (%v): the soak needs the node's own of 3 GiB (TestMain gives it with REPRIEVE_PRESSURE_SOAK=1)", size, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), soakLength+8*time.Minute)
	defer cancel()
	avail, err := hostMemoryAvailable()
	if err != nil {
		t.Fatal(err)
	}
	hard := int64(avail)>>20 - soakHardBelowMiB
	// Images of pods gone before, which the kubelet sees at its start; they go with the soak.
	defer func() {
		_ = node.RemoveImages(context.Background(), "reprieve.test/")
		// The kubelet's collection may have deleted the test images no container used.
		if err := importImages(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	prefillImages(ctx, t)
	if err := node.RestartKubelet(ctx, func(k *nodeenv.KubeletConfig) {
		k.EvictionHard["memory.available"] = itoa(hard) + "Mi"
		imageGCKubelet(k)
	}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = node.RestartKubelet(context.Background(), func(k *nodeenv.KubeletConfig) {
			restoreMemory(k)
			restoreImageGC(k)
		})
	}()
	waitNoPressure(ctx, t, v1.NodeMemoryPressure)
	// As the chart runs it: no thresholds given, derived from the kubelet's configuration.
	uninstall(ctx, t)
	_, agent := install(ctx, t)
	clearPressureTaint(ctx, t, "reprieve.io/memory-pressure")
	clearPressureTaint(ctx, t, "reprieve.io/disk-pressure")
	const ns = "soak-healthy"
	createNamespace(ctx, t, ns)
	out := filepath.Join(outDir, ns)
	withGrace := func(p *v1.Pod, g int64) *v1.Pod { p.Spec.TerminationGracePeriodSeconds = ptrTo(g); return p }
	quiet := workloadPod(ns, "quiet", out, []string{"term", "-out", "/out/quiet"})
	quiet.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}
	pods := []*v1.Pod{
		withGrace(quiet, 3),
		withGrace(workloadPod(ns, "model", out, []string{"alloc", "-out", "/out/model", "-rate", "8000", "-max", "800", "-start-after", "60s"}), 30),
		withGrace(workloadPod(ns, "jvm", out, []string{"sawtooth", "-out", "/out/jvm", "-rate", "50", "-max", "1000", "-hold", "2s"}), 120),
		withGrace(withScratch(workloadPod(ns, "reader", out, []string{"pagecache", "-out", "/out/reader", "-file", "/scratch/big", "-size", "1500", "-hold", "60s", "-every", "3m"})), 10),
		withGrace(workloadPod(ns, "cache", out, []string{"jitter", "-out", "/out/cache", "-base", "600", "-amp", "60"}), 30),
	}
	defer func() {
		zero := int64(0)
		_ = env.Client.CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	}()
	uids := map[string]string{}
	for _, p := range pods {
		created, err := env.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids[p.Name] = string(created.UID)
	}
	for _, p := range pods {
		waitFor(ctx, t, 90*time.Second, p.Name+" started", func() bool {
			_, ok := readMillis(filepath.Join(out, p.Name), "started")
			return ok
		})
	}
	pctx, stopPulls := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { pullImages(pctx, t, 100, 20*time.Second) })
	defer func() { stopPulls(); wg.Wait() }()

	start := time.Now()
	var memTainted, diskTainted time.Duration
	var minAboveHard = int64(1) << 62
	var maxImageFsUsed float64
	conditions := map[v1.NodeConditionType]bool{}
	for time.Since(start) < soakLength {
		tick := time.Now()
		if a, err := hostMemoryAvailable(); err == nil {
			minAboveHard = min(minAboveHard, int64(a)>>20-hard)
		}
		if free, err := statfsAvail(node.ContainerdRoot, false); err == nil {
			if size, err := statfsSize(node.ContainerdRoot); err == nil && size > 0 {
				maxImageFsUsed = max(maxImageFsUsed, 1-free/size)
			}
		}
		if n, err := env.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); err == nil {
			for _, tt := range n.Spec.Taints {
				switch tt.Key {
				case "reprieve.io/memory-pressure":
					memTainted += time.Second
				case "reprieve.io/disk-pressure":
					diskTainted += time.Second
				}
			}
			for _, c := range n.Status.Conditions {
				if c.Status == v1.ConditionTrue && c.Type != v1.NodeReady {
					conditions[c.Type] = true
				}
			}
		}
		list, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Items {
			if by := evictedBy(&p); by != "" || p.DeletionTimestamp != nil || string(p.UID) != uids[p.Name] {
				t.Fatalf("%.0f s into the soak: %s evicted or deleted (%q, deletionTimestamp %v)", time.Since(start).Seconds(), p.Name, by, p.DeletionTimestamp)
			}
		}
		time.Sleep(max(time.Second-time.Since(tick), 0))
	}
	text, err := scrape(ctx, agentPod(ctx, t), 10271)
	if err != nil {
		t.Fatalf("scraping the agent %s: %v", agent.Name, err)
	}
	var evictions float64
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "reprieve_pressure_evictions_total{") {
			if v, ok := metric(text, strings.Fields(line)[0]); ok {
				evictions += v
			}
		}
	}
	t.Logf("healthy soak, %s: memory at least %d MiB above the kubelet's threshold (reprieve's derived one is 1229 MiB above it); the image filesystem up to %.0f%% used; "+
		"reprieve's memory-pressure taint on for %s, disk-pressure for %s; the kubelet's conditions seen: %v; reprieve_pressure_evictions_total %v",
		soakLength, minAboveHard, 100*maxImageFsUsed, memTainted, diskTainted, conditions, evictions)
	writeFigures(t, "pressure-soak", strings.Join([]string{
		"| the healthy soak (10 min) | |", "|---|---|",
		"| memory above the kubelet's threshold, least | " + itoa(minAboveHard) + " MiB |",
		"| the image filesystem, most used | " + itoa(int64(100*maxImageFsUsed)) + "% |",
		"| reprieve's memory-pressure taint on | " + memTainted.String() + " |",
		"| reprieve's disk-pressure taint on | " + diskTainted.String() + " |",
		"| evictions (reprieve's metric; pods evicted or deleted) | " + itoa(int64(evictions)) + " |",
	}, "\n"))
	if evictions != 0 {
		t.Errorf("reprieve_pressure_evictions_total %v on a healthy node, want 0", evictions)
	}
	if maxImageFsUsed < 0.85 {
		t.Errorf("the image filesystem got to %.0f%% used: the soak means past 85%%, where the kubelet's image GC starts", 100*maxImageFsUsed)
	}
	if minAboveHard <= 0 {
		t.Errorf("memory came %d MiB under the kubelet's threshold: the machine's other work made the run unhealthy; run it again", -minAboveHard)
	}
}
