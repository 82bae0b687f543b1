// Package evict carries out the pods' evictions: one executor that both the interruption and the
// pressure loops use (the Eviction API with a UID precondition, backoff on a budget's refusal,
// the force point, a grace capped by the window), and one drain per notice window holding the
// per-pod state, which a new window starts afresh.
package evict

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/metrics"
	"github.com/reprieve-dev/reprieve/agent/notify"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/providers"
)

// View is what every pod's plan is computed from: the node's NoExecute taints, each with the
// anchor of its countdown in TimeAdded, the reclaim window, and the notice that set it.
type View struct {
	Taints []v1.Taint
	Window plan.Window
	Notice *providers.Notice
}

func (v View) equal(o View) bool {
	return v.Window.Equal(o.Window) && slices.EqualFunc(v.Taints, o.Taints, func(a, b v1.Taint) bool {
		return a.Key == b.Key && a.Value == b.Value && a.Effect == b.Effect && a.TimeAdded.Equal(b.TimeAdded)
	})
}

// Warner is told what every planned pod should be warned of (the pods' early warning); it must
// return at once.
type Warner interface {
	Warn(pod *v1.Pod, pl plan.Plan, w plan.Window, n *providers.Notice)
}

// Options configures an Executor.
type Options struct {
	Client   kube.Interface
	Pods     corelisters.PodLister
	Clock    clock.WithTickerAndDelayedExecution
	Metrics  *metrics.Metrics
	Recorder record.EventRecorder
	// Notifier sends the window's summary; nil when webhooks are off.
	Notifier *notify.Notifier
	// Warner, when set, is told each pod's plan.
	Warner              Warner
	NodeName            string
	DryRun              bool
	Filter              plan.PodFilter
	ComparisonOperators bool
	SafetyMargin        time.Duration
	// InterruptionTaint is the interruption's taint, for lateness (its timeAdded is when the
	// notice was known).
	InterruptionTaint v1.Taint
	// Evict sends an eviction; nil posts it without client-go's retries (postEviction).
	Evict func(context.Context, *policyv1.Eviction) error
	// MaxInFlight bounds the agent's eviction and delete requests in flight at once (the
	// gate's largest limit; see gate.go); 0 is DefaultMaxInFlight.
	MaxInFlight int
	// PodVolumes reads a pod's volumes (the agent reads its claims and their volumes from the
	// API server); nil, or an error, leaves that pod's volumes unknown in the window's
	// summary. It is called once per pod and window, off the eviction's path (notePodVolumes).
	PodVolumes func(context.Context, *v1.Pod) (VolumesOf, error)
	// Rand draws the jitter of the pauses after throttling, in [0, 1); nil draws from a
	// source seeded per process, so that every agent of a fleet draws its own.
	Rand func() float64
}

// VolumesOf is what Options.PodVolumes reads of a pod's volumes.
type VolumesOf struct {
	// Attach holds the unique names, as the node lists them in status.volumesInUse, of the
	// pod's volumes that attach to the node.
	Attach []v1.UniqueVolumeName
	// NoAttach describes the pod's claimed volumes that attach to no node (NFS, a local
	// volume, an unbound claim): there is nothing of theirs to release.
	NoAttach []string
}

// DefaultMaxInFlight is Options.MaxInFlight's default: the agent's default eviction workers.
const DefaultMaxInFlight = 64

// Executor carries out every eviction: it is the actuator of decide's actions (evict.go). Its
// view, its drain, every pod's state and the requests waiting in the gate are guarded by mu.
type Executor struct {
	o       Options
	evictFn func(context.Context, *policyv1.Eviction) error
	queue   workqueue.TypedDelayingInterface[string]
	gate    *gate
	// sends counts the requests handed to the gate and not yet answered or withdrawn.
	sends sync.WaitGroup
	// reads counts the reads of pods' volumes under way (notePodVolumes).
	reads sync.WaitGroup

	mu    sync.Mutex
	view  View
	drain *drain // the current window's; never nil
	// waiters holds the requests waiting in the gate, with their pod's state.
	waiters map[*waiter]*podState
}

// New returns an executor with no deadline and no taints.
func New(o Options) *Executor {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	e := &Executor{o: o, evictFn: o.Evict, gate: newGate(o.Clock, o.MaxInFlight, o.Rand),
		queue:   workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Clock: o.Clock}),
		view:    View{Window: plan.Window{SafetyMargin: o.SafetyMargin}},
		waiters: map[*waiter]*podState{},
		drain:   newDrain(plan.Window{SafetyMargin: o.SafetyMargin}, nil)}
	if e.evictFn == nil {
		e.evictFn = postEviction(o.Client)
	}
	return e
}

// SetView replaces the view every pod is planned from, and re-plans every pod when it changed. A
// new window (a new notice, a moved deadline, a withdrawal) closes the drain: the pods' eviction
// state belongs to the window it served. It never waits on the API server. It reports whether
// the view changed.
func (e *Executor) SetView(v View) bool {
	e.mu.Lock()
	changed := !e.view.equal(v)
	e.view = v
	if !e.drain.window.Equal(v.Window) {
		old := e.drain
		old.close(e.o.Metrics.BlockedPods)
		// Its requests still waiting for their turn go: the new window decides afresh.
		e.withdrawAll(old)
		e.drain = newDrain(v.Window, v.Notice)
		if v.Window.HasDeadline() {
			// A notice: its burst starts cold (gate.go).
			e.gate.notice()
		}
		if old.window.HasDeadline() && v.Window.HasDeadline() {
			// The same interruption with a new deadline: what was already sent stands (one
			// request per pod), the rest starts afresh.
			e.drain.carryDone(old)
		}
		changed = true
	} else {
		// The same window, perhaps under the notice's real ID once the provider answers
		// after a restart: approvals name the provider's own notice.
		e.drain.notice = v.Notice
	}
	e.mu.Unlock()
	if changed {
		e.EnqueueAll()
	}
	return changed
}

// View returns the current view.
func (e *Executor) View() View {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.view
}

// Enqueue queues a pod (an informer object or tombstone) for a sync.
func (e *Executor) Enqueue(obj any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		e.queue.Add(key)
	}
}

// EnqueueAll queues every pod of the node, the most urgent first (the gate's order: by their
// last safe moment, a pod already past it after the others): the workers take them in that
// order, so that the first requests of a notice, sent before the gate holds any waiter to
// order (the probe, see gate.go), are already the most urgent ones.
func (e *Executor) EnqueueAll() {
	pods, err := e.o.Pods.List(labels.Everything())
	if err != nil {
		return
	}
	view := e.View()
	now := e.o.Clock.Now()
	type item struct {
		pod              *v1.Pod
		planned, overdue bool
		key              time.Time
	}
	items := make([]item, len(pods))
	for i, p := range pods {
		pl := plan.PlanPod(p, view.Taints, view.Window, e.o.Filter, e.o.ComparisonOperators)
		w := pl.Bound(view.Window)
		key := gateKey(pl, w)
		items[i] = item{pod: p, planned: pl.Skip == plan.SkipNone, key: key,
			overdue: w.HasDeadline() && key.Before(now)}
	}
	slices.SortStableFunc(items, func(a, b item) int {
		if a.planned != b.planned {
			if a.planned {
				return -1
			}
			return 1
		}
		if a.overdue != b.overdue {
			if b.overdue {
				return -1
			}
			return 1
		}
		return a.key.Compare(b.key)
	})
	for _, it := range items {
		e.Enqueue(it.pod)
	}
}

// Run runs workers eviction workers until ctx ends.
func (e *Executor) Run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() { e.worker(ctx) })
	}
	<-ctx.Done()
	e.queue.ShutDown()
	wg.Wait()
	e.mu.Lock()
	e.withdrawAll(nil)
	e.mu.Unlock()
	e.sends.Wait()
	e.reads.Wait()
}

// SyncPod does what is due for one pod now and returns when to look at it again (0: only on the
// next change). The workers call it; tests call it directly.
func (e *Executor) SyncPod(ctx context.Context, key string) time.Duration { return e.syncPod(ctx, key) }

// Evict asks the Eviction API to evict pod with grace (see evict): the pressure loop's evictions
// go through the same request, and the same gate, as the interruption's. They count as due now
// and must go now: the pressure loop paces its own evictions (one pod at a time), and memory
// pressure does not wait for a throttling pause (the kubelet's own eviction would come first).
// While w has a deadline the grace is cut to end the pod by the window's end (fit), and Evict
// returns the grace it sent.
func (e *Executor) Evict(ctx context.Context, pod *v1.Pod, grace time.Duration, w plan.Window) (time.Duration, error) {
	now := e.o.Clock.Now()
	t, err := e.gate.acquire(ctx, now, now, now, false)
	if err != nil {
		return grace, fmt.Errorf("waiting to evict pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	grace = e.fit(pod, grace, w)
	err = e.evict(ctx, pod, grace, RequestTimeout)
	t.done(err)
	return grace, err
}

// Delete deletes pod with grace and a UID precondition; on a terminating pod it can only
// shorten the grace. While w has a deadline the grace is cut as Evict's is, and Delete returns
// the grace it sent.
func (e *Executor) Delete(ctx context.Context, pod *v1.Pod, grace time.Duration, w plan.Window) (time.Duration, error) {
	now := e.o.Clock.Now()
	t, err := e.gate.acquire(ctx, now, now, now, false)
	if err != nil {
		return grace, fmt.Errorf("waiting to delete pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	grace = e.fit(pod, grace, w)
	err = e.deletePod(ctx, pod, grace, RequestTimeout)
	t.done(err)
	return grace, err
}

// fit cuts grace so that pod, its request leaving now (when the gate let it go, not when it was
// asked for), is gone by w's end as the interruption's own evictions are (sendGrace): from when
// the request lands, with the allowance and the queueing margin the server takes now, and with
// the kubelet's tail after the grace (plan.Tail). Without a deadline grace is left as it is.
func (e *Executor) fit(pod *v1.Pod, grace time.Duration, w plan.Window) time.Duration {
	if !w.HasDeadline() {
		return grace
	}
	lands := e.o.Clock.Now().Add(plan.RequestAllowance + e.gate.sendMargin())
	return min(grace, plan.GraceAt(grace, w, lands.Add(plan.Tail(pod))))
}

// Background waits until a background write (the pods' early warning) may go: when no
// eviction waits for the API server, and while the agent is not paused by its throttling (see
// gate.go). done must be called with the write's result.
func (e *Executor) Background(ctx context.Context) (done func(error), err error) {
	t, err := e.gate.acquire(ctx, time.Time{}, time.Time{}, time.Time{}, true)
	if err != nil {
		return nil, err
	}
	return t.done, nil
}

// Seed gives the executor an answer time of the API server measured outside its own requests
// (the agent's caches' first list): the margin its requests leave until their own first answer,
// for a minute (gate.seed).
func (e *Executor) Seed(d time.Duration) { e.gate.seed(d) }

// IsPDBRefusal reports whether an eviction failed because a PodDisruptionBudget allows no
// disruption.
func IsPDBRefusal(err error) bool { return isPDBRefusal(err) }

func (e *Executor) warn(pod *v1.Pod, pl plan.Plan, w plan.Window) {
	if e.o.Warner == nil {
		return
	}
	e.mu.Lock()
	n := e.drain.notice
	e.mu.Unlock()
	e.o.Warner.Warn(pod, pl, w, n)
}

func (e *Executor) podEvent(pod *v1.Pod, typ, reason, format string, args ...any) {
	if e.o.DryRun {
		format = "Dry run: " + format
	}
	e.o.Recorder.Eventf(pod, typ, reason, format, args...)
}

// markActed records that reprieve evicted or deleted the pod during the pending window.
func (e *Executor) markActed(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.drain.acted[key] = true
}

// stateFor returns the current drain's state for a pod and the view to plan it with, taken
// together under the lock so that a pod is never planned with one window and remembered in
// another.
func (e *Executor) stateFor(key string, uid types.UID) (*podState, View) {
	e.mu.Lock()
	defer e.mu.Unlock()
	d := e.drain
	for k, st := range d.pods {
		if k.key == key && k.uid != uid {
			// The pod was replaced under the same name: its predecessor's state goes.
			d.drop(k, st, e.o.Metrics.BlockedPods)
		}
	}
	k := podKey{key: key, uid: uid}
	st, ok := d.pods[k]
	if !ok {
		st = &podState{key: k, uid: uid, drain: d}
		d.pods[k] = st
	}
	return st, e.view
}

// ObserveVolumes records, during a window with a deadline, the node's status.volumesInUse at
// now (issue 40, item 2): every volume seen in use, and when each was first seen gone from the
// list, which is when the kubelet published its release and the attach/detach controller may
// detach it at once. The window's summary says which were released before its end. It reads
// the agent's own node, which it watches anyway: no other watch.
func (e *Executor) ObserveVolumes(inUse []v1.UniqueVolumeName, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	d := e.drain
	if !d.window.HasDeadline() || d.summarized {
		return
	}
	listed := make(map[v1.UniqueVolumeName]bool, len(inUse))
	for _, name := range inUse {
		listed[name] = true
		if _, ok := d.volumes[name]; !ok || !d.volumes[name].IsZero() {
			d.volumes[name] = time.Time{} // in use (again)
		}
	}
	for name, at := range d.volumes {
		if !listed[name] && at.IsZero() {
			d.volumes[name] = now
		}
	}
}

// errNoPodVolumes is a pod's volumes' state when the executor has no reader of them.
var errNoPodVolumes = errors.New("no reader of the pods' volumes")

// errPodVolumesPending is a pod's volumes' state while they are being read.
var errPodVolumesPending = errors.New("still being read at the window's end")

// notePodVolumes reads, once per window, the volumes of a pod planned with a volume that needs
// attaching (plan.Volume), so that the window's summary can say per pod when each was released.
// They are read when the pod is first planned, and kept for the window (a moved deadline
// carries them: carryDone). The read (Options.PodVolumes: a GET of each claim and of its
// volume) runs on its own goroutine, bounded by ctx: the pod's eviction never waits on it.
func (e *Executor) notePodVolumes(ctx context.Context, key string, pod *v1.Pod) {
	e.mu.Lock()
	d := e.drain
	pv, ok := d.podVolumes[key]
	done := d.summarized || !d.window.HasDeadline() || ok && pv.uid == pod.UID
	if !done {
		d.podVolumes[key] = podVolumes{uid: pod.UID, err: errNoPodVolumes, pending: e.o.PodVolumes != nil}
	}
	e.mu.Unlock()
	if done || e.o.PodVolumes == nil {
		return
	}
	e.reads.Go(func() {
		rec := podVolumes{uid: pod.UID}
		rec.vols, rec.err = e.o.PodVolumes(ctx, pod)
		if rec.err != nil {
			klog.FromContext(ctx).Info("Could not read all of a pod's volumes", "pod", klog.KObj(pod), "err", rec.err)
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		// The current drain, when it is the one the read was asked for or carries from it (a
		// moved deadline): never a later window's, which reads for itself.
		for dd := e.drain; dd != nil; dd = dd.from {
			if dd == d {
				if pv, ok := e.drain.podVolumes[key]; ok && pv.uid == pod.UID && pv.pending {
					e.drain.podVolumes[key] = rec
				}
				break
			}
		}
	})
}

// maxPodVolumeLines bounds the pods the summary's event names one by one; the log has them all.
const maxPodVolumeLines = 10

// podVolumeSummary says, for each pod planned in window w with a volume that needs attaching,
// when each of its volumes left the node's volumesInUse (volumes, from ObserveVolumes) relative
// to the deadline D, or that it was still in use at the count's moment at; a pod whose volumes
// could not be read is "unknown", with why. held reports a volume still in use.
func podVolumeSummary(pods map[string]podVolumes, volumes map[v1.UniqueVolumeName]time.Time, w plan.Window, at time.Time) (lines []string, held bool) {
	for _, key := range slices.Sorted(maps.Keys(pods)) {
		pv := pods[key]
		var parts []string
		if pv.pending {
			pv.err = errPodVolumesPending
		}
		for _, name := range pv.vols.Attach {
			gone, seen := volumes[name]
			switch {
			case !seen:
				parts = append(parts, fmt.Sprintf("volume %s not seen in the node's volumesInUse during the window", name))
			case !gone.IsZero() && !gone.After(at):
				parts = append(parts, fmt.Sprintf("volume %s released at D%+.1fs", name, gone.Sub(w.Deadline).Seconds()))
			default:
				held = true
				parts = append(parts, fmt.Sprintf("volume %s still in use at D%+.1fs", name, at.Sub(w.Deadline).Seconds()))
			}
		}
		for _, desc := range pv.vols.NoAttach {
			parts = append(parts, desc+" attaches to no node")
		}
		switch {
		case pv.err != nil && len(parts) == 0:
			parts = append(parts, fmt.Sprintf("volumes unknown (%v)", pv.err))
		case pv.err != nil:
			parts = append(parts, fmt.Sprintf("other volumes unknown (%v)", pv.err))
		case len(parts) == 0:
			parts = append(parts, "no volume that attaches")
		}
		lines = append(lines, key+": "+strings.Join(parts, ", "))
	}
	return lines, held
}

// volumesToCount is what reprieve_window_volumes_total counts of a window: the volumes in use
// during it that belong to the pods reprieve planned with the volume rule (pods), released by
// at (the count's moment) or not. A volume of a pod that reprieve leaves on the node on purpose
// (it tolerates the interruption forever, a DaemonSet's, one the filter skips) is not counted:
// the alert on a volume still in use must be one someone can act on. When some planned pod's
// volumes are unknown, or the volume rule is off (rule false: no pod's volumes are read), every
// volume counts: it cannot tell them apart, and with the rule off a volume still in use is the
// wait the rule is there to spare.
func volumesToCount(pods map[string]podVolumes, volumes map[v1.UniqueVolumeName]time.Time, at time.Time, rule bool) (released, held int) {
	counts := countedVolumes(pods, rule)
	for name, gone := range volumes {
		if !counts(name) {
			continue
		}
		if !gone.IsZero() && !gone.After(at) {
			released++
		} else {
			held++
		}
	}
	return released, held
}

// countedVolumes is volumesToCount's choice of the volumes it counts, as a test.
func countedVolumes(pods map[string]podVolumes, rule bool) func(v1.UniqueVolumeName) bool {
	mine, unknown := map[v1.UniqueVolumeName]bool{}, !rule
	for _, pv := range pods {
		for _, name := range pv.vols.Attach {
			mine[name] = true
		}
		unknown = unknown || pv.err != nil || pv.pending
	}
	return func(name v1.UniqueVolumeName) bool { return unknown || mine[name] }
}

// volumesPending is how many of the volumes volumesToCount counts the node still lists in use
// (volumes, from ObserveVolumes).
func volumesPending(pods map[string]podVolumes, volumes map[v1.UniqueVolumeName]time.Time, rule bool) int {
	counts, n := countedVolumes(pods, rule), 0
	for name, gone := range volumes {
		if gone.IsZero() && counts(name) {
			n++
		}
	}
	return n
}

// volumeCountDue reports whether the window's summary, with its volume count, may be given at
// now, with pending counted volumes still listed in use: once the window has ended, when none
// is, and at the deadline in any case. The volume rule has a pod gone VolumeRelease before the
// deadline so that the kubelet publishes the release by the deadline, not by the window's end:
// counted at the window's end, a pod gone at D - 15.4 s whose volume was unmounted in 0.5 s and
// published at D - 4.6 s was counted still in use, and the alert said its detach would wait six
// minutes while the controller detached it at once (issue 50, case 6).
func volumeCountDue(w plan.Window, pending int, now time.Time) bool {
	return !now.Before(w.End()) && (pending == 0 || !now.Before(w.Deadline))
}

// volumesHoldDrain reports whether pending counted volumes still listed in use keep the node
// from counting as drained at now (Drained): the cloud, once told, lets the machine go, and a
// volume the kubelet has not yet published released would wait six minutes for its detach
// (issue 50, case 5). Bounded by the window's end: from then on the cloud gains only seconds,
// and a volume stuck in use (its unmount hangs) must not hold the approval until the event's
// own start.
func volumesHoldDrain(w plan.Window, pending int, now time.Time) bool {
	return pending > 0 && now.Before(w.End())
}

// volumeSummary says which volumes in use during the window were released by at (the count's
// moment), and which not (sorted), for the window's summary.
func volumeSummary(volumes map[v1.UniqueVolumeName]time.Time, at time.Time) (released int, held []string) {
	for name, gone := range volumes {
		if !gone.IsZero() && !gone.After(at) {
			released++
		} else {
			held = append(held, string(name))
		}
	}
	slices.Sort(held)
	return released, held
}

// Summarize runs once the pending interruption's window has ended (deadline - safety margin)
// and its volume count is due (volumeCountDue: no volume of the pods it evicted still listed in
// use, or the deadline, by which the kubelet is due to publish their release): every pod
// reprieve would still evict is one that missed the deadline. It records them, and one event on
// the node (and the "handled" webhook) says how the interruption went and which volumes were
// released. It reports whether the current window has been summarized (by this call or an
// earlier one).
func (e *Executor) Summarize(ctx context.Context, now time.Time) bool {
	return e.summarize(ctx, now, false)
}

// SummarizeFinal is Summarize for an agent that stops: once the window has ended, the summary
// is given now, with the volumes still listed counted as still in use.
func (e *Executor) SummarizeFinal(ctx context.Context, now time.Time) bool {
	return e.summarize(ctx, now, true)
}

func (e *Executor) summarize(ctx context.Context, now time.Time, final bool) bool {
	e.mu.Lock()
	h := e.drain
	if !h.window.HasDeadline() || now.Before(h.window.End()) {
		e.mu.Unlock()
		return false
	}
	if h.summarized {
		e.mu.Unlock()
		return true
	}
	rule := h.window.VolumeRelease > h.window.SafetyMargin
	if !final && !volumeCountDue(h.window, volumesPending(h.podVolumes, h.volumes, rule), now) {
		e.mu.Unlock()
		return false
	}
	h.summarized = true
	// The count's moment: a release seen after the deadline came too late for the machine.
	at := now
	if at.After(h.window.Deadline) {
		at = h.window.Deadline
	}
	// The workers keep adding to h.acted: take a copy while the lock is held.
	actedKeys := slices.Collect(maps.Keys(h.acted))
	acted := len(actedKeys)
	atRisk := maps.Clone(h.atRisk)
	released, held := volumeSummary(h.volumes, at)
	podLines, podHeld := podVolumeSummary(h.podVolumes, h.volumes, h.window, at)
	countReleased, countHeld := volumesToCount(h.podVolumes, h.volumes, at, rule)
	view := e.view
	e.mu.Unlock()

	pods, err := e.o.Pods.List(labels.Everything())
	if err != nil {
		return true
	}
	there := e.livePods(ctx)
	var missed []*v1.Pod
	for _, p := range pods {
		if pl := plan.PlanPod(p, view.Taints, h.window, e.o.Filter, e.o.ComparisonOperators); pl.Skip == plan.SkipNone && !pl.Unbound && there(p) {
			missed = append(missed, p)
		}
	}
	inTime := 0
	for _, key := range actedKeys {
		if atRisk[key] {
			continue // gone, but its volume perhaps not released: never counted as handled
		}
		if ns, name, err := cache.SplitMetaNamespaceKey(key); err == nil {
			if p, err := e.o.Pods.Pods(ns).Get(name); err != nil || !there(p) {
				inTime++
			}
		}
	}
	logger := klog.FromContext(ctx)
	end := h.window.End().UTC().Format(time.RFC3339)
	logger.Info("Interruption window ended", "evicted", acted, "goneInTime", inTime, "stillPresent", len(missed), "windowEnd", end)
	typ := v1.EventTypeNormal
	if len(missed) > 0 || len(atRisk) > 0 {
		typ = v1.EventTypeWarning
	}
	summary := fmt.Sprintf("Interruption handled: %d pods evicted, %d gone before %s (deadline %s less %s margin), %d still present",
		acted, inTime, end, h.window.Deadline.UTC().Format(time.RFC3339), h.window.SafetyMargin, len(missed))
	if len(atRisk) > 0 {
		summary += fmt.Sprintf(", %d with a volume at risk (not gone %s before the deadline: %s)", len(atRisk), h.window.VolumeRelease,
			strings.Join(slices.Sorted(maps.Keys(atRisk)), ", "))
	}
	if released+len(held) > 0 {
		summary += fmt.Sprintf("; volumes in use during the window: %d released (gone from the node's volumesInUse) by %s", released, at.UTC().Format(time.RFC3339))
		if len(held) > 0 {
			typ = v1.EventTypeWarning
			summary += fmt.Sprintf(", %d still in use (their detach may wait six minutes): %s", len(held), strings.Join(held, ", "))
		}
	}
	if len(podLines) > 0 {
		if podHeld {
			typ = v1.EventTypeWarning
		}
		shown := podLines[:min(len(podLines), maxPodVolumeLines)]
		summary += "; per pod: " + strings.Join(shown, "; ")
		if more := len(podLines) - len(shown); more > 0 {
			summary += fmt.Sprintf("; and %d more pods (the agent's log)", more)
		}
		for _, l := range podLines {
			logger.Info("A pod's volumes at the end of the interruption window", "volumes", l, "windowEnd", end)
		}
	}
	e.o.Recorder.Eventf(events.NodeRef(e.o.NodeName), typ, events.ReasonInterruptionHandled, "%s", summary)
	msg := notify.Message{Kind: notify.KindHandled, Node: e.o.NodeName, Deadline: h.window.Deadline,
		Pods: acted, PodsInTime: inTime, PodsMissed: len(missed), Text: fmt.Sprintf("Node %s: %s", e.o.NodeName, summary)}
	if n := h.notice; n != nil {
		msg.Provider, msg.NoticeKind, msg.NoticeID, msg.Action, msg.NoticeTime = n.Provider, string(n.Kind), n.ID, n.Action, n.NoticeTime
	}
	e.o.Notifier.Notify(msg)
	if e.o.DryRun {
		return true
	}
	e.o.Metrics.MissedDeadlineTotal.Add(float64(len(missed)))
	e.o.Metrics.WindowVolumes.WithLabelValues(metrics.VolumeReleased).Add(float64(countReleased))
	e.o.Metrics.WindowVolumes.WithLabelValues(metrics.VolumeStillInUse).Add(float64(countHeld))
	for _, p := range missed {
		logger.Error(nil, "Pod still present at the end of the interruption window", "pod", klog.KObj(p), "windowEnd", end)
		e.o.Recorder.Eventf(p, v1.EventTypeWarning, events.ReasonMissedDeadline, "Still present at %s, %s before the reclaim deadline", end, h.window.SafetyMargin)
	}
	return true
}

// livePageSize is how many pods one page of livePods' list holds.
const livePageSize = 16

// livePods returns a test of whether a pod the cache holds is really still on the node, from one
// live list of the node's pods: after an API server outage the informers' reflectors back off
// for up to 30 s and the cache lags, and a pod wrongly counted as missed pages someone. It is
// the list the agent's role already grants (the same field selector as its informer), once per
// interruption. When the server cannot answer, the cache's answer stands.
func (e *Executor) livePods(ctx context.Context) func(*v1.Pod) bool {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// Page by page: a tenant's pods may be 1.5 MiB each (the API server's object limit), and a
	// whole list of them decoded at once took the agent past its memory limit (issue 39 item 3).
	opts := metav1.ListOptions{FieldSelector: "spec.nodeName=" + e.o.NodeName + ",status.phase!=Succeeded,status.phase!=Failed", Limit: livePageSize}
	live := map[types.UID]bool{}
	for {
		list, err := kube.ListPodMetadata(lctx, e.o.Client, metav1.NamespaceAll, opts)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Listing the node's pods to confirm the cache failed; trusting the cache", "node", e.o.NodeName)
			return func(*v1.Pod) bool { return true }
		}
		for i := range list.Items {
			live[list.Items[i].UID] = true
		}
		if list.Continue == "" {
			break
		}
		opts.Continue = list.Continue
	}
	return func(p *v1.Pod) bool { return live[p.UID] }
}

// Drained returns the notice of the current window when every pod reprieve evicts for it is
// gone, and the node no longer lists a volume of theirs in status.volumesInUse (until the
// window's end: volumesHoldDrain), and the cloud was not yet told so, with approved, which
// records that it was (for the current window only: a new window is approved on its own). ok is
// false otherwise.
func (e *Executor) Drained() (n providers.Notice, approved func(), ok bool) {
	now := e.o.Clock.Now()
	e.mu.Lock()
	h, view := e.drain, e.view
	done := h.approved || h.notice == nil
	pending := volumesPending(h.podVolumes, h.volumes, h.window.VolumeRelease > h.window.SafetyMargin)
	e.mu.Unlock()
	if done {
		return providers.Notice{}, nil, false
	}
	pods, err := e.o.Pods.List(labels.Everything())
	if err != nil {
		return providers.Notice{}, nil, false
	}
	for _, p := range pods {
		if pl := plan.PlanPod(p, view.Taints, view.Window, e.o.Filter, e.o.ComparisonOperators); pl.Skip == plan.SkipNone && !pl.Unbound {
			return providers.Notice{}, nil, false // still to go
		}
		if p.DeletionTimestamp != nil && e.o.Filter.Skip(p) == plan.SkipNone {
			// Still terminating, whatever its tolerations (reprieve may have just shortened
			// it to end by the window's end): the cloud's event, once approved, starts at
			// once and cuts the grace the pod was given (issue 38, case 4).
			return providers.Notice{}, nil, false
		}
	}
	if volumesHoldDrain(h.window, pending, now) {
		// The pods are gone, not yet their volumes: the kubelet publishes the release at its
		// next status update (issue 50, case 5).
		return providers.Notice{}, nil, false
	}
	return *h.notice, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		h.approved = true
	}, true
}

// why says what decides a pod's eviction time, for events and logs.
func why(p plan.Plan, w plan.Window) string {
	if p.ByDeadline {
		return fmt.Sprintf("the latest start that lets its %s grace end %s before the reclaim deadline %s",
			p.Grace, w.SafetyMargin, w.Deadline.UTC().Format(time.RFC3339))
	}
	if p.DueTaint == nil {
		return "due"
	}
	if p.DueTaint.TimeAdded != nil {
		if tol := p.Due.Sub(p.DueTaint.TimeAdded.Time); tol > 0 {
			return fmt.Sprintf("taint %s tolerated for %s", TaintString(*p.DueTaint), tol)
		}
	}
	return fmt.Sprintf("taint %s not tolerated", TaintString(*p.DueTaint))
}

// TaintString writes a taint as kubectl does: key[=value]:effect.
func TaintString(t v1.Taint) string {
	if t.Value == "" {
		return fmt.Sprintf("%s:%s", t.Key, t.Effect)
	}
	return fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect)
}

// current reports whether st still belongs to the current drain and view is still the view:
// a request that waited for its turn is sent only under the plan it was made with.
func (e *Executor) current(st *podState, view View) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return st.drain == e.drain && e.view.equal(view)
}
