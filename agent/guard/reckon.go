package guard

import (
	"context"
	"fmt"
	"maps"
	"slices"
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
	// marks are the marked pods not reckoned yet; reckoned the UIDs counted, with the deadline
	// they were counted for (a later deadline counts again), until the pod is deleted.
	marks    map[types.UID]podMark
	reckoned map[types.UID]time.Time
}

// podMark is what the index keeps of a pod reprieve marked for a notice.
type podMark struct {
	node, name string // name is namespace/name, for the log
	deadline   time.Time
	seen       time.Time // when the reckoner first saw the mark; set by the reckoner
}

// Reckoning defaults: see Reckoner.
const (
	DefaultReckonSettle = 5 * time.Second
	DefaultReckonStale  = 2 * time.Minute
)

// NewReckoner returns a reckoner that reads a node's pods with list. m may be nil.
func NewReckoner(list func(ctx context.Context, node string) ([]v1.Pod, error), m *ReckonMetrics, c clock.WithTicker) *Reckoner {
	return &Reckoner{clock: c, list: list, metrics: m, settle: DefaultReckonSettle, stale: DefaultReckonStale,
		marks: map[types.UID]podMark{}, reckoned: map[types.UID]time.Time{}}
}

// markOf is the mark a pod carries: its node's reclaim deadline, when reprieve planned to evict
// it (both annotations) and it has not finished. ok is false otherwise, and for a deadline that
// does not parse (the pod is then not counted; the agent writes RFC 3339).
func markOf(p *v1.Pod) (podMark, bool) {
	if _, planned := p.Annotations[record.AnnotationEvictAt]; !planned || p.Spec.NodeName == "" ||
		p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
		return podMark{}, false
	}
	d, err := time.Parse(time.RFC3339, p.Annotations[record.AnnotationReclaimDeadline])
	if err != nil {
		return podMark{}, false
	}
	return podMark{node: p.Spec.NodeName, name: p.Namespace + "/" + p.Name, deadline: d}, true
}

// observe records uid's mark, or its absence (nil: unmarked, finished or deleted).
func (r *Reckoner) observe(uid types.UID, m *podMark, deleted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if deleted {
		delete(r.reckoned, uid)
	}
	if m == nil {
		delete(r.marks, uid)
		return
	}
	if d, done := r.reckoned[uid]; done && d.Equal(m.deadline) {
		return
	}
	if old, ok := r.marks[uid]; ok && old.deadline.Equal(m.deadline) {
		return
	}
	mm := *m
	mm.seen = r.clock.Now()
	r.marks[uid] = mm
}

// replace sets the marks to those of a full list: a pod marked before that is not in it was
// deleted or unmarked meanwhile.
func (r *Reckoner) replace(marks map[types.UID]podMark) {
	r.mu.Lock()
	keep := make(map[types.UID]podMark, len(marks))
	now := r.clock.Now()
	for uid, m := range marks {
		if d, done := r.reckoned[uid]; done && d.Equal(m.deadline) {
			continue
		}
		if old, ok := r.marks[uid]; ok && old.deadline.Equal(m.deadline) {
			keep[uid] = old
			continue
		}
		m.seen = now
		keep[uid] = m
	}
	r.marks = keep
	for uid := range r.reckoned {
		if _, ok := marks[uid]; !ok {
			delete(r.reckoned, uid)
		}
	}
	r.mu.Unlock()
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

// reckoning is one node's marked pods whose deadline has settled.
type reckoning struct {
	node     string
	deadline time.Time
	pods     map[types.UID]string
}

// due takes out the marks whose deadline settled by now, by node and deadline; marks seen too
// late to count are dropped (and logged).
func (r *Reckoner) due(ctx context.Context, now time.Time) []reckoning {
	r.mu.Lock()
	defer r.mu.Unlock()
	byKey := map[string]*reckoning{}
	for uid, m := range r.marks {
		if now.Before(m.deadline.Add(r.settle)) {
			continue
		}
		delete(r.marks, uid)
		r.reckoned[uid] = m.deadline
		if m.seen.Sub(m.deadline) > r.stale {
			klog.FromContext(ctx).V(2).Info("Not reckoning a pod first seen marked long after its node's deadline", "pod", m.name, "node", m.node,
				"deadline", m.deadline.UTC().Format(time.RFC3339))
			continue
		}
		key := m.node + "\x00" + m.deadline.String()
		g := byKey[key]
		if g == nil {
			g = &reckoning{node: m.node, deadline: m.deadline, pods: map[types.UID]string{}}
			byKey[key] = g
		}
		g.pods[uid] = m.name
	}
	out := make([]reckoning, 0, len(byKey))
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		out = append(out, *byKey[k])
	}
	return out
}

// Reckon counts the marked pods whose node's deadline has settled (Run calls it each second).
// A node whose pods cannot be read is retried at the next call, until Stale past its
// deadline; it is then counted unknown, never clear.
func (r *Reckoner) Reckon(ctx context.Context) {
	logger := klog.FromContext(ctx)
	now := r.clock.Now()
	for _, g := range r.due(ctx, now) {
		outlived, err := r.reckonNode(ctx, g)
		deadline := g.deadline.UTC().Format(time.RFC3339)
		switch {
		case err != nil && now.Sub(g.deadline) < r.stale:
			// Again at the next call: put the marks back.
			r.mu.Lock()
			for uid, name := range g.pods {
				delete(r.reckoned, uid)
				if _, ok := r.marks[uid]; !ok {
					r.marks[uid] = podMark{node: g.node, name: name, deadline: g.deadline, seen: g.deadline}
				}
			}
			r.mu.Unlock()
			logger.Error(err, "Reading a reclaimed node's pods failed; retrying", "node", g.node, "deadline", deadline)
		case err != nil:
			r.metrics.reclaim(ReckonUnknown, 0)
			logger.Error(err, "Could not tell whether a reclaimed node's pods were gone in time", "node", g.node, "deadline", deadline, "pods", len(g.pods))
		case len(outlived) > 0:
			r.metrics.reclaim(ReckonOutlived, len(outlived))
			for _, name := range outlived {
				logger.Error(nil, "A pod reprieve planned to evict outlived its node's reclaim deadline", "pod", name, "node", g.node, "deadline", deadline)
			}
		default:
			r.metrics.reclaim(ReckonClear, 0)
			logger.V(2).Info("Every pod reprieve planned to evict was gone by its node's reclaim deadline", "node", g.node, "deadline", deadline, "pods", len(g.pods))
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
		if name, ok := g.pods[p.UID]; ok && p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
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
	for _, c := range []struct {
		name string
		c    prometheus.Collector
	}{{"reprieve_guard_reclaims_total", m.Reclaims}, {"reprieve_guard_pods_outlived_reclaim_total", m.Outlived}} {
		if err := reg.Register(c.c); err != nil {
			return nil, fmt.Errorf("registering %s: %w", c.name, err)
		}
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
