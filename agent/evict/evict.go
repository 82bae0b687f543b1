package evict

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/metrics"

	"github.com/reprieve-dev/reprieve/agent/plan"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// minKill is the least time a pod takes to stop once its grace starts: the kubelet's floor,
// which is the least grace reprieve asks for (plan.MinGrace).
const minKill = plan.MinGrace

// RequestTimeout bounds one eviction or delete request, so that a hanging API server holds a
// worker for seconds, not for the whole window.
const RequestTimeout = 5 * time.Second

// RemeasureLead is how long before its send a deadline-bound pod's wait ends once, so that its
// send time is set again with the queueing margin of that moment, not of the plan's: a wait
// set at the notice lasts tens of seconds, over which the margin can grow by more than the
// 250 ms of slack that EvictionLead leaves a whole grace.
const RemeasureLead = time.Second

// Backoff for evictions that a PodDisruptionBudget blocks (429) or that fail, as karpenter's
// eviction queue does: 100 ms doubling to 10 s, never past the point where the deadline forces
// a delete.
const (
	evictionBackoffBase = 100 * time.Millisecond
	EvictionBackoffMax  = 10 * time.Second
	FailureBackoffMax   = time.Second
	// deleteBackoffMax caps the retries of a delete past the latest eviction time: every
	// moment lost there comes off the pod's grace, but a dead API server must not get ten
	// requests a second per pod (nor the log ten errors).
	deleteBackoffMax = 500 * time.Millisecond
)

// podState is what the eviction loop remembers about one pod during one drain (see drain).
type podState struct {
	key       podKey
	uid       types.UID
	drain     *drain // the drain this state belongs to
	attempts  int
	nextTry   time.Time
	done      bool          // an eviction or delete was accepted (or, in a dry run, logged)
	lastGrace time.Duration // the last grace reprieve asked for; later deletes only shorten
	// shortenedTo is the end the last shortening asked for (request time + allowance + grace):
	// the API server stores deletionTimestamp in whole seconds on its own clock, so a pod is
	// shortened again only when that moves its end at least a second earlier.
	shortenedTo time.Time
	// throttled counts the requests the server had no seat for (isThrottled, waitedTooLong):
	// they refused nothing about the pod, so they neither back it off nor force its delete.
	throttled int
	logged    plan.SkipReason
	announced time.Time // the eviction time last announced in an EvictionScheduled event
	blocked   bool      // the last eviction request was refused by a PodDisruptionBudget
	// deleteFailures counts the deletes that failed in a row, for their backoff.
	deleteFailures int
	// marked is set once DisruptionTarget was patched onto the pod (markDisruptionTarget).
	marked bool
	// atRisk is set once the pod's volume was reported at risk (volumeAtRisk).
	atRisk bool
	// pending is the pod's request waiting in the gate (nil: none); sending is set while a
	// granted request is out; dirty asks its answer to look at the pod again (a change came
	// meanwhile).
	pending        *waiter
	sending, dirty bool
}

// The actuator: it carries out decide's actions (decide.go) and owns every pod's state, under
// Executor.mu. A worker looks at one pod (the workqueue never hands one key to two workers at
// once), decides, and hands a request to the gate without waiting for it: the gate calls back
// when the request may go, and a goroutine of its own sends it and looks at the pod again
// afterwards. A pod whose request waits in the gate holds no worker, so that the gate orders
// every waiting pod by urgency, whenever it became due (docs/design.md, "The executor").

func (e *Executor) worker(ctx context.Context) {
	for {
		key, shutdown := e.queue.Get()
		if shutdown {
			return
		}
		after := e.sync(ctx, key, true)
		e.queue.Done(key)
		if after > 0 {
			e.queue.AddAfter(key, after)
		}
	}
}

// syncPod does what is due for one pod now, waiting for the gate, and returns when to look at
// it again (0: only on the next change).
func (e *Executor) syncPod(ctx context.Context, key string) time.Duration {
	return e.sync(ctx, key, false)
}

// facts is decide's view of st. Called with e.mu held.
func (st *podState) facts() podFacts {
	return podFacts{done: st.done, attempts: st.attempts, nextTry: st.nextTry, announced: st.announced, logged: st.logged,
		shortenedTo: st.shortenedTo, throttled: st.throttled, deleteFailures: st.deleteFailures, atRisk: st.atRisk, marked: st.marked}
}

// update changes st under e.mu.
func (e *Executor) update(st *podState, f func(st *podState)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f(st)
}

// sync looks at one pod: it decides, and carries the action out. With async (the workers), a
// request goes to the gate and sync returns at once; without (SyncPod), it waits for its turn
// and its answer.
func (e *Executor) sync(ctx context.Context, key string, async bool) time.Duration {
	logger := klog.FromContext(ctx)
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0
	}
	pod, err := e.o.Pods.Pods(ns).Get(name)
	if err != nil {
		e.forget(key)
		return 0
	}
	st, view := e.stateFor(key, pod.UID)
	if async && !e.takeTurn(st) {
		return 0 // its request is on its way; its answer looks at the pod again
	}
	e.mu.Lock()
	facts := st.facts()
	e.mu.Unlock()
	now := e.o.Clock.Now()
	a := decide(decision{pod: pod, facts: facts, view: view, filter: e.o.Filter, cmpOps: e.o.ComparisonOperators,
		margin: e.gate.sendMargin(), now: now, minKill: minKill})
	if a.warn {
		e.warn(pod, a.pl, view.Window)
	}
	if a.volumeAtRisk {
		e.volumeAtRisk(ctx, key, pod, st, a)
	}
	if view.Window.HasDeadline() && (a.pl.Volume || pod.DeletionTimestamp != nil && view.Window.VolumeRelease > view.Window.SafetyMargin &&
		e.o.Filter.Skip(pod) == plan.SkipNone && plan.Attaches(pod)) {
		// A pod whose volume must be released before the machine goes (one already leaving
		// too): which of the node's volumes are its, for the window's summary.
		e.notePodVolumes(ctx, key, pod)
	}
	switch a.kind {
	case actNone:
		if a.unblock {
			e.setBlocked(st, false)
		}
		if a.logSkip {
			e.update(st, func(st *podState) { st.logged = a.skip })
			logger.Info("Leaving pod alone", "pod", klog.KObj(pod), "reason", a.skip, "deadline", a.w.Deadline)
		}
		return 0
	case actWait:
		if a.announce {
			e.update(st, func(st *podState) { st.announced = a.pl.EvictAt })
			e.podEvent(pod, v1.EventTypeNormal, events.ReasonEvictionScheduled, "Eviction planned at %s (in %s) with grace %s: %s",
				a.pl.EvictAt.UTC().Format(time.RFC3339), a.pl.EvictAt.Sub(now).Round(time.Second), a.pl.Grace, why(a.pl, a.w))
		}
		return a.at.Sub(now)
	}
	return e.request(ctx, key, pod, st, view, a, async)
}

// volumeAtRisk reports, once per pod and window, a pod whose volume cannot be released before
// the machine goes (decide's volumeAtRisk): an event on the pod, the metric, and the window's
// summary, which never counts it as handled.
func (e *Executor) volumeAtRisk(ctx context.Context, key string, pod *v1.Pod, st *podState, a action) {
	e.mu.Lock()
	st.atRisk = true
	if st.drain != nil {
		st.drain.atRisk[key] = true
	}
	e.mu.Unlock()
	release := a.w.Deadline.Add(-a.w.VolumeRelease)
	klog.FromContext(ctx).Info("A volume of the pod may not be released before the machine goes", "pod", klog.KObj(pod),
		"latest", a.pl.Latest, "releaseBy", release, "grace", a.pl.Grace)
	if !e.o.DryRun {
		e.o.Metrics.VolumeAtRiskTotal.Inc()
	}
	e.podEvent(pod, v1.EventTypeWarning, events.ReasonVolumeAtRisk,
		"A volume that needs attaching must be released by %s (%s before the reclaim deadline %s) for its detach not to wait six minutes; not evicted yet, the pod can no longer end before then",
		release.UTC().Format(time.RFC3339), a.w.VolumeRelease, a.w.Deadline.UTC().Format(time.RFC3339))
}

// takeTurn withdraws st's request from the gate when it is still waiting there (the pod is
// decided afresh), and reports false when its request was already granted: the answer looks
// at the pod again (dirty).
func (e *Executor) takeTurn(st *podState) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if st.sending {
		st.dirty = true
		return false
	}
	if w := st.pending; w != nil {
		if !e.gate.withdraw(w) {
			st.dirty = true
			return false
		}
		e.dropWaiter(st, w)
	}
	return true
}

// dropWaiter forgets w, withdrawn from the gate. Called with e.mu held.
func (e *Executor) dropWaiter(st *podState, w *waiter) {
	if st.pending == w {
		st.pending = nil
	}
	if _, ok := e.waiters[w]; ok {
		delete(e.waiters, w)
		e.sends.Done()
	}
}

// withdrawAll withdraws from the gate every request that still waits for its turn for a pod
// of d (every drain's when d is nil). Called with e.mu held.
func (e *Executor) withdrawAll(d *drain) {
	for w, st := range e.waiters {
		if (d == nil || st.drain == d) && e.gate.withdraw(w) {
			e.dropWaiter(st, w)
		}
	}
}

// request hands a's request to the gate; when it may go, send carries it out.
func (e *Executor) request(ctx context.Context, key string, pod *v1.Pod, st *podState, view View, a action, async bool) time.Duration {
	if !async {
		t, err := e.gate.acquire(ctx, a.gate.key, a.gate.mustGo, a.gate.lastChance, false)
		if err != nil {
			return 0 // stopping
		}
		return e.send(ctx, key, pod, st, view, a, t, false)
	}
	w := &waiter{key: a.gate.key, mustGo: a.gate.mustGo, lastChance: a.gate.lastChance}
	w.grant = func(t *ticket) {
		go func() {
			defer e.sends.Done()
			e.mu.Lock()
			delete(e.waiters, w)
			if st.pending == w {
				st.pending = nil
			}
			st.sending = true
			e.mu.Unlock()
			after := e.send(ctx, key, pod, st, view, a, t, true)
			e.mu.Lock()
			st.sending = false
			dirty := st.dirty
			st.dirty = false
			e.mu.Unlock()
			switch {
			case dirty:
				e.queue.Add(key)
			case after > 0:
				e.queue.AddAfter(key, after)
			}
		}()
	}
	e.mu.Lock()
	e.sends.Add(1)
	e.waiters[w] = st
	st.pending = w
	e.mu.Unlock()
	e.gate.submit(w)
	return 0
}

// send carries out a's request with the slot t. It returns when to look at the pod again.
func (e *Executor) send(ctx context.Context, key string, pod *v1.Pod, st *podState, view View, a action, t *ticket, async bool) time.Duration {
	if !e.current(st, view) {
		// The window or the taints changed while it waited: the new view re-plans the pod.
		t.done(errNotSent)
		return time.Nanosecond
	}
	now := e.o.Clock.Now()
	e.mu.Lock()
	f := st.facts()
	e.mu.Unlock()
	// The margin the server's queue takes now: it may have grown while the request waited.
	queue := e.gate.sendMargin()
	if k := atGrant(a, f, queue, now); k != a.kind {
		// Its force point came while it waited for its turn: the DELETE takes its own turn.
		t.done(errNotSent)
		a.kind = k
		return e.request(ctx, key, pod, st, view, a, async)
	}
	switch a.kind {
	case actShorten:
		return e.sendShorten(ctx, key, pod, st, a, t)
	case actForce:
		return e.sendForce(ctx, key, pod, st, view, a, t)
	case actMark:
		return e.sendMark(ctx, pod, st, a, t)
	}
	// And it leaves the request that margin.
	s := sendGrace(actEvict, a, time.Time{}, now, queue)
	pl, w := a.pl, a.w
	klog.FromContext(ctx).Info("Evicting pod", "pod", klog.KObj(pod), "grace", s.grace, "podGrace", pl.Grace,
		"planned", pl.EvictAt, "due", pl.Due, "latest", pl.Latest, "byDeadline", pl.ByDeadline, "queueMargin", queue, "attempt", f.attempts+f.throttled+1)
	err := e.evict(ctx, pod, s.grace, s.bound)
	t.done(gateResult(err, s.bound))
	// The answer is judged against the force point of its moment, with the margin it measured.
	a = a.atMargin(e.gate.sendMargin())
	r := outcome(actEvict, a, err, f, e.o.Clock.Now(), e.gate.pauseLeft())
	logger := klog.FromContext(ctx)
	switch r.kind {
	case resDone:
		e.recordSent(st, true, s.grace, s.end)
		e.setBlocked(st, false)
		e.markActed(key)
		e.observeLateness(ctx, pod, pl, view, now, s.grace, f.attempts+f.throttled)
		e.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultEvicted).Inc()
		e.podEvent(pod, v1.EventTypeNormal, events.ReasonEvicted, "Evicted with grace %s (planned %s: %s)",
			s.grace, pl.EvictAt.UTC().Format(time.RFC3339), why(pl, w))
		if s.grace < pl.Grace {
			e.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultGraceShortened).Inc()
			e.podEvent(pod, v1.EventTypeWarning, events.ReasonGraceShortened, "Grace shortened from %s to %s to end %s before the reclaim deadline %s",
				pl.Grace, s.grace, w.SafetyMargin, w.Deadline.UTC().Format(time.RFC3339))
		}
		return 0
	case resGone:
		// Gone already, or a new pod of the same name (the UID precondition failed): done.
		e.gone(st)
		return 0
	case resNoSeat:
		e.update(st, func(st *podState) { st.throttled++ })
		e.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultFailed).Inc()
		logger.V(2).Info("The API server had no seat for the eviction; sending it again", "pod", klog.KObj(pod), "throttled", f.throttled+1, "err", err.Error())
		return r.retry
	case resStale:
		return r.retry
	}
	attempts := f.attempts + 1
	e.update(st, func(st *podState) { st.attempts++ })
	if r.kind == resRefused {
		e.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultPDBBlocked).Inc()
		logger.Info("Eviction blocked by a PodDisruptionBudget; retrying", "pod", klog.KObj(pod), "attempt", attempts, "forceAt", pl.Latest, "err", err.Error())
		e.mu.Lock()
		wasBlocked := st.blocked
		e.mu.Unlock()
		if !wasBlocked {
			then := "retrying with backoff"
			if w.HasDeadline() {
				then = fmt.Sprintf("retrying until %s, then deleting: the reclaim deadline %s leaves no later time",
					pl.Latest.UTC().Format(time.RFC3339), w.Deadline.UTC().Format(time.RFC3339))
			}
			e.podEvent(pod, v1.EventTypeWarning, events.ReasonEvictionBlocked, "Eviction refused by a PodDisruptionBudget; %s", then)
		}
		e.setBlocked(st, true)
	} else {
		e.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultFailed).Inc()
		logger.Error(err, "Evicting pod failed; retrying", "pod", klog.KObj(pod), "attempt", attempts)
	}
	if r.force {
		a.kind = actForce
		return e.request(ctx, key, pod, st, view, a, async)
	}
	e.update(st, func(st *podState) { st.nextTry = r.nextTry })
	return r.retry
}

// sendForce deletes a pod whose eviction could not happen in time (a PodDisruptionBudget kept
// refusing, or the API failed) once the deadline leaves no more room, as karpenter's eviction
// queue does once now > deadline - grace.
func (e *Executor) sendForce(ctx context.Context, key string, pod *v1.Pod, st *podState, view View, a action, t *ticket) time.Duration {
	logger := klog.FromContext(ctx)
	_, _ = e.markDisruptionTarget(ctx, pod, st, a.w, a.pl.Tail)
	e.mu.Lock()
	f := st.facts()
	e.mu.Unlock()
	// From the clock now, not from before the eviction that failed: that request may have
	// hung for seconds, and a grace computed before it would end the pod past the window.
	now := e.o.Clock.Now()
	queue := e.gate.sendMargin()
	s := sendGrace(actForce, a, time.Time{}, now, queue)
	// With the queueing margin the grace was cut by, as "Evicting pod" logs it: what the
	// end-to-end tests check the grace against (test/e2e/sends_test.go).
	logger.Info("Deleting pod: the reclaim deadline leaves no time for a blocked eviction", "pod", klog.KObj(pod), "grace", s.grace, "attempts", f.attempts, "queueMargin", queue)
	err := e.deletePod(ctx, pod, s.grace, s.bound)
	t.done(gateResult(err, s.bound))
	r := outcome(actForce, a, err, f, e.o.Clock.Now(), 0)
	switch r.kind {
	case resDone:
		e.recordSent(st, true, s.grace, s.end)
		e.mu.Lock()
		wasBlocked := st.blocked
		e.mu.Unlock()
		e.setBlocked(st, false)
		e.markActed(key)
		if !wasBlocked {
			// Forced because the API failed, not because a PDB refused: that is lateness.
			e.observeLateness(ctx, pod, a.pl, view, e.o.Clock.Now(), s.grace, f.attempts)
		}
		e.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultForcedDelete).Inc()
		e.podEvent(pod, v1.EventTypeWarning, events.ReasonForceDeleted, "Deleted with grace %s after %d refused evictions: the machine is reclaimed at %s",
			s.grace, f.attempts, a.pl.Latest.Add(a.pl.Grace).Add(e.o.SafetyMargin).UTC().Format(time.RFC3339))
		return 0
	case resGone:
		e.gone(st)
		return 0
	case resStale:
		return r.retry
	}
	e.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultFailed).Inc()
	logger.Error(err, "Deleting pod failed; retrying", "pod", klog.KObj(pod), "attempt", f.attempts+1)
	e.update(st, func(st *podState) { st.attempts++; st.deleteFailures++ })
	return r.retry
}

// sendMark sends the DisruptionTarget patch that precedes the force point's DELETE of a pod
// refused or failed before, a margin before the force point (decide's actMark), and returns the
// wait until the force point, when the DELETE leaves without a patch before it.
func (e *Executor) sendMark(ctx context.Context, pod *v1.Pod, st *podState, a action, t *ticket) time.Duration {
	_, err := e.markDisruptionTarget(ctx, pod, st, a.w, a.pl.Tail)
	t.done(err)
	return max(forcePoint(a.pl, e.gate.sendMargin()).Sub(e.o.Clock.Now()), time.Nanosecond)
}

// sendShorten brings a terminating pod's end forward: when its deletionTimestamp falls after
// the window's end (for example, kube-controller-manager deleted it with its full grace), a
// DELETE with the grace that is left.
func (e *Executor) sendShorten(ctx context.Context, key string, pod *v1.Pod, st *podState, a action, t *ticket) time.Duration {
	logger := klog.FromContext(ctx)
	w := a.w
	margin := e.gate.sendMargin()
	s := sendGrace(actShorten, a, pod.DeletionTimestamp.Time, e.o.Clock.Now(), margin)
	now := e.o.Clock.Now()
	if sent, _ := e.markDisruptionTarget(ctx, pod, st, w, a.pl.Tail); sent {
		// The patch took time: the grace counts from when the DELETE leaves.
		now = e.o.Clock.Now()
		s = sendGrace(actShorten, a, pod.DeletionTimestamp.Time, now, margin)
	}
	logger.Info("Shortening the grace of a terminating pod to meet the reclaim deadline", "pod", klog.KObj(pod),
		"deletionTimestamp", pod.DeletionTimestamp.Time, "grace", s.grace, "windowEnd", w.End())
	err := e.deletePod(ctx, pod, s.grace, s.bound)
	t.done(gateResult(err, s.bound))
	e.mu.Lock()
	f := st.facts()
	e.mu.Unlock()
	r := outcome(actShorten, a, err, f, e.o.Clock.Now(), 0)
	switch r.kind {
	case resDone:
		e.recordSent(st, false, s.grace, s.end)
		e.markActed(key)
		e.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultGraceShortened).Inc()
		e.podEvent(pod, v1.EventTypeWarning, events.ReasonGraceShortened, "Terminating pod would end at %s, after %s: grace shortened to %s",
			pod.DeletionTimestamp.UTC().Format(time.RFC3339), w.End().UTC().Format(time.RFC3339), s.grace)
		return 0
	case resGone, resStale:
		return r.retry
	}
	e.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultFailed).Inc()
	logger.Error(err, "Shortening grace failed; retrying", "pod", klog.KObj(pod))
	e.update(st, func(st *podState) { st.deleteFailures++ })
	return r.retry
}

// gone records a request answered 404 or 409: the pod is gone already, or a new pod holds its
// name (the UID precondition failed); nothing more to send.
func (e *Executor) gone(st *podState) {
	e.o.Metrics.EvictionRequestsTotal.WithLabelValues(metrics.ResultGone).Inc()
	e.setBlocked(st, false)
	e.recordSent(st, true, 0, time.Time{})
}

// forget drops what the loop remembers of a pod that is gone, its request waiting in the gate
// too.
func (e *Executor) forget(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, st := range e.drain.pods {
		if k.key == key {
			if w := st.pending; w != nil && e.gate.withdraw(w) {
				e.dropWaiter(st, w)
			}
			e.drain.drop(k, st, e.o.Metrics.BlockedPods)
		}
	}
}

// setBlocked keeps reprieve_evictions_blocked_pods equal to the number of pods whose last
// eviction a PodDisruptionBudget refused in the current drain.
func (e *Executor) setBlocked(st *podState, blocked bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if st.blocked == blocked {
		return
	}
	st.blocked = blocked
	if st.drain != nil && st.drain.closed {
		return // closing the drain took its pods out of the gauge
	}
	if blocked {
		e.o.Metrics.BlockedPods.Inc()
	} else {
		e.o.Metrics.BlockedPods.Dec()
	}
}

// recordSent records, under e.mu (a new drain may carry it over, see carryDone), that a request
// for st's pod was accepted: done when it was an eviction or a delete that ends the pod's plan,
// with the grace asked for and the end it was to meet (zero values leave them as they were).
func (e *Executor) recordSent(st *podState, done bool, grace time.Duration, end time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st.done = st.done || done
	if grace > 0 {
		st.lastGrace = grace
	}
	if !end.IsZero() {
		st.shortenedTo = end
	}
	// The deadline moved while the request was in flight: the drain that replaced st's was
	// carried from it before the request was accepted, so carry this pod too, or the next
	// sync (before the informer shows its deletionTimestamp) would evict it a second time.
	if cur := e.drain; cur != st.drain && cur.from == st.drain && st.done {
		if c, ok := cur.pods[st.key]; !ok || !c.done {
			cur.pods[st.key] = &podState{key: st.key, uid: st.uid, drain: cur, done: true, lastGrace: st.lastGrace, shortenedTo: st.shortenedTo}
		}
	}
}

// observeLateness records how late an eviction took effect against its plan, and logs it when
// it is more than a second: the notice came late, the agent (re)started late, or the API server
// did not answer. The grace says what was still possible.
func (e *Executor) observeLateness(ctx context.Context, pod *v1.Pod, pl plan.Plan, view View, now time.Time, grace time.Duration, failures int) {
	late := now.Sub(e.knowableAt(pl, view))
	e.o.Metrics.EvictionLateness.Observe(max(0, late.Seconds()))
	if late > time.Second {
		klog.FromContext(ctx).Info("Eviction is late", "pod", klog.KObj(pod), "late", late.Round(time.Millisecond),
			"planned", pl.EvictAt, "failedAttempts", failures, "grace", grace, "podGrace", pl.Grace)
	}
}

// knowableAt is the earliest moment the agent could have carried out plan: its planned time,
// or, for a plan set by a deadline that was already past when the notice came (a grace longer
// than the window), the interruption taint's timeAdded. Lateness counts from there.
func (e *Executor) knowableAt(pl plan.Plan, view View) time.Time {
	at := pl.EvictAt
	if !pl.ByDeadline {
		return at
	}
	for _, t := range view.Taints {
		if t.Key == e.o.InterruptionTaint.Key && t.Effect == e.o.InterruptionTaint.Effect && t.TimeAdded != nil && at.Before(t.TimeAdded.Time) {
			at = t.TimeAdded.Time
		}
	}
	return at
}

// evict asks the Eviction API to evict pod with grace, on the condition that it is still the
// same pod (UID precondition), so that a pod recreated under the same name is never evicted by
// a plan made for its predecessor.
func (e *Executor) evict(ctx context.Context, pod *v1.Pod, grace, timeout time.Duration) error {
	if e.o.DryRun {
		klog.FromContext(ctx).Info("Dry run: would evict pod", "pod", klog.KObj(pod), "grace", grace)
		return nil
	}
	secs := int64(grace / time.Second)
	uid := pod.UID
	ev := &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{
			GracePeriodSeconds: &secs,
			Preconditions:      &metav1.Preconditions{UID: &uid},
		},
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := e.evictFn(rctx, ev); err != nil {
		return fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// errNotSent returns a slot that was granted but not used (see ticket.done).
var errNotSent = errors.New("not sent")

// gateKey is the gate's order for pl's requests: the last safe moment (Latest), or without a
// deadline the time it is due.
func gateKey(pl plan.Plan, w plan.Window) time.Time {
	if w.HasDeadline() {
		return pl.Latest
	}
	return pl.EvictAt
}

// mustGo is when a request waiting for its turn goes past the gate's pause and limit: the
// pod's force point; never without a deadline.
func mustGo(w plan.Window, forceAt time.Time) time.Time {
	if !w.HasDeadline() {
		return time.Time{}
	}
	return forceAt
}

// QueueBound is how long a request sent at sent that asks for grace may take, so that the pod
// still ends by the window's end, the kubelet's tail after the grace (plan.Tail) included: APF
// may hold a request in its queue, and the server counts the grace from when it handles it, so
// a request that waited longer would end the pod late. Past the bound the request is cancelled
// (APF drops a queued request whose client went away) and sent again with the grace recomputed.
// Never less than the RequestAllowance a request needs to land, never more than RequestTimeout;
// RequestTimeout without a deadline. Leaving the tail out let a preStop hook's pod, its grace
// cut to end 2 s before the window's end, wait 2 s longer and end 2 s past it (issue 50, case
// 4).
//
// A request that asks for the least grace (plan.MinGrace) waits RequestTimeout: sent again,
// it would ask for the same second, behind every request that arrived meanwhile. Cut at the
// allowance (250 ms), a pod's last-chance request never got through a server slower than that:
// each resend was cut in turn until the server sped up (TestLastChanceRequestNotCut).
func QueueBound(w plan.Window, grace, tail time.Duration, sent time.Time) time.Duration {
	if !w.HasDeadline() || grace <= plan.MinGrace {
		return RequestTimeout
	}
	return min(RequestTimeout, max(w.End().Sub(sent)-grace-tail, plan.RequestAllowance))
}

// lastChance is when a request waiting for its turn goes past everything, the gate's pause
// too: the last moment at which a 1 s grace still ends the pod by the window's end, with the
// request's lead and the measured margin; never without a deadline.
func lastChance(w plan.Window, margin, minKill time.Duration) time.Time {
	if !w.HasDeadline() {
		return time.Time{}
	}
	return w.End().Add(-minKill - plan.EvictionLead - margin)
}

// gateResult is what the gate learns from a request's err: a request cut at its bound is
// errQueueBound.
func gateResult(err error, bound time.Duration) error {
	if waitedTooLong(err, bound) {
		return errQueueBound
	}
	return err
}

// waitedTooLong reports whether err is a request cut by its own timeout (QueueBound, at most
// RequestTimeout), not by the agent stopping: under APF a request that got no answer in that
// time waited in the server's queue (or the server hangs; either way it is not the pod's
// refusal, and the pod is sent again with the grace recomputed, still through the Eviction
// API). Counting it as a failure of the pod forced deletes past its budgets for a full queue.
// Past the pod's force point it does force the DELETE (outcome): there the eviction keeps no
// budget that the DELETE breaks.
func waitedTooLong(err error, _ time.Duration) bool {
	return errors.Is(err, context.DeadlineExceeded)
}

// isPDBRefusal reports whether an eviction failed because a PodDisruptionBudget allows no
// disruption: a 429 that names the DisruptionBudget cause, or a 403 that names it (a refusal
// too, not a permission problem). A 429 without it is the API server's own throttling (API
// Priority and Fairness), which is retried like any failure.
func isPDBRefusal(err error) bool {
	return (apierrors.IsTooManyRequests(err) || apierrors.IsForbidden(err)) && apierrors.HasStatusCause(err, policyv1.DisruptionBudgetCause)
}

// postEviction creates the eviction without client-go's own retries. Not EvictV1: client-go
// retries a 429 that carries Retry-After up to ten times inside the call, which hid a
// PodDisruptionBudget refusal for most of a reclaim window. The eviction loop does its own
// backoff, bounded by the deadline, so the request must return at once.
func postEviction(client kube.Interface) func(context.Context, *policyv1.Eviction) error {
	return func(ctx context.Context, ev *policyv1.Eviction) error {
		return client.CoreV1().RESTClient().Post().
			Namespace(ev.Namespace).Resource("pods").Name(ev.Name).SubResource("eviction").
			MaxRetries(0).Body(ev).Do(ctx).Error()
	}
}

// deletePod deletes pod with grace and a UID precondition. On a pod that is already terminating
// a DELETE can only shorten its grace, never lengthen it.
func (e *Executor) deletePod(ctx context.Context, pod *v1.Pod, grace, timeout time.Duration) error {
	if e.o.DryRun {
		klog.FromContext(ctx).Info("Dry run: would delete pod", "pod", klog.KObj(pod), "grace", grace)
		return nil
	}
	secs := int64(grace / time.Second)
	uid := pod.UID
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := e.o.Client.CoreV1().Pods(pod.Namespace).Delete(rctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &secs,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil {
		return fmt.Errorf("deleting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// deleteRetryAfter is the wait before retrying a delete that failed n times in a row: 100 ms
// doubling to deleteBackoffMax.
func deleteRetryAfter(n int) time.Duration {
	return min(evictionBackoffBase<<min(max(n-1, 0), 10), deleteBackoffMax)
}

// markBound is how long the DisruptionTarget patch before a DELETE sent at now may take: the
// DELETE's grace is computed after it, so every second it takes is a second of the pod's
// grace, and it may not hold the DELETE past the pod's last chance (lastChance, with the pod's
// kubelet tail: without it a preStop hook's pod was deleted 2 s past its own last chance and
// ended 1.75 s past the window, issue 50 case 4). At least the allowance a request needs to
// land; RequestTimeout at most, and without a deadline.
func markBound(w plan.Window, margin, tail time.Duration, now time.Time) time.Duration {
	if !w.HasDeadline() {
		return RequestTimeout
	}
	return min(RequestTimeout, max(lastChance(w, margin, minKill+tail).Sub(now), plan.RequestAllowance))
}

// Reason and message of the DisruptionTarget condition reprieve sets before it deletes a pod.
const (
	disruptionReason = "DeletionByReprieve"
)

// markDisruptionTarget patches DisruptionTarget=True onto pod's status before a plain DELETE,
// as the taint-eviction controller does before its deletes (addConditionAndDeletePod in
// pkg/controller/tainteviction/taint_eviction.go): the Eviction API sets it itself, a DELETE
// does not, and a Job whose podFailurePolicy ignores disruptions relies on it. A failure is
// logged and the DELETE goes ahead: ending the pod before the machine goes matters more. It
// reports whether it sent a request, and its error (errNotSent when it sent none).
func (e *Executor) markDisruptionTarget(ctx context.Context, pod *v1.Pod, st *podState, w plan.Window, tail time.Duration) (bool, error) {
	e.mu.Lock()
	marked := st.marked
	st.marked = true // once per pod and window, even when it failed: the DELETE is what counts
	e.mu.Unlock()
	if e.o.DryRun || marked || disruptionTarget(pod) {
		return false, errNotSent
	}
	msg := "reprieve: deleting the pod before its node's reclaim deadline"
	if w.HasDeadline() {
		msg += " " + w.Deadline.UTC().Format(time.RFC3339)
	}
	patch, err := json.Marshal(map[string]any{
		// The UID is immutable: a pod recreated under the same name fails the patch.
		"metadata": map[string]any{"uid": pod.UID},
		"status": map[string]any{"conditions": []v1.PodCondition{{
			Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: disruptionReason, Message: msg,
			LastTransitionTime: metav1.NewTime(e.o.Clock.Now()),
		}}},
	})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Encoding the DisruptionTarget condition failed", "pod", klog.KObj(pod))
		return false, errNotSent
	}
	rctx, cancel := context.WithTimeout(ctx, markBound(w, e.gate.sendMargin(), tail, e.o.Clock.Now()))
	defer cancel()
	if _, err = e.o.Client.CoreV1().Pods(pod.Namespace).Patch(rctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		err = fmt.Errorf("patching the DisruptionTarget condition of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		klog.FromContext(ctx).Error(err, "Marking the pod as a disruption target failed; deleting it anyway", "pod", klog.KObj(pod))
	}
	return true, err
}
