package evict

import (
	"errors"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/reprieve-dev/reprieve/agent/plan"
)

// The executor's decisions, as pure functions (docs/design.md, "The executor"): decide says
// what one pod needs now, sendGrace what its request asks for when it leaves, outcome what an
// answer means. The actuator (evict.go) only carries them out: it owns every pod's state, the
// gate's slots, the requests, the metrics and the events.

// actionKind is what decide asks the actuator to do for one pod.
type actionKind int

const (
	// actNone: nothing now; the pod is looked at again on its next change.
	actNone actionKind = iota
	// actWait: nothing before action.at (the send time, or a remeasure before it).
	actWait
	// actEvict: an eviction through the gate (action.gate), with the grace sendGrace gives
	// when it leaves.
	actEvict
	// actForce: a DELETE through the gate: the force point has come for a pod whose
	// evictions were refused or failed.
	actForce
	// actShorten: a DELETE that brings a terminating pod's end forward into the window.
	actShorten
	// actMark: the DisruptionTarget patch that precedes the force point's DELETE.
	actMark
)

func (k actionKind) String() string {
	return [...]string{"none", "wait", "evict", "force", "shorten", "mark"}[k]
}

// slot is a request's place in the gate: its order (the pod's last safe moment), must-go
// moment and last chance (gate.go), these two before the send margin: the gate takes off the
// margin of the moment whenever it looks (admit), so that a request that waits while the margin
// grows still goes when it must (issue 50, case 2).
type slot struct {
	key, mustGo, lastChance time.Time
}

// action is decide's answer for one pod.
type action struct {
	kind actionKind
	// at is when to look again (actWait).
	at time.Time
	// announce asks for the EvictionScheduled event (actWait, the first wait for this plan).
	announce bool
	// skip is why the pod is left alone (actNone from a skip), to log once per reason;
	// logSkip says whether to log it now.
	skip    plan.SkipReason
	logSkip bool
	// unblock says the pod no longer waits on a budget (its plan became a skip).
	unblock bool
	// warn says the pods' early warning is told the plan.
	warn bool
	// volumeAtRisk says, once per pod and window, that the pod's volume cannot be released in
	// time: it has a volume that needs attaching and its last safe moment (before the
	// release) has passed (issue 40).
	volumeAtRisk bool
	// pl and w are the plan and the window that binds the pod; forceAt its force point.
	pl      plan.Plan
	w       plan.Window
	forceAt time.Time
	// margin is the send margin forceAt was taken at.
	margin time.Duration
	// mark says that a force point's DELETE would follow the DisruptionTarget patch, due at
	// markAt, a margin before the force point.
	mark   bool
	markAt time.Time
	gate   slot
}

// atMargin is a with its force point and the patch's moment for the send margin margin.
func (a action) atMargin(margin time.Duration) action {
	a.forceAt, a.margin = forcePoint(a.pl, margin), margin
	if a.mark {
		a.markAt = a.forceAt.Add(-margin)
	}
	return a
}

// podFacts is what decide reads of a pod's state in the current drain.
type podFacts struct {
	done        bool
	attempts    int
	nextTry     time.Time
	announced   time.Time
	logged      plan.SkipReason
	shortenedTo time.Time
	// throttled and deleteFailures count the requests without a seat and the failed deletes.
	throttled, deleteFailures int
	// atRisk is set once the pod's volume was reported at risk in this window.
	atRisk bool
	// marked is set once the DisruptionTarget patch was sent in this window.
	marked bool
}

// decision is decide's input: the pod, its state, the view, the executor's settings, the
// measured send margin (gate.sendMargin) and the time.
type decision struct {
	pod     *v1.Pod
	facts   podFacts
	view    View
	filter  plan.PodFilter
	cmpOps  bool
	margin  time.Duration
	now     time.Time
	minKill time.Duration
}

// decide returns what one pod needs now (docs/design.md, "The executor's rules").
func decide(d decision) action {
	pod, view := d.pod, d.view
	if pod.DeletionTimestamp != nil && view.Window.HasDeadline() && d.filter.Skip(pod) == plan.SkipNone {
		// A pod that is already leaving no longer tolerates anything: whatever its
		// tolerations (forever included), its end must come before the window's.
		return decideShorten(d, view.Window)
	}
	a := decidePlanned(d)
	a.warn = true // the pods' early warning hears every planned pod's plan
	// A volume that needs attaching is at risk once the pod's last chance before the release
	// has passed before it was sent: even the least grace no longer ends before the kubelet
	// must publish the release (plan.Window.VolumeRelease). Before that, a grace too long for
	// the window is cut to end at the release (GraceShortened), and the volume is released.
	a.volumeAtRisk = a.pl.Volume && a.pl.Skip == plan.SkipNone && !d.facts.atRisk && !d.facts.done &&
		d.now.After(lastChance(a.w, d.margin, d.minKill+a.pl.Tail))
	return a
}

// decidePlanned is decide for a pod planned from the view.
func decidePlanned(d decision) action {
	pod, view, now := d.pod, d.view, d.now
	pl := plan.PlanPod(pod, view.Taints, view.Window, d.filter, d.cmpOps)
	// The window that binds this pod: none for one that tolerates the interruption forever.
	w := pl.Bound(view.Window)
	if pl.Skip != plan.SkipNone {
		// A blocked pod whose plan became a skip (the taint went, a toleration now covers it)
		// is no longer waiting on a budget.
		log := d.facts.logged != pl.Skip && (w.HasDeadline() || pl.Skip == plan.SkipTolerateForever)
		return action{kind: actNone, skip: pl.Skip, logSkip: log, unblock: true, pl: pl, w: w}
	}
	if pod.DeletionTimestamp != nil {
		return decideShorten(d, w)
	}
	if d.facts.done {
		return action{kind: actNone, pl: pl, w: w}
	}
	// The measured queueing margin: a deadline-bound pod leaves that much earlier, so that
	// its request may wait in the server's queue and still keep its grace.
	fireAt := plan.SendAt(pl)
	if pl.ByDeadline {
		fireAt = fireAt.Add(-d.margin)
	}
	forceAt := forcePoint(pl, d.margin)
	// The force point's DELETE follows the DisruptionTarget patch (markDisruptionTarget), which
	// takes an answer's time too: for a pod refused or failed before, the patch goes a margin
	// before the force point, so that the DELETE still leaves at it with the whole grace. Sent
	// together at the force point, a server whose answers took 1 s cost the pod a second
	// (issue 50, case 1).
	patch := w.HasDeadline() && !d.facts.marked && !disruptionTarget(pod)
	mark := patch && d.facts.attempts > 0
	markAt := forceAt.Add(-d.margin)
	if d.facts.nextTry.After(fireAt) {
		fireAt = d.facts.nextTry
	}
	if w.HasDeadline() && (fireAt.After(forceAt) || d.facts.attempts > 0 && fireAt.After(markAt)) {
		// No wait outlasts the pod's last safe moment; and a retry whose answer would come
		// after the force point is not sent: its refusal would hold the DELETE one answer
		// past it (issue 50, case 1).
		fireAt = forceAt
	}
	if mark && fireAt.After(markAt) {
		fireAt = markAt
	}
	a := action{pl: pl, w: w, forceAt: forceAt, margin: d.margin, mark: patch}
	if patch {
		a.markAt = markAt
	}
	if now.Before(fireAt) {
		a.kind, a.at = actWait, fireAt
		a.announce = d.facts.attempts == 0 && !d.facts.announced.Equal(pl.EvictAt)
		// A deadline-bound pod wakes RemeasureLead early: the margin is measured again then,
		// and answers that slowed since the plan (the notice's own burst) move its send
		// earlier instead of costing it a second of grace, which the send would cut to keep
		// the window.
		if pl.ByDeadline && fireAt.Sub(now) > RemeasureLead {
			a.at = fireAt.Add(-RemeasureLead)
		}
		return a
	}
	// The last chance leaves the least grace and the kubelet's tail (plan.Tail) before the
	// window's end. Both moments go to the gate without the margin (slot).
	a.gate = slot{key: gateKey(pl, w), mustGo: mustGo(w, forcePoint(pl, 0)), lastChance: lastChance(w, 0, d.minKill+pl.Tail)}
	a.kind = actEvict
	switch {
	case w.HasDeadline() && d.facts.attempts > 0 && !now.Before(forceAt):
		// Refused or failed before, and the force point has come: the machine is going
		// away, a graceful delete now beats a hard stop at the deadline.
		a.kind = actForce
	case mark && !now.Before(markAt):
		// Its must-go moment is the patch's: a margin before the force point's, which the
		// gate takes off as well.
		a.kind = actMark
		a.gate.mustGo = mustGo(w, forcePoint(pl, 0).Add(-d.margin))
	}
	return a
}

// disruptionTarget reports whether pod carries DisruptionTarget=True already (the Eviction API
// sets it, and so does an earlier patch of reprieve's).
func disruptionTarget(pod *v1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.DisruptionTarget && c.Status == v1.ConditionTrue {
			return true
		}
	}
	return false
}

// forcePoint is the force point of a pod planned as pl with the send margin margin: its last
// safe moment less the request's lead and the margin.
func forcePoint(pl plan.Plan, margin time.Duration) time.Time {
	return pl.Latest.Add(-plan.EvictionLead - margin)
}

// atGrant is what a request decided as a does when the gate lets it go at now, with the send
// margin of that moment: its own kind, or, for an eviction (or the patch before the force
// point) of a pod refused or failed before whose force point (with that margin) came while it
// waited for its turn, the force point's DELETE, which takes a turn of its own (and patches
// first).
func atGrant(a action, f podFacts, margin time.Duration, now time.Time) actionKind {
	if (a.kind == actEvict || a.kind == actMark) && a.w.HasDeadline() && f.attempts > 0 && !now.Before(forcePoint(a.pl, margin)) {
		return actForce
	}
	return a.kind
}

// decideShorten is decide for a pod that is already terminating: a DELETE with the grace that is
// left when its deletionTimestamp falls after the window's end (kube-controller-manager deleted
// it with its full grace, say).
func decideShorten(d decision, w plan.Window) action {
	if !plan.NeedsShortening(d.pod, w) {
		return action{kind: actNone, w: w}
	}
	grace := plan.GraceAt(d.pod.DeletionTimestamp.Sub(d.now), w, d.now.Add(plan.RequestAllowance+plan.Tail(d.pod)))
	end := d.now.Add(plan.RequestAllowance).Add(grace)
	if !d.facts.shortenedTo.IsZero() && end.After(d.facts.shortenedTo.Add(-time.Second)) {
		// Asked already in this window. deletionTimestamp is the API server's clock in whole
		// seconds: compared with ours it can seem past the window's end by a skew or a
		// rounding; shortening again for less than a second would only repeat the DELETE.
		return action{kind: actNone, w: w}
	}
	// A terminating pod's last safe moment is the last at which the least grace still fits,
	// with the kubelet's tail.
	tail := plan.Tail(d.pod)
	last := w.End().Add(-d.minKill - tail)
	return action{kind: actShorten, w: w, pl: plan.Plan{Tail: tail},
		gate: slot{key: last, mustGo: last.Add(-plan.EvictionLead), lastChance: lastChance(w, 0, d.minKill+tail)}}
}

// sent is what a request asks for when it leaves at now with the measured margin queue: its
// grace, the end it is to meet, and how long it may wait for an answer (QueueBound). The grace
// counts from when the request leaves, not from when the pod became due (it may have waited
// for its turn), and from when it lands: it leaves the request the allowance to get there and
// the margin the server's queue takes now, or a pod whose grace was cut to the window would
// end just past it.
type sent struct {
	grace time.Duration
	end   time.Time
	bound time.Duration
}

// sendGrace is sent for a request of kind k for a pod planned as a (actEvict, actForce) or
// terminating until deletion (actShorten).
//
// The grace also leaves the kubelet's tail (plan.Tail: 2 s where a preStop hook or native
// sidecars may use the whole grace, 3 s where a sidecar has a hook of its own) before the
// window's end.
func sendGrace(k actionKind, a action, deletion, at time.Time, queue time.Duration) sent {
	lands := at.Add(plan.RequestAllowance + queue)
	var grace time.Duration
	if k == actShorten {
		grace = plan.GraceAt(deletion.Sub(at), a.w, lands.Add(a.pl.Tail))
	} else {
		grace = plan.GraceAt(a.pl.Grace, a.w, lands.Add(a.pl.Tail))
	}
	end := at.Add(plan.RequestAllowance).Add(grace)
	if k == actShorten {
		end = lands.Add(grace)
	}
	return sent{grace: grace, end: end, bound: QueueBound(a.w, grace, a.pl.Tail, at)}
}

// resultKind sorts an answer.
type resultKind int

const (
	// resDone: accepted (the pod's eviction or delete went through).
	resDone resultKind = iota
	// resGone: 404 or 409: the pod is gone already, or a new pod holds its name.
	resGone
	// resNoSeat: the server had no seat for it (APF's 429, or it waited in the queue past its
	// bound): no refusal of the pod; it goes again with the grace recomputed.
	resNoSeat
	// resRefused: a PodDisruptionBudget refused the eviction.
	resRefused
	// resFailed: any other failure.
	resFailed
	// resStale: not sent: the view changed while it waited, so the new view re-plans it.
	resStale
)

// result is what outcome makes of an answer: the kind, and when to look at the pod again
// (retry; 0: only on the next change), or force, which asks for the force point's DELETE now.
type result struct {
	kind  resultKind
	retry time.Duration
	force bool
	// nextTry is the backoff's end, set on the pod's state (zero: unchanged).
	nextTry time.Time
}

// outcome sorts the answer err to a request of kind k, answered at now, for a pod planned as a,
// whose state counted f's refusals or failures, requests without a seat and failed deletes
// before this one, with the gate's pause still pauseLeft. Its retry counts from now.
func outcome(k actionKind, a action, err error, f podFacts, now time.Time, pauseLeft time.Duration) result {
	switch {
	case errors.Is(err, errNotSent):
		return result{kind: resStale, retry: time.Nanosecond}
	case err == nil:
		return result{kind: resDone}
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return result{kind: resGone}
	}
	if k != actEvict {
		// A DELETE that failed (the force point's or a shortening): retried soon, every
		// failure costing grace, but never ten a second against a dead server.
		return result{kind: resFailed, retry: deleteRetryAfter(f.deleteFailures + 1)}
	}
	w := a.w
	if waitedTooLong(err, 0) && w.HasDeadline() && !now.Before(a.forceAt) {
		// Cut at its bound, and the force point has come: past it an eviction buys the pod
		// nothing a DELETE does not (a budget's refusal would force the DELETE at once), and
		// an eviction path that hangs (a slow or failing webhook on pods/eviction) cuts every
		// request at its bound, each with less grace, and never lands. A DELETE does not go
		// through that path. APF's 429 below is the server's own answer: a DELETE would get
		// it too, so it is paced instead.
		return result{kind: resFailed, force: true}
	}
	if isThrottled(err) || waitedTooLong(err, 0) {
		// Not a refusal of this pod: the server had no seat for it (APF's 429, no
		// DisruptionBudget cause), or the request waited in the server's queue for all the
		// slack its grace left. The gate paces the agent (Retry-After, jitter); the pod goes
		// again, an eviction still (its budgets hold), with the grace recomputed then.
		if w.HasDeadline() && !now.Before(a.forceAt) {
			// Past its force point (and at its last chance past the gate's pause too), the
			// pod spaces its own requests by the server's pause at least, or the retries of
			// pods the server cannot reach take every seat the others need. But not past its
			// last chance while that is ahead: the gate lets the pod go then, past the pause,
			// only if it is waiting in the gate. Looked at again at the pause's end, a pod
			// throttled at T+1.4 with Retry-After 30 s went at T+37.7, past the window's end
			// at T+34, while the pods beside it went at their last chance (make test,
			// TestSecondMarginGrowsWhileWaiting; issue 52). When the pause outlasts it, the
			// pod is back in the gate the largest margin before it (the margin may grow
			// meanwhile) and waits there: only its last chance takes it past the pause.
			retry := max(deleteRetryAfter(f.throttled+1), pauseLeft)
			if lc := lessMargin(a.gate.lastChance, a.margin); lc.After(now) && now.Add(retry).After(lc) {
				retry = max(a.gate.lastChance.Add(-queueMarginMax).Sub(now), time.Nanosecond)
			}
			return result{kind: resNoSeat, retry: retry}
		}
		return result{kind: resNoSeat, retry: time.Nanosecond}
	}
	kind := resFailed
	limit := FailureBackoffMax
	if isPDBRefusal(err) {
		// A PDB refusal backs off to 10 s; any other failure (the API server unreachable, a
		// timeout) only to 1 s, so that evictions resume within a second of the server's
		// return.
		kind, limit = resRefused, EvictionBackoffMax
	}
	if w.HasDeadline() && !now.Before(a.forceAt) {
		// The machine is going away: a graceful delete now beats a hard stop at the deadline.
		return result{kind: kind, force: true}
	}
	// The backoff runs from the answer, which is when the actuator applies the retry. Counted
	// from the send, a pod whose answers took 1 s was looked at again one answer after its
	// force point, and deleted a second late with a second less (issue 50, case 1).
	next := now.Add(min(evictionBackoffBase<<min(f.attempts, 10), limit))
	if w.HasDeadline() && next.After(a.forceAt) {
		next = a.forceAt
	}
	retry := next.Sub(now)
	if a.mark && next.After(a.markAt) {
		// The DisruptionTarget patch is due before the backoff ends (decide's actMark).
		retry = max(a.markAt.Sub(now), time.Nanosecond)
	}
	return result{kind: kind, retry: retry, nextTry: next}
}
