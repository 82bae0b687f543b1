// Package podnotice is the pods' early warning (--pod-notice): the reprieve.io/Interruption
// condition and the evict-at and reclaim-deadline annotations on each pod a notice concerns,
// written by its own workers (Notifier), and the node-local notice endpoint that answers a pod
// about itself without API credentials (--notice-bind-address, Endpoint).
package podnotice

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/evict"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/providers"
)

// Bounds of the warning writer. Each warning is one request; 16 in flight write 110 pods in
// about seven rounds of a local API server's latency, and leave the client's burst to the
// evictions. Failed writes back off as the eviction queue does, to 10 s at most, and are retried
// until they succeed or the pod is gone.
const (
	podNoticeWorkers     = 16
	podNoticeBackoffBase = 100 * time.Millisecond
	podNoticeBackoffMax  = 10 * time.Second
)

// Warning is what one pod should carry. Its fields are all comparable, so that an unchanged
// re-plan is recognised and not written again; it holds no relative times for that reason.
type Warning struct {
	Active   bool
	Reason   string
	Message  string
	EvictAt  time.Time // zero when the pod is not evicted (it tolerates the interruption forever)
	Deadline time.Time
}

// wanted is a warning for one pod, identified by its UID: a pod recreated under the same name
// is warned only by its own plan.
type wanted struct {
	uid  types.UID
	warn Warning
}

// Notifier writes the warnings. The eviction loop only records what each pod should carry
// (set, which never waits on the API server); its own workers write it. Many producers, one
// owner of the writes: the workqueue hands a key to one worker at a time and coalesces
// repeated re-plans of a pod into one write of the latest.
type Notifier struct {
	client kube.Interface
	pods   corelisters.PodLister
	clock  clock.Clock
	dryRun bool
	// write is false when only the notice endpoint is on (--pod-notice=false): the warnings
	// are then computed for it and never written.
	write bool
	// Wrote, when set, is told each patch's result: "written" or "failed".
	Wrote func(result string)
	// Turn, when set, waits until a warning may be written (evict.Executor.Background): the
	// warnings go only when no eviction waits for the API server, and pause with the
	// evictions when the server throttles the agent. done takes the write's result.
	Turn  func(ctx context.Context) (done func(error), err error)
	queue workqueue.TypedRateLimitingInterface[string]

	mu sync.Mutex
	// want holds the active warnings by namespace/name; a pod without an entry should carry
	// none. written holds what the last successful write put on a pod, so that a re-plan that
	// changes nothing sends nothing even before the informer shows the write. Both hold only
	// pods a notice concerned, and lose them when the pod is gone (podDeleted).
	want, written map[string]wanted
	// changed is closed, and replaced, whenever a wanted warning changes (the endpoint's
	// hanging GETs wait on it).
	changed chan struct{}
}

// New returns the warning writer the configuration asks for: nil when neither
// --pod-notice nor --notice-bind-address is on.
func New(cfg config.Config, client kube.Interface, pods corelisters.PodLister, clk clock.WithTicker) *Notifier {
	if !cfg.PodNotice && cfg.NoticeBindAddress == "" {
		return nil
	}
	return &Notifier{
		client: client, pods: pods, clock: clk, dryRun: cfg.DryRun, write: cfg.PodNotice, changed: make(chan struct{}),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](podNoticeBackoffBase, podNoticeBackoffMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Clock: clk}),
		want:    map[string]wanted{},
		written: map[string]wanted{},
	}
}

// Warn records what pod should carry under its plan and the window (evict.Warner); the
// eviction executor calls it for every pod it plans. It returns at once.
func (n *Notifier) Warn(pod *v1.Pod, pl plan.Plan, w plan.Window, notice *providers.Notice) {
	n.set(pod, WarningFor(pl, w, notice))
}

// WarningFor is the warning a pod planned as plan should carry: pods reprieve will evict, and
// pods that tolerate the interruption forever (they stay and die with the machine, which is
// what their owner most needs to know). Pods reprieve leaves alone for other reasons (DaemonSet
// and mirror pods, finished pods, its own) carry none: they are the node's, not a workload's.
func WarningFor(pl plan.Plan, w plan.Window, n *providers.Notice) Warning {
	if !w.HasDeadline() || (pl.Skip != plan.SkipNone && pl.Skip != plan.SkipTolerateForever) {
		return Warning{}
	}
	reason, what := events.ReasonSpotInterruption, "an interruption notice"
	if n != nil {
		reason, what = events.NoticeReason(n.Kind), fmt.Sprintf("a %s %s notice", n.Provider, n.Kind)
	}
	deadline := w.Deadline.UTC().Format(time.RFC3339)
	pw := Warning{Active: true, Reason: reason, Deadline: w.Deadline}
	if pl.Skip == plan.SkipTolerateForever {
		pw.Message = fmt.Sprintf("Not evicted: the pod tolerates the interruption taint forever and stops when the machine is reclaimed at %s (%s)",
			deadline, what)
		return pw
	}
	pw.EvictAt = pl.EvictAt
	pw.Message = fmt.Sprintf("Eviction planned at %s with grace %s; the machine is reclaimed at %s (%s)",
		pl.EvictAt.UTC().Format(time.RFC3339), pl.Grace, deadline, what)
	return pw
}

// set records what pod should carry and queues a write unless the pod Carries it already or
// the last write put it there.
func (n *Notifier) set(pod *v1.Pod, pw Warning) {
	key := pod.Namespace + "/" + pod.Name
	n.mu.Lock()
	old, had := n.want[key]
	if pw.Active {
		n.want[key] = wanted{uid: pod.UID, warn: pw}
	} else {
		delete(n.want, key)
	}
	if had != pw.Active || (had && (old.uid != pod.UID || old.warn != pw)) {
		close(n.changed)
		n.changed = make(chan struct{})
	}
	last, wrote := n.written[key]
	n.mu.Unlock()
	if !n.write {
		return
	}
	if wrote && last.uid == pod.UID && last.warn == pw {
		return
	}
	if !wrote && Carries(pod, pw) {
		// Already there: written by this agent before a restart, or nothing to withdraw.
		return
	}
	n.queue.Add(key)
}

// run writes the queued warnings with podNoticeWorkers workers until ctx ends.
func (n *Notifier) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for range podNoticeWorkers {
		wg.Go(func() {
			for n.Next(ctx) {
			}
		})
	}
	<-ctx.Done()
	n.queue.ShutDown()
	wg.Wait()
}

// next writes one queued pod's warning; false once the queue is shut down.
func (n *Notifier) Next(ctx context.Context) bool {
	key, shutdown := n.queue.Get()
	if shutdown {
		return false
	}
	defer n.queue.Done(key)
	if err := n.Sync(ctx, key); err != nil {
		// Never dropped: a warning that could not be written is retried with backoff until it
		// is written, superseded or the pod is gone.
		klog.FromContext(ctx).Error(err, "Writing the pod's interruption warning failed; retrying", "pod", key)
		n.queue.AddRateLimited(key)
		return true
	}
	n.queue.Forget(key)
	return true
}

// sync brings one pod to its wanted warning with one patch of its status subresource.
func (n *Notifier) Sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := n.pods.Pods(ns).Get(name)
	if err != nil {
		n.forget(key)
		return nil
	}
	n.mu.Lock()
	w, ok := n.want[key]
	last, wrote := n.written[key]
	n.mu.Unlock()
	var pw Warning
	if ok {
		if w.uid != pod.UID {
			// Wanted for a predecessor of the same name; this pod is planned on its own.
			return nil
		}
		pw = w.warn
	}
	if (wrote && last.uid == pod.UID && last.warn == pw) || (!wrote && Carries(pod, pw)) {
		return nil
	}
	if n.dryRun {
		klog.FromContext(ctx).Info("Dry run: would write the pod's interruption warning", "pod", klog.KObj(pod), "active", pw.Active, "message", pw.Message)
		n.record(key, pod.UID, pw)
		return nil
	}
	patch, err := WarningPatch(pod, pw, n.clock.Now())
	if err != nil {
		return err
	}
	if n.Turn != nil {
		done, terr := n.Turn(ctx)
		if terr != nil {
			return fmt.Errorf("waiting to write the interruption warning of pod %s: %w", key, terr)
		}
		// err is the patch's result below (the function's own variable, not a shadow).
		defer func() { done(err) }()
	}
	rctx, cancel := context.WithTimeout(ctx, evict.RequestTimeout)
	defer cancel()
	_, err = n.client.CoreV1().Pods(ns).Patch(rctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	switch {
	case err == nil:
		n.record(key, pod.UID, pw)
		n.count("written")
		return nil
	case apierrors.IsNotFound(err) || apierrors.IsInvalid(err):
		// Gone, or replaced under the same name (the UID in the patch is immutable): the
		// successor is planned on its own.
		n.forget(key)
		return nil
	}
	n.count("failed")
	return fmt.Errorf("patching the interruption warning of pod %s: %w", key, err)
}

func (n *Notifier) count(result string) {
	if n.Wrote != nil {
		n.Wrote(result)
	}
}

// record remembers a successful write, a withdrawal too: until the informer shows it, the
// cached pod still Carries the warning and would look as if it needed a second one.
func (n *Notifier) record(key string, uid types.UID, pw Warning) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.written[key] = wanted{uid: uid, warn: pw}
}

func (n *Notifier) forget(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	// Wake the hanging GETs: one about this pod answers its end now, not its last warning at
	// its timeout.
	close(n.changed)
	n.changed = make(chan struct{})
	delete(n.want, key)
	delete(n.written, key)
}

// podDeleted lets the notifier forget a pod that is gone (an informer delete handler).
func (n *Notifier) PodDeleted(obj any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		n.forget(key)
	}
}

// Carries reports whether pod already shows pw: for an active warning, the annotations and a
// True condition with the same reason and message; for none, no annotation and no True
// condition.
func Carries(pod *v1.Pod, pw Warning) bool {
	cond := InterruptionCondition(pod)
	if !pw.Active {
		_, a := pod.Annotations[record.AnnotationEvictAt]
		_, d := pod.Annotations[record.AnnotationReclaimDeadline]
		return !a && !d && (cond == nil || cond.Status != v1.ConditionTrue)
	}
	evictAt, ok := pod.Annotations[record.AnnotationEvictAt]
	if pw.EvictAt.IsZero() {
		if ok {
			return false
		}
	} else if evictAt != rfc3339(pw.EvictAt) {
		return false
	}
	return pod.Annotations[record.AnnotationReclaimDeadline] == rfc3339(pw.Deadline) &&
		cond != nil && cond.Status == v1.ConditionTrue && cond.Reason == pw.Reason && cond.Message == pw.Message
}

func InterruptionCondition(pod *v1.Pod) *v1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == record.PodConditionInterruption {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// WarningPatch is the strategic merge patch of pod's status subresource that makes it carry pw.
// One request writes the condition and the annotations together: the pods/status subresource
// keeps every metadata change but owner references (podStatusStrategy.PrepareForUpdate in
// pkg/registry/core/pod/strategy.go), so the agent needs no permission to update pods
// themselves, and a job never sees the condition without the annotations. The UID makes the
// patch fail on a pod recreated under the same name, as markDisruptionTarget's does.
func WarningPatch(pod *v1.Pod, pw Warning, now time.Time) ([]byte, error) {
	cond := v1.PodCondition{Type: record.PodConditionInterruption, Status: v1.ConditionFalse, Reason: events.ReasonNoticeWithdrawn,
		Message: "The interruption notice was withdrawn: no eviction is planned"}
	annotations := map[string]any{record.AnnotationEvictAt: nil, record.AnnotationReclaimDeadline: nil}
	if pw.Active {
		cond.Status, cond.Reason, cond.Message = v1.ConditionTrue, pw.Reason, pw.Message
		annotations[record.AnnotationReclaimDeadline] = rfc3339(pw.Deadline)
		if !pw.EvictAt.IsZero() {
			annotations[record.AnnotationEvictAt] = rfc3339(pw.EvictAt)
		}
	}
	// The transition time moves only when the status does: a re-plan keeps the time the
	// warning first appeared.
	cond.LastTransitionTime = metav1.NewTime(now)
	if old := InterruptionCondition(pod); old != nil && old.Status == cond.Status {
		cond.LastTransitionTime = old.LastTransitionTime
	}
	b, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID, "annotations": annotations},
		"status":   map[string]any{"conditions": []v1.PodCondition{cond}},
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the interruption warning of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return b, nil
}

// Writes says whether the notifier writes the warnings on the pods (--pod-notice); without it
// only the notice endpoint answers from them.
func (n *Notifier) Writes() bool { return n.write }

// Pending is how many pods' writes are queued; Requeues how often the write of the pod at key
// (namespace/name) was put back after a failure; ShuttingDown whether the queue was shut down
// (Run returned). For the agent's tests, which drive the writes one at a time (Next, Sync).
func (n *Notifier) Pending() int { return n.queue.Len() }

// Requeues: see Pending.
func (n *Notifier) Requeues(key string) int { return n.queue.NumRequeues(key) }

// ShuttingDown: see Pending.
func (n *Notifier) ShuttingDown() bool { return n.queue.ShuttingDown() }
