package guard

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent/record"
)

// Reckoner counts, where the count survives the node, whether each pod reprieve planned to
// evict was gone before its node was reclaimed (issue 48, item 4). The agent's own count
// (reprieve_evictions_missed_deadline_total) moves a safety margin before the machine goes and
// dies with it: only a scrape inside those seconds sees it. The guard runs off the reclaimed
// nodes, and its index already watches every bound pod, so it reckons from there:
//
//   - the agent marks each pod a notice plans to evict with reprieve.io/evict-at and
//     reprieve.io/reclaim-deadline (its pod notice, --pod-notice, on by default); a pod that
//     tolerates the interruption forever gets no evict-at, and DaemonSet and mirror pods are
//     not planned, so none of them is counted;
//   - the index hands the reckoner every pod's mark as it trims the pod (indexedPod.mark); a
//     pod deleted, finished (Succeeded or Failed) or unmarked (the notice withdrawn) drops out;
//   - Settle after a mark's deadline, the reckoner lists the node's pods once (its own GET of
//     the node's pods, the field selector the agent's informer uses: the index's watch may
//     lag, and a pod wrongly counted pages someone) and counts each marked pod still there and
//     not finished as having outlived the reclaim.
//
// Each pod is counted once per deadline. A mark seen first more than Stale after its deadline
// (the guard started late, or its watch was down) is not counted: the guard cannot tell then
// whether the pod outlived the reclaim or only its node's object. Every replica counts the
// same pods; the alert takes the largest count.
type Reckoner struct {
	clock   clock.WithTicker
	list    func(ctx context.Context, node string) ([]v1.Pod, error)
	metrics *ReckonMetrics
	// Settle is how long after a deadline the node's pods are read: the kubelet deletes a pod
	// that finished just before the deadline a moment later, and the watch shows it later still.
	settle time.Duration
	// Stale bounds how late a reckoning may be: see Reckoner.
	stale time.Duration

	mu sync.Mutex
	// reclaims are the reclaims not reckoned yet, by node and deadline; byUID says which one each
	// marked pod belongs to; reckoned holds the UIDs counted, with their deadline, until the pod
	// is deleted (an update after the reclaim does not count it again); done the reclaims
	// reckoned, so that a late mark does not open one again.
	reclaims map[reclaimKey]*reclaim
	byUID    map[types.UID]reclaimKey
	reckoned map[types.UID]time.Time
	done     map[reclaimKey]bool
}

// reclaimKey names a node's reclaim: the node and its deadline.
type reclaimKey struct {
	node     string
	deadline time.Time
}

// reclaim is what the reckoner knows of one node's reclaim before reckoning it.
type reclaim struct {
	seen    time.Time            // when its first mark was seen
	gone    int                  // marked pods deleted or finished since
	pending map[types.UID]string // marked pods not gone, by UID: their namespace/name
}

// podMark is what the index keeps of a pod reprieve marked for a notice.
type podMark struct {
	node, name string // name is namespace/name, for the log
	deadline   time.Time
	// finished: the pod is Succeeded or Failed, its work done; it counts as gone.
	finished bool
}

func (m podMark) key() reclaimKey { return reclaimKey{node: m.node, deadline: m.deadline} }

// Reckoning defaults: see Reckoner.
const (
	DefaultReckonSettle = 5 * time.Second
	DefaultReckonStale  = 2 * time.Minute
)

// NewReckoner returns a reckoner that reads a node's pods with list. m may be nil.
func NewReckoner(list func(ctx context.Context, node string) ([]v1.Pod, error), m *ReckonMetrics, c clock.WithTicker) *Reckoner {
	return &Reckoner{clock: c, list: list, metrics: m, settle: DefaultReckonSettle, stale: DefaultReckonStale,
		reclaims: map[reclaimKey]*reclaim{}, byUID: map[types.UID]reclaimKey{}, reckoned: map[types.UID]time.Time{}, done: map[reclaimKey]bool{}}
}

// markOf is the mark a pod carries: its node's reclaim deadline, when reprieve planned to evict
// it (both annotations). ok is false otherwise, and for a deadline that does not parse (the pod
// is then not counted; the agent writes RFC 3339).
func markOf(p *v1.Pod) (podMark, bool) {
	if _, planned := p.Annotations[record.AnnotationEvictAt]; !planned || p.Spec.NodeName == "" {
		return podMark{}, false
	}
	d, err := time.Parse(time.RFC3339, p.Annotations[record.AnnotationReclaimDeadline])
	if err != nil {
		return podMark{}, false
	}
	return podMark{node: p.Spec.NodeName, name: p.Namespace + "/" + p.Name, deadline: d,
		finished: p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed}, true
}

// observe records uid's mark m (nil: the pod is not marked, or no longer) and whether the pod
// was deleted.
func (r *Reckoner) observe(uid types.UID, m *podMark, deleted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.observeLocked(uid, m, deleted)
}

func (r *Reckoner) observeLocked(uid types.UID, m *podMark, deleted bool) {
	if deleted {
		delete(r.reckoned, uid)
	}
	k0, had := r.byUID[uid]
	if m == nil || m.finished || deleted {
		if had {
			// Gone (deleted or finished) counts for its reclaim; unmarked (the notice
			// withdrawn) does not.
			r.leave(uid, k0, deleted || (m != nil && m.finished))
		}
		return
	}
	k := m.key()
	if d, counted := r.reckoned[uid]; (counted && d.Equal(m.deadline)) || r.done[k] || (had && k0 == k) {
		return
	}
	if had {
		r.leave(uid, k0, false) // the deadline moved
	}
	rc := r.reclaims[k]
	if rc == nil {
		rc = &reclaim{seen: r.clock.Now(), pending: map[types.UID]string{}}
		r.reclaims[k] = rc
	}
	rc.pending[uid] = m.name
	r.byUID[uid] = k
}

// leave takes uid out of its reclaim k, gone or not; a reclaim left with no pod and none gone
// (its notice withdrawn, or its deadline moved) is dropped.
func (r *Reckoner) leave(uid types.UID, k reclaimKey, gone bool) {
	delete(r.byUID, uid)
	rc := r.reclaims[k]
	if rc == nil {
		return
	}
	delete(rc.pending, uid)
	if gone {
		rc.gone++
	}
	if len(rc.pending) == 0 && rc.gone == 0 {
		delete(r.reclaims, k)
	}
}

// replace takes a full list: marks are the marked pods in it, and present says whether a UID is
// in it at all (a marked pod missing from it was deleted meanwhile).
func (r *Reckoner) replace(marks map[types.UID]podMark, present func(types.UID) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid := range r.byUID {
		if _, ok := marks[uid]; !ok {
			r.observeLocked(uid, nil, !present(uid))
		}
	}
	for uid, m := range marks {
		r.observeLocked(uid, &m, false)
	}
	for uid := range r.reckoned {
		if !present(uid) {
			delete(r.reckoned, uid)
		}
	}
}

// Run reckons every second until ctx ends.
func (r *Reckoner) Run(ctx context.Context) {
	t := r.clock.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			r.Reckon(ctx)
		}
	}
}

// reckoning is one node's reclaim whose deadline has settled.
type reckoning struct {
	reclaimKey
	reclaim
}

// due takes out the reclaims whose deadline settled by now; those first seen too late to count
// are dropped (and logged).
func (r *Reckoner) due(ctx context.Context, now time.Time) []reckoning {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []reckoning
	for k, rc := range r.reclaims {
		if now.Before(k.deadline.Add(r.settle)) {
			continue
		}
		delete(r.reclaims, k)
		r.done[k] = true
		for uid := range rc.pending {
			delete(r.byUID, uid)
			r.reckoned[uid] = k.deadline
		}
		if rc.seen.Sub(k.deadline) > r.stale {
			klog.FromContext(ctx).V(2).Info("Not reckoning a reclaim first seen long after its deadline", "node", k.node,
				"deadline", k.deadline.UTC().Format(time.RFC3339), "pods", len(rc.pending))
			continue
		}
		out = append(out, reckoning{k, *rc})
	}
	for k := range r.done {
		if now.Sub(k.deadline) > 10*r.stale {
			delete(r.done, k)
		}
	}
	slices.SortFunc(out, func(a, b reckoning) int {
		return strings.Compare(a.node+a.deadline.String(), b.node+b.deadline.String())
	})
	return out
}

// Reckon counts the reclaims whose deadline has settled (Run calls it each second). A node whose
// pods cannot be read is retried at the next call, until Stale past its deadline; it is then
// counted unknown, never clear.
func (r *Reckoner) Reckon(ctx context.Context) {
	logger := klog.FromContext(ctx)
	now := r.clock.Now()
	for _, g := range r.due(ctx, now) {
		deadline := g.deadline.UTC().Format(time.RFC3339)
		var outlived []string
		var err error
		if len(g.pending) > 0 {
			outlived, err = r.reckonNode(ctx, g)
		}
		switch {
		case err != nil && now.Sub(g.deadline) < r.stale:
			// Again at the next call: put the reclaim back.
			r.mu.Lock()
			delete(r.done, g.reclaimKey)
			rc := g.reclaim
			r.reclaims[g.reclaimKey] = &rc
			for uid := range g.pending {
				delete(r.reckoned, uid)
				r.byUID[uid] = g.reclaimKey
			}
			r.mu.Unlock()
			logger.Error(err, "Reading a reclaimed node's pods failed; retrying", "node", g.node, "deadline", deadline)
		case err != nil:
			r.metrics.reclaim(ReckonUnknown, 0)
			logger.Error(err, "Could not tell whether a reclaimed node's pods were gone in time", "node", g.node, "deadline", deadline, "pods", len(g.pending))
		case len(outlived) > 0:
			r.metrics.reclaim(ReckonOutlived, len(outlived))
			for _, name := range outlived {
				logger.Error(nil, "A pod reprieve planned to evict outlived its node's reclaim deadline", "pod", name, "node", g.node, "deadline", deadline)
			}
		default:
			r.metrics.reclaim(ReckonClear, 0)
			logger.V(2).Info("Every pod reprieve planned to evict was gone by its node's reclaim deadline", "node", g.node, "deadline", deadline,
				"pods", len(g.pending)+g.gone)
		}
	}
}

// reckonNode lists g's node's pods and returns the names of g's pods still there and not
// finished, sorted.
func (r *Reckoner) reckonNode(ctx context.Context, g reckoning) ([]string, error) {
	pods, err := r.list(ctx, g.node)
	if err != nil {
		return nil, fmt.Errorf("listing the pods of node %s: %w", g.node, err)
	}
	var out []string
	for i := range pods {
		p := &pods[i]
		if name, ok := g.pending[p.UID]; ok && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Reckoning outcomes, the bounded label set of reprieve_guard_reclaims_total.
const (
	// ReckonClear: every pod reprieve planned to evict was gone by the deadline.
	ReckonClear = "clear"
	// ReckonOutlived: some were still there (reprieve_guard_pods_outlived_reclaim_total).
	ReckonOutlived = "pods_outlived"
	// ReckonUnknown: the node's pods could not be read within Stale of the deadline.
	ReckonUnknown = "unknown"
)

// ReckonMetrics holds the reckoner's collectors.
type ReckonMetrics struct {
	Reclaims *prometheus.CounterVec
	Outlived prometheus.Counter
}

// NewReckonMetrics creates the reckoner's collectors on reg, at zero, so that increase() sees
// the first reclaim.
func NewReckonMetrics(reg prometheus.Registerer) (*ReckonMetrics, error) {
	m := &ReckonMetrics{
		Reclaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "reprieve", Subsystem: "guard", Name: "reclaims_total",
			Help: "Reclaim deadlines of nodes the eviction guard reckoned, by outcome: clear (every pod reprieve planned to evict was gone), pods_outlived, or unknown (the node's pods could not be read).",
		}, []string{"outcome"}),
		Outlived: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "reprieve", Subsystem: "guard", Name: "pods_outlived_reclaim_total",
			Help: "Pods reprieve planned to evict (marked reprieve.io/evict-at) that were still present, unfinished, a few seconds after their node's reclaim deadline. Must stay 0. Counted off the node: it survives the reclaim.",
		}),
	}
	if err := register(reg, []named{{"reprieve_guard_reclaims_total", m.Reclaims}, {"reprieve_guard_pods_outlived_reclaim_total", m.Outlived}}); err != nil {
		return nil, err
	}
	for _, o := range []string{ReckonClear, ReckonOutlived, ReckonUnknown} {
		m.Reclaims.WithLabelValues(o)
	}
	return m, nil
}

func (m *ReckonMetrics) reclaim(outcome string, outlived int) {
	if m == nil {
		return
	}
	m.Reclaims.WithLabelValues(outcome).Inc()
	m.Outlived.Add(float64(outlived))
}
