package evict

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/reprieve-dev/reprieve/agent/plan"
)

// decideView is the window of TestDecide, TestOutcome and TestSendGrace: a 41 s deadline and a
// 5 s margin end it at T+36. Every moment leaves the kubelet's reaction (plan.KubeletReaction,
// every pod's tail), so that a 10 s pod's last safe moment is T+25 and a plain pod's moments are
// counted from T+35.
func decideView() View { return view(t0.Add(40*time.Second + plan.KubeletReaction)) }

// TestDecide: what decide asks for one pod, at moments around its plan (decideView: a 10 s pod
// that does not tolerate the taint is due at once, with its last safe moment at T+25).
func TestDecide(t *testing.T) {
	v := decideView()
	tolerating := func(secs int64) *v1.Pod {
		p := testPod("p", 10)
		p.Spec.Tolerations = []v1.Toleration{{Key: spot.Key, Operator: v1.TolerationOpExists, Effect: spot.Effect, TolerationSeconds: &secs}}
		return p
	}
	forever := testPod("p", 10)
	forever.Spec.Tolerations = []v1.Toleration{{Key: spot.Key, Operator: v1.TolerationOpExists, Effect: spot.Effect}}
	terminating := func(end time.Time, grace int64) *v1.Pod {
		p := testPod("p", grace)
		p.DeletionTimestamp = &metav1.Time{Time: end}
		return p
	}
	latest := t0.Add(25 * time.Second)
	cases := []struct {
		name   string
		pod    *v1.Pod
		facts  podFacts
		view   View
		now    time.Time
		margin time.Duration
		want   actionKind
		check  func(t *testing.T, a action)
	}{
		{name: "due now: evict, ordered by its last safe moment", pod: testPod("p", 10), now: t0, want: actEvict,
			check: func(t *testing.T, a action) {
				if !a.gate.key.Equal(latest) || !a.gate.mustGo.Equal(latest.Add(-plan.EvictionLead)) ||
					!a.gate.lastChance.Equal(t0.Add(35*time.Second-minKill-plan.EvictionLead)) {
					t.Errorf("slot %+v", a.gate)
				}
			}},
		// Issue 50, case 2: the slot leaves the margin to the gate, which takes off the margin
		// of the moment whenever it looks (admit): a request that waits is decided again when
		// the margin grows.
		{name: "due now with a margin: the slot's moments come without it", pod: testPod("p", 10), now: t0, margin: 300 * time.Millisecond, want: actEvict,
			check: func(t *testing.T, a action) {
				if !a.gate.mustGo.Equal(latest.Add(-plan.EvictionLead)) || !a.gate.lastChance.Equal(t0.Add(35*time.Second-minKill-plan.EvictionLead)) {
					t.Errorf("slot %+v, want the must-go moment and last chance without the margin", a.gate)
				}
				if !a.forceAt.Equal(latest.Add(-plan.EvictionLead - 300*time.Millisecond)) {
					t.Errorf("force point %s, want it less the margin", a.forceAt)
				}
			}},
		{name: "terminating past the window, with a margin: the slot's moments come without it", pod: terminating(t0.Add(100*time.Second), 100), now: t0,
			margin: 300 * time.Millisecond, want: actShorten,
			check: func(t *testing.T, a action) {
				last := t0.Add(35*time.Second - minKill)
				if !a.gate.mustGo.Equal(last.Add(-plan.EvictionLead)) || !a.gate.lastChance.Equal(last.Add(-plan.EvictionLead)) {
					t.Errorf("slot %+v, want the must-go moment and last chance without the margin", a.gate)
				}
			}},
		{name: "due later by tolerationSeconds: wait, announced", pod: tolerating(8), now: t0, want: actWait,
			check: func(t *testing.T, a action) {
				if !a.at.Equal(t0.Add(8*time.Second)) || !a.announce {
					t.Errorf("wait until %s announce %v, want T+8s announced", a.at, a.announce)
				}
			}},
		{name: "announced already: wait without a second event", pod: tolerating(8), now: t0, facts: podFacts{announced: t0.Add(8 * time.Second)}, want: actWait,
			check: func(t *testing.T, a action) {
				if a.announce {
					t.Error("announced twice")
				}
			}},
		{name: "deadline-bound: wakes RemeasureLead before its send, less the margin", pod: tolerating(600), now: t0, margin: 300 * time.Millisecond, want: actWait,
			check: func(t *testing.T, a action) {
				send := latest.Add(-plan.EvictionLead - 300*time.Millisecond)
				if want := send.Add(-RemeasureLead); !a.at.Equal(want) {
					t.Errorf("wait until %s, want %s", a.at, want)
				}
			}},
		{name: "backoff: waits for nextTry", pod: testPod("p", 10), now: t0, facts: podFacts{attempts: 1, nextTry: t0.Add(3 * time.Second)}, want: actWait,
			check: func(t *testing.T, a action) {
				if !a.at.Equal(t0.Add(3 * time.Second)) {
					t.Errorf("wait until %s, want T+3s", a.at)
				}
			}},
		{name: "backoff never outlasts the force point", pod: testPod("p", 10), now: t0.Add(20 * time.Second), facts: podFacts{attempts: 3, nextTry: t0.Add(30 * time.Second)}, want: actWait,
			check: func(t *testing.T, a action) {
				if !a.at.Equal(a.forceAt) {
					t.Errorf("wait until %s, want the force point %s", a.at, a.forceAt)
				}
			}},
		{name: "refused before and past the force point: force", pod: testPod("p", 10), now: latest, facts: podFacts{attempts: 2}, want: actForce},
		// Issue 50, case 1: the force point's DELETE follows the DisruptionTarget patch, which
		// takes an answer's time too: the patch goes a margin before the force point, so that
		// the DELETE leaves at the force point with the whole grace.
		{name: "refused before, waiting: wakes a margin before the force point, for the patch", pod: testPod("p", 10), now: t0.Add(10 * time.Second),
			margin: time.Second, facts: podFacts{attempts: 2, nextTry: t0.Add(23500 * time.Millisecond)}, want: actWait,
			check: func(t *testing.T, a action) {
				if !a.at.Equal(t0.Add(22500 * time.Millisecond)) {
					t.Errorf("wait until %s, want T+22.5s (the force point T+23.5s less the margin)", a.at)
				}
			}},
		{name: "refused before, a margin before the force point: the patch goes", pod: testPod("p", 10), now: t0.Add(22500 * time.Millisecond),
			margin: time.Second, facts: podFacts{attempts: 2, nextTry: t0.Add(23500 * time.Millisecond)}, want: actMark,
			check: func(t *testing.T, a action) {
				if !a.forceAt.Equal(t0.Add(23500 * time.Millisecond)) {
					t.Errorf("force point %s, want T+23.5s", a.forceAt)
				}
			}},
		{name: "refused before, marked already: waits for the force point", pod: testPod("p", 10), now: t0.Add(22500 * time.Millisecond),
			margin: time.Second, facts: podFacts{attempts: 2, nextTry: t0.Add(23500 * time.Millisecond), marked: true}, want: actWait,
			check: func(t *testing.T, a action) {
				if !a.at.Equal(t0.Add(23500 * time.Millisecond)) {
					t.Errorf("wait until %s, want the force point T+23.5s", a.at)
				}
			}},
		{name: "refused before, DisruptionTarget on the pod already: waits for the force point", pod: disrupted(testPod("p", 10)), now: t0.Add(22500 * time.Millisecond),
			margin: time.Second, facts: podFacts{attempts: 2, nextTry: t0.Add(23500 * time.Millisecond)}, want: actWait},
		{name: "never refused: no patch before its eviction", pod: testPod("p", 10), now: t0.Add(22500 * time.Millisecond), margin: time.Second, facts: podFacts{}, want: actEvict},
		// Issue 50, case 1: a retry whose answer would come after the force point (within a
		// margin of it) is not sent: its refusal would hold the DELETE one answer past the force
		// point (TestSecondForcedDeleteOnASlowServer: 29 s of 30).
		{name: "refused before and marked, the retry due within a margin of the force point: waits for it", pod: testPod("p", 10), now: t0.Add(23 * time.Second),
			margin: time.Second, facts: podFacts{attempts: 8, nextTry: t0.Add(23 * time.Second), marked: true}, want: actWait,
			check: func(t *testing.T, a action) {
				if !a.at.Equal(t0.Add(23500 * time.Millisecond)) {
					t.Errorf("wait until %s, want the force point T+23.5s", a.at)
				}
			}},
		{name: "refused before, the retry due a margin before the force point: sent", pod: disrupted(testPod("p", 10)), now: t0.Add(22500 * time.Millisecond),
			margin: time.Second, facts: podFacts{attempts: 8, nextTry: t0.Add(22500 * time.Millisecond)}, want: actEvict},
		{name: "past the force point at the first try: still an eviction", pod: testPod("p", 10), now: latest, want: actEvict},
		{name: "sent already", pod: testPod("p", 10), now: t0, facts: podFacts{done: true}, want: actNone},
		{name: "tolerates forever: left alone, logged once", pod: forever, now: t0, want: actNone,
			check: func(t *testing.T, a action) {
				if a.skip != plan.SkipTolerateForever || !a.logSkip || !a.unblock {
					t.Errorf("skip %q log %v unblock %v", a.skip, a.logSkip, a.unblock)
				}
			}},
		{name: "tolerates forever, logged already", pod: forever, now: t0, facts: podFacts{logged: plan.SkipTolerateForever}, want: actNone,
			check: func(t *testing.T, a action) {
				if a.logSkip {
					t.Error("logged twice")
				}
			}},
		{name: "terminating past the window: shorten", pod: terminating(t0.Add(100*time.Second), 100), now: t0, want: actShorten,
			check: func(t *testing.T, a action) {
				if a.warn {
					t.Error("a pod leaving under a deadline is no longer warned")
				}
				if !a.gate.key.Equal(t0.Add(35*time.Second - minKill)) {
					t.Errorf("key %s", a.gate.key)
				}
			}},
		{name: "terminating within the window: nothing", pod: terminating(t0.Add(30*time.Second), 30), now: t0, want: actNone},
		{name: "terminating, shortened already to that end", pod: terminating(t0.Add(100*time.Second), 100), now: t0,
			facts: podFacts{shortenedTo: t0.Add(35 * time.Second)}, want: actNone},
		{name: "no deadline, due now: evict with no must-go or last chance", pod: testPod("p", 10), now: t0,
			view: View{Taints: v.Taints, Window: plan.Window{SafetyMargin: 5 * time.Second}}, want: actEvict,
			check: func(t *testing.T, a action) {
				if !a.gate.mustGo.IsZero() || !a.gate.lastChance.IsZero() || !a.gate.key.Equal(t0) {
					t.Errorf("slot %+v", a.gate)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vw := v
			if c.view.Taints != nil {
				vw = c.view
			}
			a := decide(decision{pod: c.pod, facts: c.facts, view: vw, margin: c.margin, now: c.now, minKill: minKill})
			if a.kind != c.want {
				t.Fatalf("decided %s, want %s (%+v)", a.kind, c.want, a)
			}
			if c.check != nil {
				c.check(t, a)
			}
		})
	}
}

// disrupted gives p the DisruptionTarget=True condition, as the Eviction API or an earlier
// patch leaves it.
func disrupted(p *v1.Pod) *v1.Pod {
	p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: disruptionReason})
	return p
}

// TestOutcome: what an answer means for the pod (the window and plan of TestDecide).
func TestOutcome(t *testing.T) {
	v := decideView()
	a := decide(decision{pod: testPod("p", 10), view: v, now: t0, minKill: minKill})
	gr := schema.GroupResource{Resource: "pods"}
	pdb := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	pdb.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: policyv1.DisruptionBudgetCause}}
	cases := []struct {
		name      string
		kind      actionKind
		err       error
		facts     podFacts
		sent, now time.Time // sent says when the request left; the answer's time (now) decides
		pause     time.Duration
		want      result
	}{
		{name: "accepted", kind: actEvict, sent: t0, now: t0, want: result{kind: resDone}},
		{name: "gone", kind: actEvict, err: apierrors.NewNotFound(gr, "p"), sent: t0, now: t0, want: result{kind: resGone}},
		{name: "replaced (UID precondition)", kind: actEvict, err: apierrors.NewConflict(gr, "p", fmt.Errorf("uid")), sent: t0, now: t0, want: result{kind: resGone}},
		{name: "not sent", kind: actEvict, err: errNotSent, sent: t0, now: t0, want: result{kind: resStale, retry: time.Nanosecond}},
		{name: "throttled: again at once (the gate paces)", kind: actEvict, err: throttled(2), sent: t0, now: t0, want: result{kind: resNoSeat, retry: time.Nanosecond}},
		{name: "throttled past the force point: spaced by the pause", kind: actEvict, err: throttled(2), facts: podFacts{throttled: 1},
			sent: t0.Add(25 * time.Second), now: t0.Add(25 * time.Second), pause: 2 * time.Second, want: result{kind: resNoSeat, retry: 2 * time.Second}},
		// Issue 52: a pause that outlasts the pod's last chance. Looked at again only at its
		// end, the pod was never in the gate at its last chance, which the gate lets go past the
		// pause: it went past the window's end.
		{name: "throttled past the force point, the pause past its last chance: back in the gate at once (within the largest margin of it)", kind: actEvict, err: throttled(30), facts: podFacts{throttled: 1},
			sent: t0.Add(25 * time.Second), now: t0.Add(25 * time.Second), pause: 36 * time.Second, want: result{kind: resNoSeat, retry: time.Nanosecond}},
		{name: "throttled past its last chance: spaced by the pause", kind: actEvict, err: throttled(30), facts: podFacts{throttled: 1},
			sent: a.gate.lastChance, now: a.gate.lastChance.Add(time.Millisecond), pause: 30 * time.Second, want: result{kind: resNoSeat, retry: 30 * time.Second}},
		{name: "refused by a budget: backoff", kind: actEvict, err: pdb, facts: podFacts{attempts: 2}, sent: t0, now: t0,
			want: result{kind: resRefused, retry: 400 * time.Millisecond, nextTry: t0.Add(400 * time.Millisecond)}},
		{name: "refused by a budget: backoff up to 10 s", kind: actEvict, err: pdb, facts: podFacts{attempts: 9}, sent: t0, now: t0,
			want: result{kind: resRefused, retry: EvictionBackoffMax, nextTry: t0.Add(EvictionBackoffMax)}},
		{name: "refused: backoff cut at the force point", kind: actEvict, err: pdb, facts: podFacts{attempts: 9}, sent: t0.Add(20 * time.Second), now: t0.Add(20 * time.Second),
			want: result{kind: resRefused, retry: a.forceAt.Sub(t0.Add(20 * time.Second)), nextTry: a.forceAt}},
		{name: "failed: backoff up to 1 s", kind: actEvict, err: apierrors.NewInternalError(fmt.Errorf("etcd")), facts: podFacts{attempts: 9}, sent: t0, now: t0,
			want: result{kind: resFailed, retry: FailureBackoffMax, nextTry: t0.Add(FailureBackoffMax)}},
		{name: "refused at the force point: force", kind: actEvict, err: pdb, sent: a.forceAt, now: a.forceAt, want: result{kind: resRefused, force: true}},
		// A request cut at its bound (context.DeadlineExceeded) before the force point is the
		// server's queue, not the pod: sent again at once, an eviction still.
		{name: "cut at its bound before the force point: again at once", kind: actEvict, err: context.DeadlineExceeded, sent: t0, now: t0.Add(4 * time.Second),
			want: result{kind: resNoSeat, retry: time.Nanosecond}},
		// Past the force point an eviction buys the pod nothing a DELETE does not (a budget's
		// refusal would force the DELETE at once), and an eviction path that hangs (a slow
		// webhook on pods/eviction) cuts every request at its bound: the cut forces the DELETE,
		// or the pod only ever gets an eviction too slow to land (issue 38's flake).
		{name: "cut at its bound past the force point: force", kind: actEvict, err: context.DeadlineExceeded, sent: a.forceAt.Add(-time.Second), now: a.forceAt.Add(3 * time.Second),
			want: result{kind: resFailed, force: true}},
		// Issue 50, case 1: the backoff counts from the answer, which is when the actuator
		// applies it. Counted from the send, a pod whose answers take 1 s was looked at again
		// one answer after its force point, and deleted a second late with a second less.
		{name: "refused, answered 1 s after the send: the backoff runs from the answer, to the force point", kind: actEvict, err: pdb, facts: podFacts{attempts: 9},
			sent: t0.Add(20 * time.Second), now: t0.Add(21 * time.Second),
			want: result{kind: resRefused, retry: a.forceAt.Sub(t0.Add(21 * time.Second)), nextTry: a.forceAt}},
		{name: "refused, answered 300 ms after the send: 400 ms from the answer", kind: actEvict, err: pdb, facts: podFacts{attempts: 2},
			sent: t0, now: t0.Add(300 * time.Millisecond),
			want: result{kind: resRefused, retry: 400 * time.Millisecond, nextTry: t0.Add(700 * time.Millisecond)}},
		{name: "refused before the force point, answered past it: force at once", kind: actEvict, err: pdb, facts: podFacts{attempts: 3},
			sent: a.forceAt.Add(-time.Second), now: a.forceAt.Add(500 * time.Millisecond), want: result{kind: resRefused, force: true}},
		{name: "a failed delete: retried, capped", kind: actForce, err: apierrors.NewInternalError(fmt.Errorf("etcd")), facts: podFacts{deleteFailures: 9}, sent: t0, now: t0,
			want: result{kind: resFailed, retry: deleteBackoffMax}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := outcome(c.kind, a, c.err, c.facts, c.now, c.pause); got != c.want {
				t.Fatalf("outcome %+v, want %+v", got, c.want)
			}
		})
	}
	// Issue 52: a pod of 30 s in a window to T+56 is past its force point at T+30, and a pause
	// of 36 s outlasts its last chance (T+52 less the lead): it is back in the gate
	// queueMarginMax before that, not at once (the gate would hold it 12 s for nothing) nor
	// at the pause's end.
	long := decide(decision{pod: testPod("p", 30), view: view(t0.Add(60*time.Second + plan.KubeletReaction)), now: t0, minKill: minKill})
	at := t0.Add(30 * time.Second)
	if got, want := outcome(actEvict, long, throttled(30), podFacts{throttled: 1}, at, 36*time.Second),
		(result{kind: resNoSeat, retry: long.gate.lastChance.Add(-queueMarginMax).Sub(at)}); got != want || want.retry <= 0 {
		t.Errorf("throttled at T+30, a 36 s pause past its last chance %v: outcome %+v, want %+v", long.gate.lastChance.Sub(t0), got, want)
	}
	// Issue 50, case 1: with a 1 s margin the force point is T+23.5 and the DisruptionTarget
	// patch is due a margin before it: a refusal whose backoff reaches past T+22.5 looks at the
	// pod again then, or the patch would only go with the DELETE, a margin late.
	slow := decide(decision{pod: testPod("p", 10), view: v, now: t0, margin: time.Second, minKill: minKill})
	got := outcome(actEvict, slow, pdb, podFacts{attempts: 9}, t0.Add(20*time.Second), 0)
	want := result{kind: resRefused, retry: 2500 * time.Millisecond, nextTry: t0.Add(23500 * time.Millisecond)}
	if got != want {
		t.Errorf("refused at T+20 with a 1 s margin: outcome %+v, want %+v (looked at again at the patch's moment T+22.5)", got, want)
	}
	got = outcome(actEvict, slow, pdb, podFacts{attempts: 9}, t0.Add(22800*time.Millisecond), 0)
	if want := (result{kind: resRefused, retry: time.Nanosecond, nextTry: t0.Add(23500 * time.Millisecond)}); got != want {
		t.Errorf("refused at T+22.8, past the patch's moment: outcome %+v, want %+v (the patch at once)", got, want)
	}
	// A pod that carries DisruptionTarget already needs no patch: its backoff runs to the force point.
	got = outcome(actEvict, decide(decision{pod: disrupted(testPod("p", 10)), view: v, now: t0, margin: time.Second, minKill: minKill}),
		pdb, podFacts{attempts: 9}, t0.Add(20*time.Second), 0)
	if want := (result{kind: resRefused, retry: 3500 * time.Millisecond, nextTry: t0.Add(23500 * time.Millisecond)}); got != want {
		t.Errorf("refused at T+20, DisruptionTarget on the pod already: outcome %+v, want %+v", got, want)
	}
}

// TestSendGrace: the grace a request asks for when it leaves: its own, cut to end by the
// window's end from when it lands (the allowance and the measured queue), whole seconds.
func TestSendGrace(t *testing.T) {
	v := decideView() // window end T+36
	a := decide(decision{pod: testPod("p", 10), view: v, now: t0, minKill: minKill})
	for _, c := range []struct {
		at    time.Time
		queue time.Duration
		want  time.Duration
	}{
		{at: t0, want: 10 * time.Second},
		{at: t0.Add(24500 * time.Millisecond), want: 10 * time.Second}, // 10.25 s left when it lands
		{at: t0.Add(25 * time.Second), want: 9 * time.Second},
		{at: t0.Add(24 * time.Second), queue: 2 * time.Second, want: 8 * time.Second},
		{at: t0.Add(34 * time.Second), want: plan.MinGrace},
	} {
		if s := sendGrace(actEvict, a, time.Time{}, c.at, c.queue); s.grace != c.want {
			t.Errorf("sent at T+%s with a %s queue: grace %s, want %s", c.at.Sub(t0), c.queue, s.grace, c.want)
		}
	}
	// Issue 50, case 4: a pod with a preStop hook whose grace is cut to the window waits for its
	// answer no longer than what its tail leaves: grace 32 s (36 s less the allowance and its
	// 3 s tail, rounded down) may wait 1 s, not 3 s, which would end it 2 s past the window.
	hooked := testPod("hooked", 40)
	hooked.Spec.Containers = []v1.Container{{Name: "app", Lifecycle: &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"sleep", "5"}}}}}}
	a = decide(decision{pod: hooked, view: v, now: t0, minKill: minKill})
	if s := sendGrace(actEvict, a, time.Time{}, t0, 0); s.grace != 32*time.Second || s.bound != time.Second {
		t.Errorf("the hooked pod sent at once: grace %s bound %s, want 32s and 1s", s.grace, s.bound)
	}
	// Issue 50, case 3: a pod with a preStop hook and an Istio native sidecar in a 34 s window
	// (deadline T+39): the kubelet caps the sidecar's wait by the same grace, so the stop's tail
	// is 2 s, not 2 s per stage (3 s with the kubelet's reaction), and the whole 30 s fits when
	// it is sent at once.
	always := v1.ContainerRestartPolicyAlways
	mesh := testPod("mesh", 30)
	mesh.Spec.Containers = []v1.Container{{Name: "app", Lifecycle: &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"sleep", "5"}}}}}}
	mesh.Spec.InitContainers = []v1.Container{{Name: "istio-proxy", RestartPolicy: &always}}
	a = decide(decision{pod: mesh, view: view(t0.Add(38*time.Second + plan.KubeletReaction)), now: t0, minKill: minKill})
	if a.kind != actEvict {
		t.Fatalf("the mesh pod: decided %s, want evict at once", a.kind)
	}
	if s := sendGrace(actEvict, a, time.Time{}, t0, 0); s.grace != 30*time.Second {
		t.Errorf("the mesh pod sent at once in a 34 s window: grace %s, want its whole 30s", s.grace)
	}
}

// TestAtGrant: a granted eviction goes as decided, unless it was refused or failed before and
// its force point came while it waited for its turn: then the force point's DELETE.
func TestAtGrant(t *testing.T) {
	a := decide(decision{pod: testPod("p", 10), view: view(t0.Add(40 * time.Second)), now: t0, minKill: minKill})
	for _, c := range []struct {
		name   string
		facts  podFacts
		margin time.Duration // the margin of the moment (decided with none)
		now    time.Time
		want   actionKind
	}{
		{"first try, before the force point", podFacts{}, 0, t0, actEvict},
		{"first try, past the force point: still an eviction", podFacts{}, 0, a.forceAt, actEvict},
		{"refused before, force point not yet", podFacts{attempts: 1}, 0, a.forceAt.Add(-time.Millisecond), actEvict},
		{"refused before, force point came while waiting", podFacts{attempts: 1}, 0, a.forceAt, actForce},
		// Issue 50, case 2: the force point of the moment, with the margin measured while the
		// request waited: 1 s more of it brings the force point 1 s earlier.
		{"refused before, the margin grew by 1 s while waiting", podFacts{attempts: 1}, time.Second, a.forceAt.Add(-time.Second), actForce},
	} {
		if got := atGrant(a, c.facts, c.margin, c.now); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	// Issue 50, case 1: a patch before the force point that got its turn only at the force
	// point is the force point's DELETE (which patches first).
	m := a
	m.kind = actMark
	for _, c := range []struct {
		name string
		now  time.Time
		want actionKind
	}{
		{"the patch, before the force point", a.forceAt.Add(-time.Millisecond), actMark},
		{"the patch, granted at the force point: the DELETE", a.forceAt, actForce},
	} {
		if got := atGrant(m, podFacts{attempts: 1}, 0, c.now); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
