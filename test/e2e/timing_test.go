package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// The timing of an eviction as the run observed it (issue 52). A test's watch sees a pod's
// deletion when the event reaches this process, which shares two cores with the API server,
// kwok and thirty agents under the race detector: up to seconds after the server took the
// request, on a loaded machine, and the bound of a second around a plan measured the machine as
// much as the agent. The API server's audit log (testenv/audit.go) says when the server
// received each request, on the machine's one clock. Three things bound an eviction:
//
//   - Never before its due: the server received it no earlier than the plan, or, for a pod
//     the window moved earlier, than the plan less plan.EvictionLead and the queueing margin
//     the agent logged as it sent it (sends_test.go). No slack: the agent's clock is the
//     server's.
//   - Not late: the server received it within slack of the plan (or of when the agent could
//     know: the server's receipt of its taint, for a pod due at the notice), plus the time in
//     between when a request of the same agent was in the server's hands (busy). The agent's
//     gate holds a due pod while its other requests are answered (a notice starts cold, one
//     request at a time while the server is slow: docs/design.md, "The order of requests under
//     pressure"); on a loaded machine the answers took up to a second each, and the pods due at
//     once went seconds after their plan with the server busy with that agent all along. An
//     agent that sits idle past a pod's plan has no such time to count.
//   - In time: the first accepted request reached the server early enough for the grace it
//     asked to end by the window's end, and the end the server set (deletionTimestamp) is by
//     then.

// auditSource is an API server whose audit log a test reads: the Env's or a peer's.
type auditSource interface {
	Audit() ([]testenv.AuditEvent, error)
}

// timing is what a test reads to time one agent's evictions in one namespace.
type timing struct {
	events []testenv.AuditEvent
	ns     string
	// user is the agent's identity; logs its log files (more than one across a restart).
	user string
	logs []string
}

// auditTiming reads src's audit log until it holds an accepted eviction or delete by user of
// every pod named in ns (the log is written as the server answers, which may come after the
// watch showed the pod terminating), for at most 10 s.
func auditTiming(ctx context.Context, t *testing.T, src auditSource, ns, user string, logs []string, pods ...string) timing {
	t.Helper()
	tm := timing{ns: ns, user: user, logs: logs}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if tm.events, err = src.Audit(); err != nil {
			t.Fatal(err)
		}
		missing := slices.IndexFunc(pods, func(p string) bool { _, ok := tm.first(p); return !ok })
		if missing < 0 {
			return tm
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("the API server's audit log has no accepted eviction or delete of %s/%s by %s", ns, pods[missing], user)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// mine reports whether a is a request of the agent's about a pod of the namespace.
func (tm timing) mine(a testenv.AuditEvent) bool {
	return a.User.Username == tm.user && a.ObjectRef.Namespace == tm.ns && a.ObjectRef.Resource == "pods"
}

// first is the agent's first accepted eviction or delete of pod, by when the server received it.
// Without one, its last request that the server answered with its own timeout (504) took
// effect, if any did: the pod was ended (the caller saw it), by the agent's request or by no
// one's, and the agent stops sending once it sees the pod terminating.
func (tm timing) first(pod string) (testenv.AuditEvent, bool) {
	var first, timedOut testenv.AuditEvent
	found, late := false, false
	for _, a := range tm.events {
		if !tm.mine(a) || !a.PodEnded(tm.ns, pod) {
			continue
		}
		switch {
		case a.Accepted() && (!found || a.Received.Before(first.Received)):
			first, found = a, true
		case a.TimedOut() && (!late || a.Received.After(timedOut.Received)):
			timedOut, late = a, true
		}
	}
	if !found && late {
		return timedOut, true
	}
	return first, found
}

// end is the earliest end that the agent's accepted requests for pod set: each took effect
// after the server received it, with the grace it asked for.
func (tm timing) end(pod string) (end time.Time, grace time.Duration) {
	first, _ := tm.first(pod)
	for _, a := range tm.events {
		if !tm.mine(a) || !a.PodEnded(tm.ns, pod) || !a.Accepted() && !a.Received.Equal(first.Received) {
			continue
		}
		g, ok := a.Grace()
		if !ok {
			continue
		}
		if e := a.Received.Add(g); end.IsZero() || e.Before(end) {
			end, grace = e, g
		}
	}
	return end, grace
}

// busy is how long, between from and to, at least one request of the agent's about the
// namespace's pods (an eviction, a delete, a status write) was in the server's hands, by the
// server's clock.
func (tm timing) busy(from, to time.Time) time.Duration {
	type span struct{ a, b time.Time }
	var spans []span
	for _, a := range tm.events {
		if !tm.mine(a) {
			continue
		}
		s := span{later(a.Received, from), earlier(a.Answered, to)}
		if s.b.After(s.a) {
			spans = append(spans, s)
		}
	}
	slices.SortFunc(spans, func(x, y span) int { return x.a.Compare(y.a) })
	var total time.Duration
	var cur span
	for _, s := range spans {
		switch {
		case cur.b.IsZero():
			cur = s
		case s.a.After(cur.b):
			total += cur.b.Sub(cur.a)
			cur = s
		case s.b.After(cur.b):
			cur.b = s.b
		}
	}
	if !cur.b.IsZero() {
		total += cur.b.Sub(cur.a)
	}
	return total
}

// nodeWritten is when the server received the agent's last write to node's object up to at
// (when the test saw what it wrote): for a node the agent taints, the write that the test saw;
// the agent plans its pods before it writes (interrupt.Reconcile). Zero when there is none.
func (tm timing) nodeWritten(node string, at time.Time) time.Time {
	var last time.Time
	for _, a := range tm.events {
		if a.User.Username == tm.user && a.ObjectRef.Resource == "nodes" && a.ObjectRef.Name == node && a.ObjectRef.Subresource == "" &&
			a.Accepted() && !a.Received.After(at) && a.Received.After(last) {
			last = a.Received
		}
	}
	return last
}

// firstAnswer is when the server answered the first request of user that it received at or
// after from, whatever the answer (a server just restarted refuses what its authorizer has
// not loaded yet), and whether there is one: from then the agent could reach the server. The
// requests ending pod do not count: the figure bounds that pod's, and must not come from them.
func (tm timing) firstAnswer(user string, from time.Time, pod string) (time.Time, bool) {
	var first time.Time
	for _, a := range tm.events {
		if a.User.Username == user && !a.Received.Before(from) && !a.PodEnded(tm.ns, pod) && (first.IsZero() || a.Answered.Before(first)) {
			first = a.Answered
		}
	}
	return first, !first.IsZero()
}

// firstAccepted is when the server answered the first request of user, received at or after
// from, that it accepted (2xx), and whether there is one: from then its writes took effect. A
// server just restarted answers 403 while its authorizer loads and may then hold what it
// received for seconds (a loaded run: 403s from 50.7 s, then 504s and the first 200 at 56.0 s).
func (tm timing) firstAccepted(user string, from time.Time) (time.Time, bool) {
	var first time.Time
	for _, a := range tm.events {
		if a.User.Username == user && !a.Received.Before(from) && a.Accepted() && (first.IsZero() || a.Answered.Before(first)) {
			first = a.Answered
		}
	}
	return first, !first.IsZero()
}

// nodeWrite is the first accepted write of user to node's object that the server received at
// or after from, and whether there is one.
func (tm timing) nodeWrite(user, node string, from time.Time) (testenv.AuditEvent, bool) {
	for _, a := range tm.events {
		if a.User.Username == user && a.ObjectRef.Resource == "nodes" && a.ObjectRef.Name == node && a.ObjectRef.Subresource == "" &&
			a.Accepted() && !a.Received.Before(from) {
			return a, true
		}
	}
	return testenv.AuditEvent{}, false
}

// checkSent checks when the agent's first accepted request for pod reached the server against
// its plan (see above). notBefore is when the agent could first know of the plan (the
// interruption taint's timeAdded: never earlier), knowable when it knew at the latest (the
// server's receipt of the agent's taint), both zero for a pod planned well after the notice;
// byDeadline says the pod leaves before its plan to keep its grace (the window set its plan, or
// it is forced at its last safe moment). It returns that request.
func (tm timing) checkSent(t *testing.T, pod string, planned, notBefore, knowable time.Time, byDeadline bool) testenv.AuditEvent {
	t.Helper()
	a, ok := tm.first(pod)
	if !ok {
		t.Errorf("pod %s: the API server has no accepted eviction or delete of it by %s", pod, tm.user)
		return a
	}
	earliest := planned
	if byDeadline {
		// It leaves the lead and the margin it measured before its plan, to keep its whole
		// grace.
		earliest = planned.Add(-plan.EvictionLead - tm.margin(t, a.Received))
	}
	if earliest = later(earliest, notBefore); a.Received.Before(earliest) {
		t.Errorf("pod %s: the API server received its %s at %s, before it was due at %s",
			pod, what(a), a.Received.Format(stamp), earliest.Format(stamp))
	}
	due := later(planned, knowable)
	if late, busy := a.Received.Sub(due), tm.busy(due, a.Received); late > slack+busy {
		t.Errorf("pod %s: the API server received its %s at %s, %v after it was due at %s; the agent's other requests were in the server's hands %v of that, which leaves %v more than the slack of %v",
			pod, what(a), a.Received.Format(stamp), late.Round(time.Millisecond), due.Format(stamp), busy.Round(time.Millisecond),
			(late - busy - slack).Round(time.Millisecond), slack)
	}
	return a
}

// margin is the largest queueing margin the agent logged as it sent its evictions up to at
// (the server's receipt of the request checked): the margin a decision used was measured from
// the answers before it.
func (tm timing) margin(t *testing.T, at time.Time) time.Duration {
	t.Helper()
	var m time.Duration
	for _, path := range tm.logs {
		sends, err := agentSends(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range sends {
			if !s.At.After(at) {
				m = max(m, s.Margin)
			}
		}
	}
	return m
}

// sendOf is the agent's last logged send of pod at or before at (the server's receipt of the
// request checked), and whether there is one: when the request left and the queueing margin
// the agent measured then.
func (tm timing) sendOf(t *testing.T, pod string, at time.Time) (agentSend, bool) {
	t.Helper()
	var last agentSend
	found := false
	for _, path := range tm.logs {
		sends, err := agentSends(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range sends {
			if s.Pod == tm.ns+"/"+pod && !s.At.After(at) && (!found || s.At.After(last.At)) {
				last, found = s, true
			}
		}
	}
	return last, found
}

// heldByServer reports whether the agent's first eviction of pod reached the server within
// the margin the agent left for the way there (its logged queueing margin and
// plan.RequestAllowance) and the server then held it longer than plan.RequestAllowance
// itself, saying how: a request cut at its bound so is the server's slowness, not a margin
// that fell short. A request the server never received, or received late, is not.
func (tm timing) heldByServer(t *testing.T, pod string) (string, bool) {
	t.Helper()
	var ev testenv.AuditEvent
	found := false
	for _, a := range tm.events {
		if tm.mine(a) && a.PodEnded(tm.ns, pod) && a.Verb == "create" && (!found || a.Received.Before(ev.Received)) {
			ev, found = a, true
		}
	}
	if !found {
		return "", false
	}
	s, ok := tm.sendOf(t, pod, ev.Received)
	if !ok {
		return "", false
	}
	way, held := ev.Received.Sub(s.At), ev.Answered.Sub(ev.Received)
	why := fmt.Sprintf("sent at %s with a margin of %v, received %v later, held by the server %v (answered %d)",
		s.At.Format(stamp), s.Margin.Round(time.Millisecond), way.Round(time.Millisecond), held.Round(time.Millisecond), ev.ResponseStatus.Code)
	return why, way <= s.Margin+plan.RequestAllowance && held > plan.RequestAllowance
}

// carriedAt is when the server received the request that gave pod the grace it was seen with
// (seen, whole seconds): the agent's earliest eviction or delete of it with that grace that
// the server accepted or answered with its own timeout (whose write may still take effect).
// Without one, sent's. The grace is checked against what fitted as that request left: in a
// loaded run an eviction sent with 4 s, answered 504 after its bound, set the pod's grace,
// and the forced DELETE that followed it had 2 s left (issue 52).
func (tm timing) carriedAt(pod string, seen int64, sent testenv.AuditEvent) time.Time {
	at := sent.Received
	found := false
	for _, a := range tm.events {
		if !tm.mine(a) || !a.PodEnded(tm.ns, pod) || !a.Accepted() && !a.TimedOut() {
			continue
		}
		if g, ok := a.Grace(); ok && int64(g/time.Second) == seen && (!found || a.Received.Before(at)) {
			at, found = a.Received, true
		}
	}
	return at
}

// graceFitted is the grace, in whole seconds, that fitted a pod of grace own (at most) and
// without a hook (every caller's) before end when the agent's request for it left (sendOf):
// the agent allows the request plan.RequestAllowance plus the queueing margin it measured to
// reach the server (evict.sendGrace), a figure of the run, and the kubelet its reaction
// (plan.KubeletReaction) before the grace starts. Without a logged send it is what fitted at
// the server's receipt.
func (tm timing) graceFitted(t *testing.T, pod string, own int64, received, end time.Time) int64 {
	t.Helper()
	lands := received
	if s, ok := tm.sendOf(t, pod, received); ok {
		lands = s.At.Add(plan.RequestAllowance + s.Margin)
	}
	fit := int64(end.Add(-plan.KubeletReaction).Sub(lands) / time.Second)
	return max(min(own, fit), int64(plan.MinGrace/time.Second))
}

// lastStart is the last safe moment of a pod of grace g without a hook in a window that ends at
// end: the agent leaves the pod's grace and the kubelet's reaction (plan.KubeletReaction, the
// time the kubelet may take to start the grace) before the end.
func lastStart(end time.Time, g time.Duration) time.Time { return end.Add(-g - plan.KubeletReaction) }

// checkInTime checks that the agent's requests for pod reached the server early enough for
// the grace each asked to end by end, and that the end the server set (deletionTimestamp,
// whole seconds, as the watch last saw it) is by end too.
func (tm timing) checkInTime(t *testing.T, pod string, deletionTimestamp, end time.Time) {
	t.Helper()
	if e, g := tm.end(pod); e.IsZero() || e.After(end) {
		t.Errorf("pod %s: the agent's request with grace %v reached the API server so as to end at %s, after the window's end %s",
			pod, g, e.Format(stamp), end.Format(stamp))
	}
	if deletionTimestamp.IsZero() || deletionTimestamp.After(end) {
		t.Errorf("pod %s: deletionTimestamp %s, after the window's end %s", pod, deletionTimestamp.Format(stamp), end.Format(stamp))
	}
}

// stamp formats the times of these checks.
const stamp = "15:04:05.000"

func what(a testenv.AuditEvent) string {
	if a.Verb == "delete" {
		return "delete"
	}
	return "eviction"
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
