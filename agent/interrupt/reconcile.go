package interrupt

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/evict"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/providers/none"
)

// Reconcile turns the notices in force into the node writer's wish and the executor's view. It
// hands the wish over and returns: the pods are planned on the node as it is about to be, so an
// API outage or a slow admission webhook delays the taint write but never the evictions.
func (l *Loop) Reconcile(ctx context.Context) {
	logger := klog.FromContext(ctx)
	now := l.o.Clock.Now()
	node := l.o.Node()
	if node == nil {
		logger.Error(nil, "Node not found; waiting for it", "node", l.o.NodeName)
		return
	}
	notices := l.inForce(ctx, node)
	l.announce(ctx, notices)
	intent := plan.Intend(notices, now, l.o.MaintenanceLead, l.o.Taints)
	for _, n := range intent.FarAhead {
		if !l.farLogged[n.ID] {
			l.farLogged[n.ID] = true
			logger.Info("Deadline further away than --maintenance-lead: keeping new pods off the node, evicting nothing yet",
				"provider", n.Provider, "kind", n.Kind, "id", n.ID, "deadline", n.Deadline, "interruptsAt", n.Deadline.Add(-l.o.MaintenanceLead))
		}
	}
	wish := record.Wish{Intent: intent, WriteDeadline: l.o.Provider.Name() != none.Name, Drained: l.drained(intent)}
	if wish.WriteDeadline {
		rec := record.RecordOf(notices)
		wish.Record = &rec
	}
	l.o.Writer.SetInterruption(wish)

	desire := l.o.Writer.Desire()
	planned := record.ComputeNodeChange(node, desire).Taints
	for _, t := range append([]v1.Taint{l.o.Taints.Interruption, l.o.Taints.Rebalance, l.o.Taints.Maintenance}, l.o.PressureTaints...) {
		l.o.Metrics.TaintActive.WithLabelValues(t.Key).Set(b2f(record.HasTaint(planned, t)))
	}
	if intent.Interrupting() {
		l.o.Metrics.ReclaimDeadline.Set(float64(intent.Deadline.Unix()))
	} else {
		l.o.Metrics.ReclaimDeadline.Set(0)
	}
	// The plan reads the interruption taint as NoExecute in both modes (--interruption-eviction):
	// only who carries the schedule out differs.
	view := evict.View{Taints: l.countdownTaints(node, planned, desire, intent.Interrupting(), now),
		Window: plan.Window{SafetyMargin: l.o.SafetyMargin, Taint: l.o.Taints.Evicting()}, Notice: intent.Interruption}
	if intent.Interrupting() {
		view.Window.Deadline = intent.Deadline
		view.Window.VolumeRelease = l.o.VolumeRelease
		if in := intent.Interruption; in != nil && !in.SoftOff.IsZero() && in.SoftOff.Before(intent.Deadline) && l.o.ShutdownCut > 0 {
			// The kubelet stops what is still running at the soft-off (GKE's graceful node
			// shutdown): plan every pod to go before it.
			view.Window.SoftOff, view.Window.ShutdownCut = in.SoftOff.Truncate(time.Second), l.o.ShutdownCut
		}
	} else {
		view.Window.Taint = v1.Taint{}
	}
	if l.o.Executor.SetView(view) {
		logger.V(2).Info("Re-planning every pod", "deadline", view.Window.Deadline, "noExecuteTaints", len(view.Taints))
	}
	// The drained state above was the executor's under the view before this one; under the new
	// view it may differ (a notice with no pod to evict is drained at once). Hand the writer the
	// current one, so that the Drained condition waits for no further reconcile.
	if d := l.drained(intent); d != wish.Drained {
		wish.Drained = d
		l.o.Writer.SetInterruption(wish)
	}
	if node != nil {
		l.o.Executor.ObserveVolumes(node.Status.VolumesInUse, now)
	}
	l.o.Executor.Summarize(ctx, now)
}

// recorded is what the node's record holds: the record reprieve wrote, or, on a node written by
// a release before the record (only reprieve's own interruption taint with the deadline
// annotation, and its soft taints), what those say.
func (l *Loop) recorded(node *v1.Node) []providers.Notice {
	if r, ok := record.Read(node); ok {
		return r.Resume()
	}
	name := l.o.Provider.Name()
	var out []providers.Notice
	if it, ok := l.ownedInterruption(node); ok {
		if v, ok := node.Annotations[record.AnnotationReclaimDeadline]; ok {
			if d, err := time.Parse(time.RFC3339, v); err == nil {
				n := providers.Notice{Provider: name, Kind: providers.KindSpotInterruption, ID: restoredID, Deadline: d,
					Description: "restored from the node's " + record.AnnotationReclaimDeadline + " annotation"}
				// The taint's timeAdded is when the countdown started: a notice counted from
				// first sight is re-anchored on it (InForce), never on this process's clock.
				if it.TimeAdded != nil {
					n.NoticeTime = it.TimeAdded.Time
				}
				out = append(out, n)
			}
		}
	}
	if record.Owns(node, l.o.Taints.Rebalance) {
		out = append(out, providers.Notice{Provider: name, Kind: providers.KindRebalanceRecommendation, ID: restoredID + "-rebalance"})
	}
	if record.Owns(node, l.o.Taints.Maintenance) {
		out = append(out, providers.Notice{Provider: name, Kind: providers.KindScheduledMaintenance, ID: restoredID + "-maintenance"})
	}
	return out
}

// ownedInterruption returns reprieve's own interruption taint on node, in either effect: an
// agent of the other --interruption-eviction wrote it NoExecute where this one writes
// NoSchedule, or the reverse, and it is the same countdown. Where the node carries both, the
// earlier timeAdded is when the countdown began.
func (l *Loop) ownedInterruption(node *v1.Node) (v1.Taint, bool) {
	var it v1.Taint
	found := false
	for _, eff := range []v1.TaintEffect{v1.TaintEffectNoExecute, v1.TaintEffectNoSchedule} {
		want := l.o.Taints.Interruption
		want.Effect = eff
		if !record.Owns(node, want) {
			continue
		}
		for _, t := range node.Spec.Taints {
			if t.Key != want.Key || t.Effect != eff {
				continue
			}
			if !found || it.TimeAdded == nil || (t.TimeAdded != nil && t.TimeAdded.Before(it.TimeAdded)) {
				it = t
			}
			found = true
		}
	}
	return it, found
}

// restoredID is the ID of a notice read back from a node that carries no record.
const restoredID = "restored-from-node"

// drained says whether every pod reprieve evicts for the interruption is gone (the executor's
// Drained), for the writer's Drained lifecycle condition; false while not interrupting.
func (l *Loop) drained(intent plan.Intent) bool {
	if !intent.Interrupting() {
		return false
	}
	_, _, ok := l.o.Executor.Drained()
	return ok
}

// countdownTaints is plan.CountdownTaints of the node as it is about to be (planned): each
// NoExecute taint anchored on the earlier of its timeAdded and when this agent first saw it
// (seenAt, which forgets a taint once it is gone). A NoSchedule taint of the interruption's key
// and value that someone else put on the node before counts from when this agent wanted its own
// taint (the writer's stamp).
//
// A taint this agent adds is first seen no earlier than the writer's stamp, the timeAdded it
// writes: the writer stamps when it is handed the wish, after this reconcile read the clock,
// and that can be the next second. On 2026-12-06 (a loaded e2e run) now read 11:32:00.9, the
// writer stamped 11:32:01, and the plan counted from 11:32:00: a pod tolerating the taint for
// 10 s was evicted at 11:32:10, a second before upstream's taint-eviction controller, counting
// from the timeAdded on the node, would.
func (l *Loop) countdownTaints(node *v1.Node, planned []v1.Taint, d record.NodeDesire, interrupting bool, now time.Time) []v1.Taint {
	ts := l.o.Taints
	foreign := record.HasTaint(node.Spec.Taints, ts.Interruption) && !record.Owns(node, ts.Interruption)
	var stamp time.Time
	if foreign && interrupting {
		stamp = d.AddedAt(record.TaintID(ts.Interruption))
	}
	seen := map[string]bool{}
	out := plan.CountdownTaints(planned, ts, interrupting, foreign, stamp, now, func(t v1.Taint) time.Time {
		id := record.TaintID(t) + "=" + t.Value
		seen[id] = true
		at, ok := l.seenAt[id]
		if !ok {
			at = now.Truncate(time.Second)
			if own := ownStamp(d, ts, interrupting, t); own.After(at) {
				at = own
			}
			l.seenAt[id] = at
		}
		return at
	})
	for id := range l.seenAt {
		if !seen[id] {
			delete(l.seenAt, id)
		}
	}
	return out
}

// ownStamp is the writer's stamp of t, zero when t is not one the wishes want (the writer
// stamps exactly those: the interruption taint while interrupting, the soft taints and the
// pressure taints). The interruption taint, which the plan reads as NoExecute, is stamped under
// the effect it is written with.
func ownStamp(d record.NodeDesire, ts plan.TaintSet, interrupting bool, t v1.Taint) time.Time {
	if d.AddedAt == nil {
		return time.Time{}
	}
	if ts.IsInterruption(t) {
		if !interrupting {
			return time.Time{}
		}
		t.Effect = ts.Interruption.Effect
		return d.AddedAt(record.TaintID(t))
	}
	for _, w := range d.Intent.SoftTaints {
		if w.MatchTaint(&t) && w.Value == t.Value {
			return d.AddedAt(record.TaintID(t))
		}
	}
	return time.Time{}
}

// maybeApprove runs ApproveOnce off the reconcile loop (an approval call may take its whole
// timeout), one at a time.
func (l *Loop) maybeApprove(ctx context.Context) {
	if !l.o.ApproveEvents {
		return
	}
	l.mu.Lock()
	busy := l.approving
	l.approving = true
	l.mu.Unlock()
	if busy {
		return
	}
	go func() {
		defer func() {
			l.mu.Lock()
			l.approving = false
			l.mu.Unlock()
		}()
		l.ApproveOnce(ctx)
	}()
}

// ApproveOnce tells a cloud that supports it (Azure's StartRequests) that the machine is ready
// for its event: once the interruption taint is on the node, every pod reprieve evicts for the
// event is gone and the node no longer lists their volumes in use (the executor's Drained), so
// maintenance can start sooner. Only with --azure-approve-events.
func (l *Loop) ApproveOnce(ctx context.Context) {
	if !l.o.ApproveEvents {
		return
	}
	ap, ok := l.o.Provider.(providers.Approver)
	if !ok {
		return
	}
	if node := l.o.Node(); node == nil || !record.HasTaint(node.Spec.Taints, l.o.Taints.Interruption) {
		return // new pods could still land
	}
	n, approved, ok := l.o.Executor.Drained()
	if !ok {
		return
	}
	logger := klog.FromContext(ctx)
	if l.o.DryRun {
		logger.Info("Dry run: would approve the event", "provider", n.Provider, "id", n.ID)
		approved()
		return
	}
	actx, cancel := context.WithTimeout(ctx, approveTimeout)
	defer cancel()
	if err := ap.Approve(actx, n); err != nil {
		logger.Error(err, "Approving the event failed; will retry", "provider", n.Provider, "id", n.ID)
		return
	}
	approved()
	logger.Info("Approved the event: the node is drained", "provider", n.Provider, "id", n.ID)
	l.o.Recorder.Eventf(events.NodeRef(l.o.NodeName), v1.EventTypeNormal, events.ReasonEventApproved,
		"Approved %s %s %s early: every pod reprieve evicts for it is gone, and the node no longer lists their volumes in use", n.Provider, n.Kind, n.ID)
}

// Approving reports whether an approval call is in flight.
func (l *Loop) Approving() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.approving
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
