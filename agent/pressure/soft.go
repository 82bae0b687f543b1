package pressure

import (
	"time"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// SoftTracker follows the kubelet's soft thresholds as its eviction manager does
// (synchronize, pkg/kubelet/eviction/eviction_manager.go):
//   - a soft threshold is met while the signal is below it (thresholdsMet), or, once its grace
//     period has passed, until the signal is back above it plus the minimum reclaim
//     (thresholdsNotYetResolved, from m.thresholdsMet, which holds the thresholds that met their
//     grace period);
//   - it was first observed at the first reading of an unbroken run of such readings
//     (thresholdsFirstObservedAt): one reading that does not meet it starts the period again;
//   - it drives an eviction once it has been met for its grace period (thresholdsMetGracePeriod).
//
// A signal not read keeps its state, as the Tracker keeps it: the kubelet's own Summary always
// holds its signals, and a failed read here must neither start nor end a grace period.
type SoftTracker struct {
	first map[kubelet.Signal]time.Time
	// graceMet are the signals whose grace period has passed: the min-reclaim band holds them.
	graceMet map[kubelet.Signal]bool
}

// NewSoftTracker returns a tracker with no soft threshold met.
func NewSoftTracker() *SoftTracker {
	return &SoftTracker{first: map[kubelet.Signal]time.Time{}, graceMet: map[kubelet.Signal]bool{}}
}

// Observe records the levels read at now and returns the signals whose soft threshold has held
// for its grace period, in the order of levels.
func (t *SoftTracker) Observe(now time.Time, levels []Level) []kubelet.Signal {
	var out []kubelet.Signal
	for _, l := range levels {
		s := l.Signal
		if !l.HasSoft {
			delete(t.first, s)
			delete(t.graceMet, s)
			continue
		}
		met := l.Available < l.Soft || (t.graceMet[s] && l.Available < satAdd(l.Soft, l.MinReclaim))
		if !met {
			delete(t.first, s)
			delete(t.graceMet, s)
			continue
		}
		at, ok := t.first[s]
		if !ok {
			at = now
			t.first[s] = now
		}
		t.graceMet[s] = now.Sub(at) >= l.SoftGrace
		if t.graceMet[s] {
			out = append(out, s)
		}
	}
	return out
}

// SoftGrace is the grace the kubelet gives a pod it evicts for a soft threshold:
// min(evictionMaxPodGracePeriod, the pod's terminationGracePeriodSeconds) (synchronize), never
// less than 1 s (the pod worker's calculateEffectiveGracePeriod: "no matter what, we always
// supply a grace period of 1"; an override of 0 is not replaced by the pod's own grace since
// v1.33's overridden flag). Whole seconds, as the API takes them.
func SoftGrace(podGrace, maxPodGrace time.Duration) time.Duration {
	return max(min(podGrace, maxPodGrace).Truncate(time.Second), MinGrace)
}

// DecideSoft returns the pod to evict for a soft threshold whose grace period has passed: the
// first ranked, with SoftGrace, one a pass and the next only once it is gone (inFlight counts
// the pods evicted for the resource still on the node), as the kubelet evicts one pod per
// synchronize and waits for its cleanup (waitForPodsCleanup).
func DecideSoft(ranked []Candidate, inFlight int, maxPodGrace time.Duration) []Eviction {
	if inFlight > 0 || len(ranked) == 0 {
		return nil
	}
	c := ranked[0]
	return []Eviction{{Candidate: c, Grace: SoftGrace(c.Grace, maxPodGrace)}}
}
