package record

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8srecord "k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/metrics"
	"github.com/reprieve-dev/reprieve/agent/plan"
)

// WriteTimeout bounds one write of the node (its retries on conflict included), so that a PATCH
// held by a slow admission webhook or a struggling API server holds back the next write, never
// the evictions or the metadata polls: those do not wait on the writer at all.
const WriteTimeout = 10 * time.Second

// Backoff of the writes that failed: 200 ms doubling to 5 s, so that a write lost to an outage
// lands within seconds of the API server's return.
const (
	writeBackoffBase = 200 * time.Millisecond
	writeBackoffMax  = 5 * time.Second
)

// Wish is what the interruption loop wants on the node: its intent (the interruption, the
// notices' soft taints), whether the deadline annotation and the record are reprieve's to
// write, the record itself, and whether every pod reprieve evicts for the interruption is gone
// (the executor's Drained, for the Drained lifecycle condition).
type Wish struct {
	Intent        plan.Intent
	WriteDeadline bool
	Record        *Record
	Drained       bool
}

// Writer is the node's one writer. The interruption loop (SetInterruption) and the pressure loop
// (SetPressure) hand it their wishes and return at once; its own goroutine (Run) writes the
// combination with one merge patch at a time, under a resourceVersion precondition, retrying on
// conflict and, after a failure, with backoff. It also owns each taint's timeAdded: the moment
// reprieve first wanted it, in whole seconds, kept until the taint is no longer wanted, so that
// the plan made from Desire before the write equals the plan made from the written taint.
//
// It is a sink: it calls back into no other unit. What it needs crosses as values or data
// sources: each producer's wish (the interruption loop's carries the executor's drained state,
// which that loop reads at each reconcile), and the node from the informer's lister. The taints'
// timeAdded are stamped in the Set call that first wants a taint and handed back to its caller,
// so that Desire is a pure read. What a write did, the writer says itself: the refusals of its
// patches (its Refusals), the TaintApplied and TaintRemoved events, the notice-to-taint
// histogram. A change of the pressure wish is signalled on PressureChanged, which the
// interruption loop selects on to re-plan (a pressure taint may be NoExecute).
//
// Fields under mu are shared with the producers; the rest belong to the Run goroutine (or to the
// caller of Sync, which must not run beside it).
type Writer struct {
	client   kube.Interface
	nodeName string
	dryRun   bool
	taints   plan.TaintSet
	clock    clock.WithTicker
	// nodes is the informer's lister of the node (nil: always a live GET); a conflict falls
	// back to a live GET.
	nodes corelisters.NodeLister
	// refusals counts the refused patches (nil: none); recorder and metrics, when set, receive
	// the taints' events and the notice-to-taint latency.
	refusals *Refusals
	recorder k8srecord.EventRecorder
	metrics  *metrics.Metrics
	// conditions and lifecycle say which node conditions the writer keeps (NodeDesire).
	conditions, lifecycle bool

	mu           sync.Mutex
	interruption Wish
	pressure     []v1.Taint
	addedAt      map[string]time.Time
	wake         chan struct{}
	// pressureChanged is signalled (without blocking: one pending signal is enough) when
	// SetPressure changed the pressure wish.
	pressureChanged chan struct{}

	// lastDryRun and lastDryRunStatus are the last changes a dry run logged.
	lastDryRun, lastDryRunStatus string
	// written is the node as the last successful patch returned it, and writtenFrom the
	// resourceVersion the informer's copy had then. While the informer's copy is still at
	// writtenFrom it has not seen the write (after an API server outage its watch
	// backs off for up to 30 s), and written is the fresher view: without it every poll would
	// patch again and fail the resourceVersion precondition.
	written     *v1.Node
	writtenFrom string
	// cachedRV is the informer copy's resourceVersion that base last saw.
	cachedRV string
}

// WriterOptions configures a Writer.
type WriterOptions struct {
	Client   kube.Interface
	NodeName string
	DryRun   bool
	Taints   plan.TaintSet
	Clock    clock.WithTicker
	// Nodes lists the informer's copy of the node; nil reads it from the API server each time.
	Nodes corelisters.NodeLister
	// Refusals counts the patches the API server refused; nil counts nothing.
	Refusals *Refusals
	// Recorder receives the TaintApplied and TaintRemoved events; nil records none.
	Recorder k8srecord.EventRecorder
	// Metrics receives the notice-to-taint latency; nil observes nothing.
	Metrics *metrics.Metrics
	// NodeConditions keeps ConditionInterruption on the node's status (--node-conditions), and
	// LifecycleConditions also KEP-5683's (--lifecycle-conditions); both need patch on
	// nodes/status.
	NodeConditions, LifecycleConditions bool
}

// NewWriter returns a writer that wants nothing yet.
func NewWriter(o WriterOptions) *Writer {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Writer{client: o.Client, nodeName: o.NodeName, dryRun: o.DryRun, taints: o.Taints, clock: o.Clock,
		nodes: o.Nodes, refusals: o.Refusals, recorder: o.Recorder, metrics: o.Metrics,
		conditions: o.NodeConditions, lifecycle: o.NodeConditions && o.LifecycleConditions,
		addedAt: map[string]time.Time{}, wake: make(chan struct{}, 1), pressureChanged: make(chan struct{}, 1)}
}

// SetInterruption replaces the interruption loop's wish and wakes the writer. It never waits
// on the API server. It returns the taints the wish wants (the interruption taint while
// interrupting, then the soft taints) with their timeAdded: stamped now for a taint not wanted
// before, kept for one that was.
func (w *Writer) SetInterruption(wish Wish) []v1.Taint {
	w.mu.Lock()
	w.interruption = wish
	w.stampLocked()
	var want []v1.Taint
	if wish.Intent.Interrupting() {
		want = append(want, w.taints.Interruption)
	}
	out := w.withAddedLocked(append(want, wish.Intent.SoftTaints...))
	w.mu.Unlock()
	w.Poke()
	return out
}

// SetPressure replaces the pressure loop's wish, the pressure taints wanted on the node, and
// wakes the writer. It never waits on the API server. It returns those taints with their
// timeAdded (as SetInterruption does), and when the wish changed it signals PressureChanged.
func (w *Writer) SetPressure(taints []v1.Taint) []v1.Taint {
	w.mu.Lock()
	changed := !slices.EqualFunc(w.pressure, taints, func(a, b v1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value })
	w.pressure = append([]v1.Taint(nil), taints...)
	w.stampLocked()
	out := w.withAddedLocked(w.pressure)
	w.mu.Unlock()
	w.Poke()
	if changed {
		select {
		case w.pressureChanged <- struct{}{}:
		default:
		}
	}
	return out
}

// PressureChanged is signalled when the pressure wish changed: the interruption loop re-plans
// the pods on the node as it is about to be (a pressure taint may be NoExecute).
func (w *Writer) PressureChanged() <-chan struct{} { return w.pressureChanged }

// stampLocked makes addedAt hold exactly the taints the wishes want now: a taint wanted for the
// first time is stamped with the clock's time in whole seconds (the API server stores timeAdded
// at that precision), one still wanted keeps its stamp, and one no longer wanted is forgotten,
// so that wanting it again later makes a new taint. w.mu is held.
func (w *Writer) stampLocked() {
	want := map[string]bool{}
	if w.interruption.Intent.Interrupting() {
		want[TaintID(w.taints.Interruption)] = true
	}
	for _, t := range w.interruption.Intent.SoftTaints {
		want[TaintID(t)] = true
	}
	for _, t := range w.pressure {
		want[TaintID(t)] = true
	}
	for id := range w.addedAt {
		if !want[id] {
			delete(w.addedAt, id)
		}
	}
	now := w.clock.Now().Truncate(time.Second)
	for id := range want {
		if _, ok := w.addedAt[id]; !ok {
			w.addedAt[id] = now
		}
	}
}

// withAddedLocked returns copies of taints carrying their stamped timeAdded. w.mu is held.
func (w *Writer) withAddedLocked(taints []v1.Taint) []v1.Taint {
	out := make([]v1.Taint, 0, len(taints))
	for _, t := range taints {
		if at, ok := w.addedAt[TaintID(t)]; ok {
			t.TimeAdded = &metav1.Time{Time: at}
		}
		out = append(out, t)
	}
	return out
}

// Poke asks for a write of the current wishes: after a wish changed, or when the node changed
// (someone removed a taint reprieve wants).
func (w *Writer) Poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Desire is the combination of every wish, as the next write will carry it. The interruption
// loop plans the pods on ComputeNodeChange(node, Desire()).Taints: the node as it is about to
// be, so that an API outage delays the write but not the countdowns. It is a pure read: the
// taints' timeAdded were stamped by the Set calls that wanted them.
func (w *Writer) Desire() NodeDesire {
	w.mu.Lock()
	defer w.mu.Unlock()
	in := w.interruption.Intent
	in.SoftTaints = append(append([]v1.Taint(nil), in.SoftTaints...), w.pressure...)
	addedAt := maps.Clone(w.addedAt)
	return NodeDesire{
		Intent: in, Taints: w.taints, WriteDeadline: w.interruption.WriteDeadline, Record: w.interruption.Record,
		Conditions: w.conditions, Lifecycle: w.lifecycle,
		Drained: w.lifecycle && in.Interrupting() && w.interruption.Drained,
		AddedAt: func(id string) time.Time {
			if t, ok := addedAt[id]; ok {
				return t
			}
			// Every taint the wishes want was stamped when it was set (stampLocked), and
			// ComputeNodeChange adds no other. Read the clock; store nothing.
			return w.clock.Now().Truncate(time.Second)
		},
	}
}

// Run writes the wishes whenever they or the node change, until ctx ends.
func (w *Writer) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	fails := 0
	var retry clock.Timer
	var retryC <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			if retry != nil {
				retry.Stop()
			}
			return
		case <-w.wake:
		case <-retryC:
		}
		if retry != nil {
			retry.Stop()
			retry, retryC = nil, nil
		}
		if err := w.Sync(ctx); err != nil {
			fails++
			d := min(writeBackoffBase<<min(fails-1, 8), writeBackoffMax)
			if ctx.Err() == nil {
				logger.Error(err, "Updating the node failed; will retry", "node", w.nodeName, "retryIn", d)
			}
			retry = w.clock.NewTimer(d)
			retryC = retry.C()
			continue
		}
		fails = 0
	}
}

// Sync writes the current wishes once, within WriteTimeout. Tests call it directly; in the agent
// only Run does.
func (w *Writer) Sync(ctx context.Context) error {
	d := w.Desire()
	rctx, cancel := context.WithTimeout(ctx, WriteTimeout)
	defer cancel()
	done, err := w.ensure(rctx, d)
	w.announce(done, d)
	if err != nil {
		return err
	}
	// The conditions follow the taints: never True before the taint is written, and turned
	// False only once it is removed. Within the same WriteTimeout.
	return w.ensureConditions(rctx, d)
}

// announce emits an event for every taint a write added or removed (in a dry run, every one it
// would have), and measures how long the interruption taint took from the notice.
func (w *Writer) announce(ch NodeChange, d NodeDesire) {
	now := w.clock.Now()
	verb := ""
	if w.dryRun {
		verb = "Dry run: would have "
	}
	for _, t := range ch.Added {
		if w.recorder != nil {
			w.recorder.Eventf(events.NodeRef(w.nodeName), v1.EventTypeNormal, events.ReasonTaintApplied, "%sadded taint %s", verb, t.ToString())
		}
		if in := d.Intent.Interruption; w.metrics != nil && t.MatchTaint(&d.Taints.Interruption) && in != nil && !in.NoticeTime.IsZero() {
			w.metrics.NoticeToTaint.Observe(max(0, now.Sub(in.NoticeTime).Seconds()))
		}
	}
	for _, t := range ch.Removed {
		if w.recorder != nil {
			w.recorder.Eventf(events.NodeRef(w.nodeName), v1.EventTypeNormal, events.ReasonTaintRemoved, "%sremoved taint %s", verb, t.ToString())
		}
	}
}

// ensureConditions makes the node's status carry reprieve's conditions for d, with one strategic
// merge patch of nodes/status (conditionPatch). A refusal counts as a refused node write; a
// success does not clear the count, which the main patch and the write check own (a status patch
// that keeps being refused while no taint changes must still add up to --node-write-refusals).
func (w *Writer) ensureConditions(ctx context.Context, d NodeDesire) error {
	if !d.Conditions {
		return nil
	}
	node := w.base()
	if node == nil {
		n, err := w.client.CoreV1().Nodes().Get(ctx, w.nodeName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("getting node %s: %w", w.nodeName, err)
		}
		node = n
	}
	conds := ComputeConditionChange(node, d, w.clock.Now())
	if len(conds) == 0 {
		w.lastDryRunStatus = ""
		return nil
	}
	patch, err := conditionPatch(conds)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	if w.dryRun {
		var key strings.Builder
		for _, c := range conds {
			fmt.Fprintf(&key, "%s=%s/%s/%s;", c.Type, c.Status, c.Reason, c.Message)
		}
		if key.String() != w.lastDryRunStatus {
			w.lastDryRunStatus = key.String()
			logger.Info("Dry run: would patch node status", "node", klog.KObj(node), "patch", string(patch))
		}
		return nil
	}
	logger.V(2).Info("Patching node status", "node", klog.KObj(node), "patch", string(patch))
	out, err := w.client.CoreV1().Nodes().Patch(ctx, w.nodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		if w.refusals != nil && IsRefusal(err) {
			w.refusals.Observe(err)
		}
		return fmt.Errorf("patching the conditions of node %s: %w", w.nodeName, err)
	}
	w.written, w.writtenFrom = out, w.cachedRV
	return nil
}

// base returns the node to compute a change from: the informer's copy, unless it has not yet
// caught up with reprieve's own last write.
func (w *Writer) base() *v1.Node {
	if w.nodes == nil {
		return nil
	}
	node, err := w.nodes.Get(w.nodeName)
	if err != nil {
		return nil // not in the cache (yet): a live GET
	}
	w.cachedRV = node.ResourceVersion
	if w.written != nil && node.ResourceVersion == w.writtenFrom {
		return w.written
	}
	w.written = nil
	return node
}

// ensure makes the node carry d, retrying on conflict. It returns the change it made: empty
// when the node already was as wanted, or (in a dry run) when it already logged the same change.
func (w *Writer) ensure(ctx context.Context, d NodeDesire) (NodeChange, error) {
	logger := klog.FromContext(ctx)
	first := true
	var done NodeChange
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		done = NodeChange{}
		var node *v1.Node
		if first {
			node = w.base()
		}
		first = false
		if node == nil {
			n, err := w.client.CoreV1().Nodes().Get(ctx, w.nodeName, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("getting node %s: %w", w.nodeName, err)
			}
			node = n
		}
		ch := ComputeNodeChange(node, d)
		if ch.Empty() {
			w.lastDryRun = ""
			return nil
		}
		patch, err := mergePatch(node, ch)
		if err != nil {
			return err
		}
		if w.dryRun {
			// Nothing is written, so the same change comes back at every poll: say it once.
			b, _ := json.Marshal(struct {
				T []v1.Taint
				L map[string]*string
				A map[string]*string
			}{ch.Taints, ch.Labels, ch.Annotations})
			if key := string(b); key != w.lastDryRun {
				w.lastDryRun = key
				logger.Info("Dry run: would patch node", "node", klog.KObj(node), "patch", string(patch))
				done = ch
			}
			return nil
		}
		logger.V(2).Info("Patching node", "node", klog.KObj(node), "patch", string(patch))
		out, err := w.client.CoreV1().Nodes().Patch(ctx, w.nodeName, types.MergePatchType, patch, metav1.PatchOptions{})
		if w.refusals != nil {
			w.refusals.Observe(err)
		}
		if err != nil {
			return fmt.Errorf("patching node %s: %w", w.nodeName, err)
		}
		w.written, w.writtenFrom = out, w.cachedRV
		done = ch
		return nil
	})
	return done, err
}
