package agent

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/reprieve-dev/reprieve/agent/events"

	"github.com/reprieve-dev/reprieve/agent/plan"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/reprieve-dev/reprieve/agent/notify"
	"github.com/reprieve-dev/reprieve/providers"
)

// describeNotice is the one-line text of a notice for events, logs and webhooks.
func describeNotice(n providers.Notice, now time.Time) string {
	s := fmt.Sprintf("%s %s", n.Provider, n.Kind)
	if n.Action != "" {
		s += " (" + n.Action + ")"
	}
	if !n.Deadline.IsZero() {
		s += fmt.Sprintf(", deadline %s (in %s)", n.Deadline.UTC().Format(time.RFC3339), n.Deadline.Sub(now).Round(time.Second))
	}
	return s
}

func taintString(t v1.Taint) string {
	if t.Value == "" {
		return fmt.Sprintf("%s:%s", t.Key, t.Effect)
	}
	return fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect)
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
			return fmt.Sprintf("taint %s tolerated for %s", taintString(*p.DueTaint), tol)
		}
	}
	return fmt.Sprintf("taint %s not tolerated", taintString(*p.DueTaint))
}

func (a *Agent) podEvent(pod *v1.Pod, typ, reason, format string, args ...any) {
	if a.cfg.DryRun {
		format = "Dry run: " + format
	}
	a.recorder.Eventf(pod, typ, reason, format, args...)
}

// markActed records that reprieve evicted or deleted the pod during the pending window.
func (a *Agent) markActed(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.drain.acted[key] = true
}

// summarizeWindow runs once the pending interruption's window has ended (deadline - safety
// margin): every pod reprieve would still evict is one that missed the deadline. It records
// them, and one event on the node says how the interruption went.
func (a *Agent) summarizeWindow(ctx context.Context, now time.Time) {
	a.mu.Lock()
	h := a.drain
	if !h.window.HasDeadline() || h.summarized || now.Before(h.window.End()) {
		a.mu.Unlock()
		return
	}
	h.summarized = true
	// The workers keep adding to h.acted: take a copy while the lock is held.
	actedKeys := slices.Collect(maps.Keys(h.acted))
	acted := len(actedKeys)
	view := a.view
	a.mu.Unlock()

	pods, err := a.podLister.List(labels.Everything())
	if err != nil {
		return
	}
	there := a.livePods(ctx)
	var missed []*v1.Pod
	for _, p := range pods {
		if pl := plan.PlanPod(p, view.taints, h.window, a.filter, a.cfg.TolerationComparisonOperators); pl.Skip == plan.SkipNone && there(p) {
			missed = append(missed, p)
		}
	}
	inTime := 0
	for _, key := range actedKeys {
		if ns, name, err := cache.SplitMetaNamespaceKey(key); err == nil {
			if p, err := a.podLister.Pods(ns).Get(name); err != nil || !there(p) {
				inTime++
			}
		}
	}
	logger := klog.FromContext(ctx)
	end := h.window.End().UTC().Format(time.RFC3339)
	logger.Info("Interruption window ended", "evicted", acted, "goneInTime", inTime, "stillPresent", len(missed), "windowEnd", end)
	typ := v1.EventTypeNormal
	if len(missed) > 0 {
		typ = v1.EventTypeWarning
	}
	summary := fmt.Sprintf("Interruption handled: %d pods evicted, %d gone before %s (deadline %s less %s margin), %d still present",
		acted, inTime, end, h.window.Deadline.UTC().Format(time.RFC3339), h.window.SafetyMargin, len(missed))
	a.recorder.Eventf(events.NodeRef(a.cfg.NodeName), typ, events.ReasonInterruptionHandled, "%s", summary)
	msg := notify.Message{Kind: notify.KindHandled, Node: a.cfg.NodeName, Deadline: h.window.Deadline,
		Pods: acted, PodsInTime: inTime, PodsMissed: len(missed), Text: fmt.Sprintf("Node %s: %s", a.cfg.NodeName, summary)}
	if n := h.notice; n != nil {
		msg.Provider, msg.NoticeKind, msg.NoticeID, msg.Action, msg.NoticeTime = n.Provider, string(n.Kind), n.ID, n.Action, n.NoticeTime
	}
	a.notifier.Notify(msg)
	if a.cfg.DryRun {
		return
	}
	a.metrics.MissedDeadlineTotal.Add(float64(len(missed)))
	for _, p := range missed {
		logger.Error(nil, "Pod still present at the end of the interruption window", "pod", klog.KObj(p), "windowEnd", end)
		a.recorder.Eventf(p, v1.EventTypeWarning, events.ReasonMissedDeadline, "Still present at %s, %s before the reclaim deadline", end, h.window.SafetyMargin)
	}
}

// livePods returns a test of whether a pod the cache holds is really still on the node, from one
// live list of the node's pods: after an API server outage the informers' reflectors back off
// for up to 30 s and the cache lags, and a pod wrongly counted as missed pages someone. It is
// the list the agent's role already grants (the same field selector as its informer), once per
// interruption. When the server cannot answer, the cache's answer stands.
func (a *Agent) livePods(ctx context.Context) func(*v1.Pod) bool {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	list, err := a.client.CoreV1().Pods(metav1.NamespaceAll).List(lctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", a.cfg.NodeName).String()})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing the node's pods to confirm the cache failed; trusting the cache", "node", a.cfg.NodeName)
		return func(*v1.Pod) bool { return true }
	}
	live := make(map[types.UID]bool, len(list.Items))
	for i := range list.Items {
		if p := &list.Items[i]; p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
			live[p.UID] = true
		}
	}
	return func(p *v1.Pod) bool { return live[p.UID] }
}

// maybeApprove tells a cloud that supports it (Azure's StartRequests) that the machine is ready
// for its event: once the interruption taint is on the node and every pod reprieve evicts for
// the event is gone, so maintenance can start sooner. Only with --azure-approve-events.
func (a *Agent) maybeApprove(ctx context.Context) {
	if !a.cfg.ApproveEvents {
		return
	}
	ap, ok := a.provider.(providers.Approver)
	if !ok {
		return
	}
	a.mu.Lock()
	h, view := a.drain, a.view
	approved := h.approved
	a.mu.Unlock()
	if approved || h.notice == nil {
		return
	}
	if node := a.cachedNode(); node == nil || !hasTaint(node.Spec.Taints, a.taints.Interruption) {
		return // new pods could still land
	}
	pods, err := a.podLister.List(labels.Everything())
	if err != nil {
		return
	}
	for _, p := range pods {
		if plan.PlanPod(p, view.taints, view.window, a.filter, a.cfg.TolerationComparisonOperators).Skip == plan.SkipNone {
			return // still to go
		}
	}
	logger := klog.FromContext(ctx)
	n := *h.notice
	if a.cfg.DryRun {
		logger.Info("Dry run: would approve the event", "provider", n.Provider, "id", n.ID)
		a.setApproved(h)
		return
	}
	if err := ap.Approve(ctx, n); err != nil {
		logger.Error(err, "Approving the event failed; will retry", "provider", n.Provider, "id", n.ID)
		return
	}
	a.setApproved(h)
	logger.Info("Approved the event: the node is drained", "provider", n.Provider, "id", n.ID)
	a.recorder.Eventf(events.NodeRef(a.cfg.NodeName), v1.EventTypeNormal, events.ReasonEventApproved,
		"Approved %s %s %s early: every pod reprieve evicts for it is gone", n.Provider, n.Kind, n.ID)
}

// setApproved records that the cloud was told d's node is drained.
func (a *Agent) setApproved(d *drain) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d.approved = true
}
