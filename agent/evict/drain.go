package evict

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/reprieve-dev/reprieve/agent/plan"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/providers"
)

// podKey identifies one pod for the eviction loop: a new pod of the same name (a StatefulSet's
// replacement) is a different pod and starts afresh.
type podKey struct {
	key string // namespace/name
	uid types.UID
}

// drain is the eviction loop's state for one window: the pods' attempts, backoff and events,
// the pods reprieve acted on (for the window summary), and whether the cloud was told the node
// is drained. Its lifetime is the window's: a new notice, a changed deadline or a withdrawal
// closes it and the next window starts from nothing, so that attempts and backoff from a
// withdrawn notice never make the next one skip the Eviction API, and a backoff set before any
// deadline existed never outlasts a new deadline. Without an interruption (a NoExecute taint of
// someone else) one drain with no deadline serves until an interruption starts.
//
// Every field is guarded by Executor.mu, except the podStates' own fields, which belong to the
// worker syncing that pod (the workqueue never hands one key to two workers at once) apart from
// blocked, done, lastGrace and shortenedTo, which the worker writes under Executor.mu (setBlocked,
// recordSent) because closing a drain and carryDone read them.
type drain struct {
	window plan.Window
	notice *providers.Notice // the notice that set the deadline; nil without one
	pods   map[podKey]*podState
	acted  map[string]bool // namespace/name of the pods evicted, deleted or shortened
	// atRisk holds namespace/name of the pods whose volume was reported at risk.
	atRisk map[string]bool
	// volumes holds the node's status.volumesInUse seen during the window, each with when it
	// was first seen gone from the list (zero: still in use); see Executor.ObserveVolumes.
	volumes map[v1.UniqueVolumeName]time.Time
	// podVolumes holds, by namespace/name, the volumes of each pod planned in the window with a
	// volume that needs attaching, read when the pod was first planned; see
	// Executor.notePodVolumes.
	podVolumes map[string]podVolumes
	// summarized and approved are set once each: the window summary was given, the cloud
	// was told the node is drained.
	summarized, approved bool
	closed               bool
	// from is the drain this one carried the sent pods of (carryDone): the same interruption
	// under an earlier deadline.
	from *drain
}

func newDrain(w plan.Window, n *providers.Notice) *drain {
	return &drain{window: w, notice: n, pods: map[podKey]*podState{}, acted: map[string]bool{}, atRisk: map[string]bool{},
		volumes: map[v1.UniqueVolumeName]time.Time{}, podVolumes: map[string]podVolumes{}}
}

// podVolumes is what was read of one pod's volumes, and why they are not all known (err);
// pending while the read is under way.
type podVolumes struct {
	uid     types.UID
	vols    VolumesOf
	err     error
	pending bool
}

// close ends d; blocked (the blocked-pods gauge) forgets its pods. Called with Executor.mu held.
func (d *drain) close(blocked prometheus.Gauge) {
	d.closed = true
	for _, st := range d.pods {
		if st.blocked {
			blocked.Dec()
		}
	}
}

// drop removes one pod's state from d. Called with Executor.mu held.
func (d *drain) drop(k podKey, st *podState, blocked prometheus.Gauge) {
	if st.blocked && !d.closed {
		blocked.Dec()
	}
	st.blocked = false
	delete(d.pods, k)
}

// carryDone copies from prev the pods already evicted or deleted, with the end they were asked
// to meet, so that a deadline moving within one interruption does not send them a second
// eviction before the informer shows their deletionTimestamp. Attempts and backoff are not
// carried. Called with e.mu held.
func (d *drain) carryDone(prev *drain) {
	d.from = prev
	for k, st := range prev.pods {
		if st.done {
			d.pods[k] = &podState{key: k, uid: st.uid, drain: d, done: true, lastGrace: st.lastGrace, shortenedTo: st.shortenedTo}
		}
	}
	for key := range prev.acted {
		d.acted[key] = true
	}
	for key := range prev.atRisk {
		d.atRisk[key] = true
	}
	for name, at := range prev.volumes {
		d.volumes[name] = at
	}
	for key, pv := range prev.podVolumes {
		d.podVolumes[key] = pv
	}
}
