package realnode

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/test/nodeenv"
)

// Memory figures of the pressure test, in MiB: the kubelet's hard threshold goes hardBelow under
// the machine's memory.available at the start, reprieve's own threshold ownAbove over the hard
// one, and the hog allocates hogRate a second up to hogMax, which crosses both.
const (
	hardBelow = 900
	ownAbove  = 600
	hogRate   = 50
	hogMax    = 1200
)

// pressureEvent is one moment of a pressure run, in seconds from the hog's start.
type pressureEvent struct {
	what string
	at   time.Duration
}

// Real memory pressure against the real kubelet, twice. The kubelet's evictionHard
// memory.available goes just under the machine's free memory; a pod allocating 100 MiB a second
// (50 MiB a second) crosses it, beside a quiet pod within its request (the kubelet ranks the hog first: above its
// zero request).
//   - with reprieve (its threshold 600 MiB above the kubelet's: 12 s ahead at that rate, more
//     than the hog's 3 s grace and the 5 s margin): it taints the node first, then
//     evicts the hog through the Eviction API with its own 3 s grace before the hard threshold,
//     and the kubelet never evicts;
//   - without reprieve: the kubelet evicts the hog itself at its hard threshold.
//
// Both timelines are logged side by side.
func TestMemoryPressureOnRealNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ensureInstalled(ctx, t)
	defer func() {
		// Back to the default thresholds and the default install for whatever runs next.
		_ = node.RestartKubelet(context.Background(), func(c *nodeenv.KubeletConfig) { c.EvictionHard["memory.available"] = "100Mi" })
	}()
	with := memoryRun(ctx, t, "with-reprieve", true)
	without := memoryRun(ctx, t, "without-reprieve", false)
	var rows []string
	rows = append(rows, "| moment | with reprieve | without reprieve |", "|---|---|---|")
	keys := []string{"reprieve's threshold crossed (agent's reading)", "reprieve's taint on the node", "SIGTERM in the hog", "the hog's process gone", "the kubelet's MemoryPressure condition", "the kubelet's hard threshold reached (lowest reading)"}
	find := func(evs []pressureEvent, what string) string {
		for _, e := range evs {
			if e.what == what {
				return fmt.Sprintf("%.1f s", e.at.Seconds())
			}
		}
		return "never"
	}
	for _, k := range keys {
		rows = append(rows, fmt.Sprintf("| %s | %s | %s |", k, find(with, k), find(without, k)))
	}
	t.Logf("memory pressure, seconds from the hog's start:\n%s", strings.Join(rows, "\n"))
	writeFigures(t, "memory", strings.Join(rows, "\n"))
}

func memoryRun(ctx context.Context, t *testing.T, name string, withReprieve bool) []pressureEvent {
	t.Helper()
	avail, err := hostMemoryAvailable()
	if err != nil {
		t.Fatal(err)
	}
	hard := int64(avail)>>20 - hardBelow
	if err := node.RestartKubelet(ctx, func(c *nodeenv.KubeletConfig) {
		c.EvictionHard["memory.available"] = fmt.Sprintf("%dMi", hard)
	}); err != nil {
		t.Fatal(err)
	}
	waitNoPressure(ctx, t)
	if withReprieve {
		install(ctx, t, "--set", fmt.Sprintf("pressure.thresholds=memory.available<%dMi", hard+ownAbove))
	} else {
		uninstall(ctx, t)
	}
	clearPressureTaint(ctx, t)
	ns := "mem-" + name
	createNamespace(ctx, t, ns)
	out := filepath.Join(outDir, ns)
	quiet := workloadPod(ns, "quiet", out, []string{"term", "-out", "/out/quiet"})
	quiet.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}
	if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, quiet, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hog := workloadPod(ns, "hog", out, []string{"alloc", "-out", "/out/hog", "-rate", fmt.Sprint(hogRate), "-max", fmt.Sprint(hogMax)})
	hog.Spec.TerminationGracePeriodSeconds = ptrTo[int64](3)
	if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, hog, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 60*time.Second, "the hog started", func() bool {
		_, ok := readMillis(filepath.Join(out, "hog"), "started")
		return ok
	})
	start, _ := readMillis(filepath.Join(out, "hog"), "started")
	var evs []pressureEvent
	add := func(what string, at time.Time) { evs = append(evs, pressureEvent{what, at.Sub(start)}) }
	seen := map[string]bool{}
	once := func(what string, at time.Time) {
		if !seen[what] {
			seen[what] = true
			add(what, at)
		}
	}
	hardBytes := float64(hard << 20)
	ownBytes := float64((hard + ownAbove) << 20)
	var evictedBy string
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		now := time.Now()
		if a, err := hostMemoryAvailable(); err == nil {
			if a < ownBytes {
				once("reprieve's threshold crossed (agent's reading)", now)
			}
			if a < hardBytes {
				once("the kubelet's hard threshold reached (lowest reading)", now)
			}
		}
		if n, err := env.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); err == nil {
			for _, tt := range n.Spec.Taints {
				if tt.Key == "reprieve.io/memory-pressure" {
					once("reprieve's taint on the node", now)
				}
			}
			for _, c := range n.Status.Conditions {
				if c.Type == v1.NodeMemoryPressure && c.Status == v1.ConditionTrue {
					once("the kubelet's MemoryPressure condition", now)
				}
			}
		}
		if p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "hog", metav1.GetOptions{}); err == nil && evictedBy == "" {
			if p.Status.Reason == "Evicted" {
				evictedBy = "the kubelet (" + p.Status.Message + ")"
			}
			for _, c := range p.Status.Conditions {
				if c.Type == v1.DisruptionTarget && c.Status == v1.ConditionTrue {
					evictedBy = c.Reason + ": " + c.Message
				}
			}
		}
		if term, ok := readMillis(filepath.Join(out, "hog"), "sigterm"); ok {
			once("SIGTERM in the hog", term)
			if last, ok := readMillis(filepath.Join(out, "hog"), "alive"); ok && time.Since(last) > time.Second {
				once("the hog's process gone", last)
				break
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%s: kubelet hard threshold %d MiB, reprieve's %d MiB; the hog evicted by %s; events %v", name, hard, hard+ownAbove, evictedBy, evs)
	if !seen["SIGTERM in the hog"] {
		t.Fatalf("%s: the hog was never evicted", name)
	}
	if withReprieve {
		if !seen["reprieve's taint on the node"] {
			t.Errorf("with reprieve: no memory-pressure taint")
		}
		if seen["the kubelet's MemoryPressure condition"] {
			t.Errorf("with reprieve: the kubelet reached its own hard threshold and reported MemoryPressure")
		}
		if !strings.Contains(evictedBy, "EvictionByEvictionAPI") {
			t.Errorf("with reprieve: the hog was evicted by %q, want the Eviction API (reprieve)", evictedBy)
		}
		// reprieve evicts in rank order until the pods' usage covers the shortfall to its
		// threshold plus the minimum reclaim: on a busy machine that can take the quiet pod too.
		if q, err := env.Client.CoreV1().Pods(ns).Get(ctx, "quiet", metav1.GetOptions{}); err == nil && q.DeletionTimestamp != nil {
			t.Logf("with reprieve: the quiet pod was evicted too (the shortfall was larger than the hog's usage)")
		}
	} else if !strings.Contains(evictedBy, "TerminationByKubelet") {
		t.Errorf("without reprieve: the hog was evicted by %q, want the kubelet", evictedBy)
	}
	// Leave no pressure behind: the pods go (no namespace controller runs here), and the
	// taint of an agent that is uninstalled next.
	zero := int64(0)
	_ = env.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	clearPressureTaint(ctx, t)
	waitFor(ctx, t, 60*time.Second, "the pods of "+ns+" gone", func() bool {
		list, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0
	})
	return evs
}

// waitNoPressure waits until the kubelet reports no MemoryPressure.
func waitNoPressure(ctx context.Context, t *testing.T) {
	t.Helper()
	waitFor(ctx, t, 60*time.Second, "no MemoryPressure on the node", func() bool {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeMemoryPressure {
				return c.Status != v1.ConditionTrue
			}
		}
		return true
	})
}

// clearPressureTaint removes reprieve's memory-pressure taint, which an agent takes off only a
// transition period after the pressure ends, and an uninstalled one never.
func clearPressureTaint(ctx context.Context, t *testing.T) {
	t.Helper()
	n, err := env.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var keep []v1.Taint
	for _, tt := range n.Spec.Taints {
		if tt.Key != "reprieve.io/memory-pressure" {
			keep = append(keep, tt)
		}
	}
	if len(keep) == len(n.Spec.Taints) {
		return
	}
	n.Spec.Taints = keep
	if _, err := env.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
