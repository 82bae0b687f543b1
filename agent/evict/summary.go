package evict

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/notify"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/providers"
)

// Summarize runs once the pending interruption's window has ended (deadline - safety margin):
// every pod reprieve would still evict is one that missed the deadline. It records them, and one
// event on the node (and the "handled" webhook) says how the interruption went. It reports
// whether the current window has been summarized (by this call or an earlier one).
func (e *Executor) Summarize(ctx context.Context, now time.Time) bool {
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
	h.summarized = true
	// The workers keep adding to h.acted: take a copy while the lock is held.
	actedKeys := slices.Collect(maps.Keys(h.acted))
	acted := len(actedKeys)
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
	if len(missed) > 0 {
		typ = v1.EventTypeWarning
	}
	summary := fmt.Sprintf("Interruption handled: %d pods evicted, %d gone before %s (deadline %s less %s margin), %d still present",
		acted, inTime, end, h.window.Deadline.UTC().Format(time.RFC3339), h.window.SafetyMargin, len(missed))
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
	for _, p := range missed {
		logger.Error(nil, "Pod still present at the end of the interruption window", "pod", klog.KObj(p), "windowEnd", end)
		e.o.Recorder.Eventf(p, v1.EventTypeWarning, events.ReasonMissedDeadline, "Still present at %s, %s before the reclaim deadline", end, h.window.SafetyMargin)
	}
	return true
}

// livePods returns a test of whether a pod the cache holds is really still on the node, from one
// live list of the node's pods: after an API server outage the informers' reflectors back off
// for up to 30 s and the cache lags, and a pod wrongly counted as missed pages someone. It is
// the list the agent's role already grants (the same field selector as its informer), once per
// interruption. When the server cannot answer, the cache's answer stands.
func (e *Executor) livePods(ctx context.Context) func(*v1.Pod) bool {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	list, err := e.o.Client.CoreV1().Pods(metav1.NamespaceAll).List(lctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", e.o.NodeName).String()})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing the node's pods to confirm the cache failed; trusting the cache", "node", e.o.NodeName)
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

// Drained returns the notice of the current window when every pod reprieve evicts for it is
// gone and the cloud was not yet told so, with approved, which records that it was (for the
// current window only: a new window is approved on its own). ok is false otherwise.
func (e *Executor) Drained() (n providers.Notice, approved func(), ok bool) {
	e.mu.Lock()
	h, view := e.drain, e.view
	done := h.approved || h.notice == nil
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
	}
	return *h.notice, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		h.approved = true
	}, true
}
