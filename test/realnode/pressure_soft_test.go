package realnode

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/test/nodeenv"
)

// The soft threshold's grace period and the kubelet's evictionMaxPodGracePeriod of softCase.
const (
	softGracePeriod = 15 * time.Second
	softMaxPodGrace = 4
)

// softCase is a soft memory.available threshold with its grace period (issue 37 case 3): the
// kubelet's evictionSoft memory.available goes hardBelow (1000 MiB) under the machine's when the
// kubelet restarts, held for 15 s, with evictionMaxPodGracePeriod 4; its hard threshold stays the
// default 100Mi, gigabytes away. The hog allocates 50 MiB a second up to 2500 MiB (the machine's
// memory moves by hundreds of MiB between the restart and the hog's start: with 600 MiB it was
// once below the soft threshold before the hog began), asks for a 30 s grace, and goes on
// allocating after its SIGTERM until it is killed, so that its SIGTERM to its end is the grace
// it was given: min(4, 30) = 4 s from the kubelet, and the same from reprieve. The quiet pod has
// the hog's priority: the host source's per-pod working sets rank the hog first.
//
// The kubelet runs with kernelMemcgNotification off, its default: it reads memory.available at
// its 10 s passes, so it first sees the soft threshold met up to 10 s after the crossing and
// evicts at its first pass 15 s after that. With the kernel's notification on (the other cases
// here), it sees the crossing at once, and whether its pass 15 s later comes before reprieve's
// one-second read is then the phase of its 10 s loop (docs/pressure.md, Limits).
var softCase = pressureCase{
	signal: "memory.available", resource: "memory", condition: memoryCase.condition, defaultHard: "100Mi",
	available: hostMemoryAvailable, hostMemory: true,
	hardBelow: 1000, ownAbove: 600,
	hog: func(ns, out string) *v1.Pod {
		return workloadPod(ns, "hog", out, []string{"alloc", "-out", "/out/hog", "-rate", "50", "-max", "2500"})
	},
	equalPriority: true,
	hogGrace:      30, keepOnTerm: true,
	soft: true, softPodGrace: softMaxPodGrace,
	window:  90 * time.Second,
	prefix:  "soft",
	figures: "memory.available-soft",
	title:   "a soft threshold held 15 s",
	configure: func(k *nodeenv.KubeletConfig, below int64) (int64, error) {
		avail, err := hostMemoryAvailable()
		if err != nil {
			return 0, err
		}
		soft := int64(avail)>>20 - below
		k.EvictionHard["memory.available"] = "100Mi"
		k.EvictionSoft = map[string]string{"memory.available": fmt.Sprintf("%dMi", soft)}
		k.EvictionSoftGracePeriod = map[string]string{"memory.available": softGracePeriod.String()}
		k.EvictionMaxPodGracePeriod = softMaxPodGrace
		k.KernelMemcgNotification = false
		return soft, nil
	},
	restore: func(k *nodeenv.KubeletConfig) {
		k.EvictionSoft, k.EvictionSoftGracePeriod, k.EvictionMaxPodGracePeriod = nil, nil, 0
		k.KernelMemcgNotification = true
	},
}

// A soft threshold with its grace period against the real kubelet, with and without reprieve
// (issue 37 case 3). Without reprieve the kubelet evicts the hog once the soft threshold has held
// for 15 s, with a 4 s grace; with reprieve (its threshold 600 MiB above the soft one), reprieve
// taints, then evicts the same pod through the Eviction API once the soft threshold has held for
// its grace period, with the same 4 s, before the kubelet does.
func TestSoftThresholdOnRealNode(t *testing.T) {
	testPressure(t, softCase)
}

// checkSoft checks a soft run: the hog went no sooner than the soft threshold's grace period
// after the crossing (unless the signal was below it at the first reading, at firstAt), had the grace min(evictionMaxPodGracePeriod, its own), from reprieve
// through the Eviction API (with reprieve) or from the kubelet (without), and the quiet pod
// stayed.
func checkSoft(ctx context.Context, t *verdict, c pressureCase, ns, name string, withReprieve bool, evs []pressureEvent, evictedBy string, evictGrace int64, firstAt time.Duration) {
	t.Helper()
	at := map[string]time.Duration{}
	for _, e := range evs {
		at[e.what] = e.at
	}
	crossed, ok1 := at[momentHard]
	term, ok2 := at[momentSIGTERM]
	gone, ok3 := at[momentGone]
	if !ok1 || !ok2 || !ok3 {
		t.Errorf("%s: the soft threshold crossed %v, SIGTERM %v, gone %v: a moment missing", name, ok1, ok2, ok3)
		return
	}
	held, ran := term-crossed, gone-term
	if crossed <= firstAt {
		// Below it at the first reading: when it was crossed is not known, only that the grace
		// period had begun by then.
		t.Logf("%s: the soft threshold was already crossed at the first reading (%.1f s)", name, crossed.Seconds())
		held = softGracePeriod
	}
	t.Logf("%s: SIGTERM %.1f s after the host saw the soft threshold crossed (its grace period %s); the hog ran %.2f s after it (evictionMaxPodGracePeriod %d s, its own 30 s)",
		name, held.Seconds(), softGracePeriod, ran.Seconds(), c.softPodGrace)
	// The host's reading every 200 ms against reprieve's every second and the kubelet's own.
	if held < softGracePeriod-1500*time.Millisecond {
		t.Errorf("%s: SIGTERM %.1f s after the crossing, before the soft grace period of %s", name, held.Seconds(), softGracePeriod)
	}
	want := time.Duration(c.softPodGrace) * time.Second
	if ran < want-500*time.Millisecond || ran > want+1500*time.Millisecond {
		t.Errorf("%s: the hog ran %.2f s after its SIGTERM, want its soft-eviction grace of %s", name, ran.Seconds(), want)
	}
	if withReprieve {
		if !strings.Contains(evictedBy, "EvictionByEvictionAPI") {
			t.Errorf("with reprieve: the hog was evicted by %q, want the Eviction API (reprieve) before the kubelet", evictedBy)
		}
		if evictGrace != c.softPodGrace {
			t.Errorf("with reprieve: the eviction's grace %d s, want min(evictionMaxPodGracePeriod, the pod's) = %d s", evictGrace, c.softPodGrace)
		}
		if _, ok := at[momentTaint]; !ok {
			t.Errorf("with reprieve: no %s taint", c.taintKey())
		}
	} else if !strings.Contains(evictedBy, "TerminationByKubelet") {
		t.Errorf("without reprieve: the hog was evicted by %q, want the kubelet", evictedBy)
	}
	if q, err := env.Client.CoreV1().Pods(ns).Get(ctx, "quiet", metav1.GetOptions{}); err == nil && (q.DeletionTimestamp != nil || q.Status.Reason == "Evicted") {
		t.Errorf("%s: the quiet pod was evicted; the kubelet takes the hog alone", name)
	}
}
