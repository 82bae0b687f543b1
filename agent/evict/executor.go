// Package evict carries out the pods' evictions: one executor that both the interruption and the
// pressure loops use (the Eviction API with a UID precondition, backoff on a budget's refusal,
// the force point, a grace capped by the window), and one drain per notice window holding the
// per-pod state, which a new window starts afresh.
package evict

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

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
	Client   kubernetes.Interface
	Pods     corelisters.PodLister
	Clock    clock.WithTicker
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
}

// Executor carries out every eviction. Its view and drain are guarded by mu; each pod's state
// belongs to the worker syncing it (the workqueue hands a key to one worker at a time), apart
// from the fields a new drain carries over, which are written under mu (see drain).
type Executor struct {
	o       Options
	evictFn func(context.Context, *policyv1.Eviction) error
	queue   workqueue.TypedDelayingInterface[string]

	mu    sync.Mutex
	view  View
	drain *drain // the current window's; never nil
}

// New returns an executor with no deadline and no taints.
func New(o Options) *Executor {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	e := &Executor{o: o, evictFn: o.Evict,
		queue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Clock: o.Clock}),
		view:  View{Window: plan.Window{SafetyMargin: o.SafetyMargin}},
		drain: newDrain(plan.Window{SafetyMargin: o.SafetyMargin}, nil)}
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
		e.closeDrain(old)
		e.drain = newDrain(v.Window, v.Notice)
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

// EnqueueAll queues every pod of the node.
func (e *Executor) EnqueueAll() {
	pods, err := e.o.Pods.List(labels.Everything())
	if err != nil {
		return
	}
	for _, p := range pods {
		e.Enqueue(p)
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
}

// SyncPod does what is due for one pod now and returns when to look at it again (0: only on the
// next change). The workers call it; tests call it directly.
func (e *Executor) SyncPod(ctx context.Context, key string) time.Duration { return e.syncPod(ctx, key) }

// Evict asks the Eviction API to evict pod with grace (see evict): the pressure loop's evictions
// go through the same request as the interruption's.
func (e *Executor) Evict(ctx context.Context, pod *v1.Pod, grace time.Duration) error {
	return e.evict(ctx, pod, grace)
}

// Delete deletes pod with grace and a UID precondition; on a terminating pod it can only
// shorten the grace.
func (e *Executor) Delete(ctx context.Context, pod *v1.Pod, grace time.Duration) error {
	return e.deletePod(ctx, pod, grace)
}

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
