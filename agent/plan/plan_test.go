package plan

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func taint(key, value string, effect v1.TaintEffect, added time.Time) v1.Taint {
	t := v1.Taint{Key: key, Value: value, Effect: effect}
	if !added.IsZero() {
		t.TimeAdded = &metav1.Time{Time: added}
	}
	return t
}

func tol(key string, op v1.TolerationOperator, value string, effect v1.TaintEffect, secs *int64) v1.Toleration {
	return v1.Toleration{Key: key, Operator: op, Value: value, Effect: effect, TolerationSeconds: secs}
}

func secs(s int64) *int64 { return &s }

func pod(tolerations ...v1.Toleration) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-1"},
		Spec:       v1.PodSpec{Tolerations: tolerations},
		Status:     v1.PodStatus{Phase: v1.PodRunning},
	}
}

func withGrace(p *v1.Pod, s int64) *v1.Pod { p.Spec.TerminationGracePeriodSeconds = &s; return p }

// TestNoExecuteDue covers the upstream semantics of getMinTolerationTime and ToleratesTaint
// (pkg/controller/tainteviction, k8s.io/api core/v1 toleration.go), anchored on timeAdded.
func TestNoExecuteDue(t *testing.T) {
	spot := taint("cloud", "spot", v1.TaintEffectNoExecute, t0)
	later := taint("other", "", v1.TaintEffectNoExecute, t0.Add(20*time.Second))
	noSched := taint("cloud", "spot", v1.TaintEffectNoSchedule, t0)
	tests := []struct {
		name        string
		tolerations []v1.Toleration
		taints      []v1.Taint
		wantDue     time.Time // zero: never
		wantAny     bool
		wantTaint   string
	}{
		{name: "no taints", wantAny: false},
		{name: "only NoSchedule taints do not evict", taints: []v1.Taint{noSched}, wantAny: false},
		{name: "not tolerated: timeAdded", taints: []v1.Taint{spot}, wantDue: t0, wantAny: true, wantTaint: "cloud"},
		{name: "finite toleration: timeAdded + s", taints: []v1.Taint{spot},
			tolerations: []v1.Toleration{tol("cloud", v1.TolerationOpEqual, "spot", v1.TaintEffectNoExecute, secs(30))},
			wantDue:     t0.Add(30 * time.Second), wantAny: true, wantTaint: "cloud"},
		{name: "unset tolerationSeconds: never", taints: []v1.Taint{spot},
			tolerations: []v1.Toleration{tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, nil)},
			wantAny:     true},
		{name: "zero tolerationSeconds: timeAdded", taints: []v1.Taint{spot},
			tolerations: []v1.Toleration{tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, secs(0))},
			wantDue:     t0, wantAny: true, wantTaint: "cloud"},
		{name: "negative tolerationSeconds: timeAdded", taints: []v1.Taint{spot},
			tolerations: []v1.Toleration{tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, secs(-5))},
			wantDue:     t0, wantAny: true, wantTaint: "cloud"},
		{name: "first matching toleration in spec order wins (finite before forever)", taints: []v1.Taint{spot},
			tolerations: []v1.Toleration{
				tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, secs(10)),
				tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, nil),
			},
			wantDue: t0.Add(10 * time.Second), wantAny: true, wantTaint: "cloud"},
		{name: "first matching toleration in spec order wins (forever before finite)", taints: []v1.Taint{spot},
			tolerations: []v1.Toleration{
				tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, nil),
				tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, secs(10)),
			},
			wantAny: true},
		{name: "empty effect matches NoExecute", taints: []v1.Taint{spot},
			tolerations: []v1.Toleration{tol("cloud", v1.TolerationOpEqual, "spot", "", nil)},
			wantAny:     true},
		{name: "empty key with Exists tolerates every taint", taints: []v1.Taint{spot, later},
			tolerations: []v1.Toleration{tol("", v1.TolerationOpExists, "", "", nil)},
			wantAny:     true},
		{name: "Equal with empty value does not match a non-empty value", taints: []v1.Taint{spot},
			tolerations: []v1.Toleration{tol("cloud", v1.TolerationOpEqual, "", v1.TaintEffectNoExecute, nil)},
			wantDue:     t0, wantAny: true, wantTaint: "cloud"},
		{name: "empty operator means Equal", taints: []v1.Taint{spot},
			tolerations: []v1.Toleration{tol("cloud", "", "spot", v1.TaintEffectNoExecute, secs(7))},
			wantDue:     t0.Add(7 * time.Second), wantAny: true, wantTaint: "cloud"},
		{name: "NoSchedule toleration does not tolerate NoExecute", taints: []v1.Taint{spot},
			tolerations: []v1.Toleration{tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoSchedule, nil)},
			wantDue:     t0, wantAny: true, wantTaint: "cloud"},
		{name: "one of two taints untolerated: that taint's timeAdded", taints: []v1.Taint{spot, later},
			tolerations: []v1.Toleration{tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, nil)},
			wantDue:     later.TimeAdded.Time, wantAny: true, wantTaint: "other"},
		{name: "minimum over taints, each anchored on its own timeAdded", taints: []v1.Taint{spot, later},
			tolerations: []v1.Toleration{
				tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, secs(60)),
				tol("other", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, secs(5)),
			},
			wantDue: t0.Add(25 * time.Second), wantAny: true, wantTaint: "other"},
		{name: "Lt/Gt do not match while the feature gate is off", taints: []v1.Taint{taint("gen", "5", v1.TaintEffectNoExecute, t0)},
			tolerations: []v1.Toleration{tol("gen", v1.TolerationOpGt, "3", v1.TaintEffectNoExecute, nil)},
			wantDue:     t0, wantAny: true, wantTaint: "gen"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			due, dt, anyNE := NoExecuteDue(tc.tolerations, tc.taints, time.Time{}, false)
			if !due.Equal(tc.wantDue) {
				t.Errorf("due = %v, want %v", due, tc.wantDue)
			}
			if anyNE != tc.wantAny {
				t.Errorf("anyNoExecute = %v, want %v", anyNE, tc.wantAny)
			}
			gotKey := ""
			if dt != nil {
				gotKey = dt.Key
			}
			if gotKey != tc.wantTaint {
				t.Errorf("deciding taint = %q, want %q", gotKey, tc.wantTaint)
			}
		})
	}
}

func TestNoExecuteDueComparisonOperators(t *testing.T) {
	taints := []v1.Taint{taint("gen", "5", v1.TaintEffectNoExecute, t0)}
	tols := []v1.Toleration{tol("gen", v1.TolerationOpGt, "3", v1.TaintEffectNoExecute, nil)}
	if due, _, _ := NoExecuteDue(tols, taints, time.Time{}, true); !due.IsZero() {
		t.Errorf("with the gate on, Gt 3 should tolerate 5 forever; due = %v", due)
	}
}

// TestPlanPod: every latest leaves the pod's grace, the margin and the kubelet's reaction
// (KubeletReaction, the tail of a pod without a hook) before the deadline.
func TestPlanPod(t *testing.T) {
	spot := []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoExecute, t0)}
	deadline := t0.Add(120 * time.Second)
	w := Window{Deadline: deadline, SafetyMargin: 5 * time.Second}
	tolSpot := func(s *int64) v1.Toleration {
		return tol("cloud", v1.TolerationOpEqual, "spot", v1.TaintEffectNoExecute, s)
	}
	tests := []struct {
		name           string
		pod            *v1.Pod
		window         Window
		wantSkip       SkipReason
		wantEvictAt    time.Time
		wantLatest     time.Time
		wantByDeadline bool
		wantGrace      time.Duration
	}{
		{name: "untolerated: at timeAdded", pod: withGrace(pod(), 10), window: w,
			wantEvictAt: t0, wantLatest: deadline.Add(-15*time.Second - KubeletReaction), wantGrace: 10 * time.Second},
		{name: "unset grace defaults to 30s", pod: pod(), window: w,
			wantEvictAt: t0, wantLatest: deadline.Add(-35*time.Second - KubeletReaction), wantGrace: 30 * time.Second},
		{name: "short toleration: at timeAdded + s", pod: withGrace(pod(tolSpot(secs(20))), 10), window: w,
			wantEvictAt: t0.Add(20 * time.Second), wantLatest: deadline.Add(-15*time.Second - KubeletReaction), wantGrace: 10 * time.Second},
		{name: "long toleration: clamped to latest", pod: withGrace(pod(tolSpot(secs(600))), 30), window: w,
			wantEvictAt: deadline.Add(-35*time.Second - KubeletReaction), wantLatest: deadline.Add(-35*time.Second - KubeletReaction), wantByDeadline: true, wantGrace: 30 * time.Second},
		{name: "grace longer than the window: latest is already past", pod: withGrace(pod(), 300), window: w,
			wantEvictAt: deadline.Add(-305*time.Second - KubeletReaction), wantLatest: deadline.Add(-305*time.Second - KubeletReaction), wantByDeadline: true, wantGrace: 300 * time.Second},
		{name: "without a deadline: upstream time only", pod: withGrace(pod(tolSpot(secs(600))), 30), window: Window{SafetyMargin: 5 * time.Second},
			wantEvictAt: t0.Add(600 * time.Second), wantGrace: 30 * time.Second},
		{name: "tolerates forever: left alone even with a deadline", pod: pod(tolSpot(nil)), window: w, wantSkip: SkipTolerateForever},
		{name: "finished pod", pod: func() *v1.Pod { p := pod(); p.Status.Phase = v1.PodSucceeded; return p }(), window: w, wantSkip: SkipFinished},
		{name: "failed pod", pod: func() *v1.Pod { p := pod(); p.Status.Phase = v1.PodFailed; return p }(), window: w, wantSkip: SkipFinished},
		{name: "mirror pod", pod: func() *v1.Pod {
			p := pod()
			p.Annotations = map[string]string{v1.MirrorPodAnnotationKey: "x"}
			return p
		}(), window: w, wantSkip: SkipMirror},
		{name: "DaemonSet pod", pod: func() *v1.Pod {
			p := pod()
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", Controller: ptr(true)}}
			return p
		}(), window: w, wantSkip: SkipDaemonSet},
		{name: "non-controller DaemonSet reference is not a DaemonSet pod", pod: func() *v1.Pod {
			p := withGrace(pod(), 1)
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds"}}
			return p
		}(), window: w, wantEvictAt: t0, wantLatest: deadline.Add(-7*time.Second - KubeletReaction), wantGrace: time.Second}, // the kubelet's 2 s floor (issue 38, case 2)
		{name: "reprieve's own pod", pod: func() *v1.Pod { p := pod(); p.Name = "reprieve-abc"; p.Namespace = "kube-system"; return p }(),
			window: w, wantSkip: SkipSelf},
	}
	filter := PodFilter{SelfNamespace: "kube-system", SelfName: "reprieve-abc"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := PlanPod(tc.pod, spot, tc.window, filter, false)
			if p.Skip != tc.wantSkip {
				t.Fatalf("skip = %q, want %q", p.Skip, tc.wantSkip)
			}
			if tc.wantSkip != SkipNone {
				return
			}
			if !p.EvictAt.Equal(tc.wantEvictAt) {
				t.Errorf("evictAt = %v, want %v", p.EvictAt, tc.wantEvictAt)
			}
			if !p.Latest.Equal(tc.wantLatest) {
				t.Errorf("latest = %v, want %v", p.Latest, tc.wantLatest)
			}
			if p.ByDeadline != tc.wantByDeadline {
				t.Errorf("byDeadline = %v, want %v", p.ByDeadline, tc.wantByDeadline)
			}
			if p.Grace != tc.wantGrace {
				t.Errorf("grace = %v, want %v", p.Grace, tc.wantGrace)
			}
		})
	}
}

func TestPlanPodDaemonSetOptIn(t *testing.T) {
	p := pod()
	p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", Controller: ptr(true)}}
	plan := PlanPod(p, []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoExecute, t0)}, Window{}, PodFilter{EvictDaemonSetPods: true}, false)
	if plan.Skip != SkipNone || !plan.EvictAt.Equal(t0) {
		t.Fatalf("with --evict-daemonset-pods the pod is planned at timeAdded; got skip %q at %v", plan.Skip, plan.EvictAt)
	}
}

func TestGraceAt(t *testing.T) {
	w := Window{Deadline: t0.Add(60 * time.Second), SafetyMargin: 5 * time.Second} // end t0+55s
	tests := []struct {
		name  string
		grace time.Duration
		w     Window
		now   time.Time
		want  time.Duration
	}{
		{"full grace fits", 30 * time.Second, w, t0, 30 * time.Second},
		{"exactly fits", 55 * time.Second, w, t0, 55 * time.Second},
		{"shortened to what is left", 300 * time.Second, w, t0.Add(10 * time.Second), 45 * time.Second},
		{"rounded down, never up past the window", 300 * time.Second, w, t0.Add(10*time.Second + 300*time.Millisecond), 44 * time.Second},
		// The least grace is the kubelet's own floor, 2 s (issue 38, case 2: it was 1 s).
		{"at least two seconds", 30 * time.Second, w, t0.Add(55 * time.Second), 2 * time.Second},
		{"past the deadline: still two seconds, never zero", 30 * time.Second, w, t0.Add(90 * time.Second), 2 * time.Second},
		{"zero grace becomes two seconds", 0, w, t0, 2 * time.Second},
		{"no deadline: own grace", 300 * time.Second, Window{}, t0, 300 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := GraceAt(tc.grace, tc.w, tc.now); got != tc.want {
				t.Errorf("GraceAt = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNeedsShortening(t *testing.T) {
	w := Window{Deadline: t0.Add(60 * time.Second), SafetyMargin: 5 * time.Second}
	at := func(d time.Duration) *v1.Pod {
		p := pod()
		p.DeletionTimestamp = &metav1.Time{Time: t0.Add(d)}
		return p
	}
	if NeedsShortening(pod(), w) {
		t.Error("a running pod needs no shortening")
	}
	// The window ends at T+55; a pod's end is its deletion's and the kubelet's reaction.
	if NeedsShortening(at(55*time.Second-KubeletReaction), w) {
		t.Error("a pod ending exactly at the window's end needs no shortening")
	}
	if !NeedsShortening(at(56*time.Second-KubeletReaction), w) {
		t.Error("a pod ending after the window's end needs shortening")
	}
	if NeedsShortening(at(600*time.Second), Window{}) {
		t.Error("without a deadline nothing is shortened")
	}
}

func TestPodGrace(t *testing.T) {
	if g := PodGrace(withGrace(pod(), -3)); g != 0 {
		t.Errorf("negative grace = %v, want 0", g)
	}
	if g := PodGrace(withGrace(pod(), 45)); g != 45*time.Second {
		t.Errorf("grace = %v, want 45s", g)
	}
}

func ptr[T any](v T) *T { return &v }

// TestPlanPodZeroGrace: a pod whose terminationGracePeriodSeconds is 0 still gets the 2 s that
// the kubelet gives every container (MinGrace), so its latest start is two seconds and the
// kubelet's reaction before the window's end, not at it (issue 20, case 8: it ran until 0.75 s past D - margin; issue 38,
// case 2: the floor is the kubelet's 2 s, not the 1 s of a request).
func TestPlanPodZeroGrace(t *testing.T) {
	spot := []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoExecute, t0)}
	w := Window{Deadline: t0.Add(120 * time.Second), SafetyMargin: 5 * time.Second}
	p := PlanPod(withGrace(pod(tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, secs(600))), 0), spot, w, PodFilter{}, false)
	if want := w.End().Add(-MinGrace - KubeletReaction); !p.Latest.Equal(want) || !p.EvictAt.Equal(want) || !p.ByDeadline {
		t.Fatalf("plan %+v: want latest = evictAt = %v (window end less the kubelet's 2 s minimum grace and its reaction), by deadline", p, want)
	}
	// Sent EvictionLead before Latest, the 2 s grace it carries ends before the window's end.
	send := SendAt(p)
	lands := send.Add(RequestAllowance)
	if end := lands.Add(GraceAt(p.Grace, w, lands.Add(p.Tail)) + p.Tail); end.After(w.End()) {
		t.Fatalf("a request sent at %v ends at %v, after the window's end %v", send, end, w.End())
	}
}

// TestPlanPodToleratesInterruptionForever: a pod that tolerates the interruption taint forever
// is never pulled in by the deadline when another NoExecute taint appears in the window (the node
// lifecycle controller's not-ready, tolerated for the default 300 s): only upstream's own timing
// applies, with the pod's own grace (issue 20, case 9).
func TestPlanPodToleratesInterruptionForever(t *testing.T) {
	spotTaint := v1.Taint{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute}
	notReady := taint(v1.TaintNodeNotReady, "", v1.TaintEffectNoExecute, t0.Add(100*time.Second))
	taints := []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoExecute, t0), notReady}
	w := Window{Deadline: t0.Add(120 * time.Second), SafetyMargin: 5 * time.Second, Taint: spotTaint}
	forever := withGrace(pod(
		tol("cloud", v1.TolerationOpEqual, "spot", v1.TaintEffectNoExecute, nil),
		tol(v1.TaintNodeNotReady, v1.TolerationOpExists, "", v1.TaintEffectNoExecute, secs(300))), 30)
	p := PlanPod(forever, taints, w, PodFilter{}, false)
	if p.Skip != SkipNone || !p.Unbound || p.ByDeadline || !p.Latest.IsZero() || !p.EvictAt.Equal(t0.Add(400*time.Second)) {
		t.Fatalf("plan %+v: want unbound, evicted at upstream's not-ready + 300 s (%v), never by the deadline", p, t0.Add(400*time.Second))
	}
	if b := p.Bound(w); b.HasDeadline() {
		t.Fatalf("Bound(w) = %+v: want no deadline for a pod the window does not bind", b)
	}
	if g := GraceAt(p.Grace, p.Bound(w), t0.Add(110*time.Second)); g != 30*time.Second {
		t.Fatalf("grace %v, want the pod's own 30 s", g)
	}
	// Without the not-ready taint it is left alone, as before.
	if p := PlanPod(forever, taints[:1], w, PodFilter{}, false); p.Skip != SkipTolerateForever {
		t.Fatalf("plan %+v with only the interruption taint: want tolerates-forever", p)
	}
	// A pod that tolerates the interruption for a while is still bound by the deadline.
	bounded := withGrace(pod(tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, secs(600)),
		tol(v1.TaintNodeNotReady, v1.TolerationOpExists, "", v1.TaintEffectNoExecute, secs(300))), 30)
	if p := PlanPod(bounded, taints, w, PodFilter{}, false); p.Unbound || !p.ByDeadline || !p.EvictAt.Equal(w.End().Add(-30*time.Second-KubeletReaction)) {
		t.Fatalf("plan %+v: want bound by the deadline at %v", p, w.End().Add(-30*time.Second-KubeletReaction))
	}
	// Without Window.Taint (no interruption taint known) nothing changes.
	w.Taint = v1.Taint{}
	if p := PlanPod(forever, taints, w, PodFilter{}, false); p.Unbound || !p.ByDeadline {
		t.Fatalf("plan %+v without the window's taint: want bound by the deadline", p)
	}
}

// TestPlanPodBeforeTheKubeletsShutdown (issue 21 item 4): with a soft-off before the deadline
// and the kubelet's graceful node shutdown on (GKE: 30 s, 15 s of it for critical pods), every pod
// is evicted by the soft-off and gone by soft-off + 15 s, before the kubelet stops it itself
// with a shorter grace and past its budget.
func TestPlanPodBeforeTheKubeletsShutdown(t *testing.T) {
	spot := []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoExecute, t0)}
	// A 120 s extended notice: soft-off at t0+120 s, power-off 30 s later.
	w := Window{Deadline: t0.Add(150 * time.Second), SafetyMargin: 5 * time.Second, SoftOff: t0.Add(120 * time.Second), ShutdownCut: 15 * time.Second}
	if !w.End().Equal(t0.Add(135 * time.Second)) {
		t.Fatalf("window end %v, want the kubelet's cut at soft-off + 15 s (before deadline - margin, t0+145 s)", w.End())
	}
	for _, tc := range []struct {
		grace       int64
		wantLatest  time.Time
		wantGraceAt time.Duration // the grace a request sent at Latest carries
	}{
		{grace: 60, wantLatest: t0.Add(75*time.Second - KubeletReaction), wantGraceAt: 60 * time.Second},
		{grace: 5, wantLatest: t0.Add(120 * time.Second), wantGraceAt: 5 * time.Second}, // not after the soft-off
	} {
		p := PlanPod(withGrace(pod(tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, secs(600))), tc.grace), spot, w, PodFilter{}, false)
		if !p.Latest.Equal(tc.wantLatest) || !p.EvictAt.Equal(tc.wantLatest) {
			t.Errorf("grace %d s: latest %v evictAt %v, want %v", tc.grace, p.Latest, p.EvictAt, tc.wantLatest)
		}
		if g := GraceAt(p.Grace, w, p.Latest); g != tc.wantGraceAt {
			t.Errorf("grace %d s: %v at the latest start, want %v", tc.grace, g, tc.wantGraceAt)
		}
	}
	// Without the kubelet's shutdown (AWS, Azure, or off), the window is the deadline's.
	w.ShutdownCut = 0
	if !w.End().Equal(t0.Add(145 * time.Second)) {
		t.Errorf("window end %v without the kubelet's shutdown, want deadline - margin", w.End())
	}
}

// TestPlanPodKubeletMinimum (issue 38, case 2): the kubelet never stops a container in under
// 2 s, and a preStop hook or native sidecars that use the whole grace add their tail
// (kubeletStop). A pod whose grace is 0 or 1 s, and one with a hook, sent at its plan's send
// time, is stopped by the window's end, with a 1 s margin too.
func TestPlanPodKubeletMinimum(t *testing.T) {
	spot := []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoExecute, t0)}
	w := Window{Deadline: t0.Add(120 * time.Second), SafetyMargin: time.Second}
	hook := &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"sleep", "30"}}}}
	always := v1.ContainerRestartPolicyAlways
	for _, c := range []struct {
		name  string
		grace int64
		edit  func(*v1.Pod)
	}{
		{name: "grace 0", grace: 0},
		{name: "grace 1", grace: 1},
		{name: "grace 10, preStop hook", grace: 10,
			edit: func(p *v1.Pod) { p.Spec.Containers = []v1.Container{{Name: "app", Lifecycle: hook}} }},
		{name: "grace 10, native sidecar", grace: 10,
			edit: func(p *v1.Pod) {
				p.Spec.Containers = []v1.Container{{Name: "app"}}
				p.Spec.InitContainers = []v1.Container{{Name: "proxy", RestartPolicy: &always}}
			}},
		{name: "grace 10, preStop hook and a native sidecar", grace: 10,
			edit: func(p *v1.Pod) {
				p.Spec.Containers = []v1.Container{{Name: "app", Lifecycle: hook}}
				p.Spec.InitContainers = []v1.Container{{Name: "proxy", RestartPolicy: &always}, {Name: "setup"}}
			}},
		{name: "grace 10, a native sidecar with its own preStop hook", grace: 10,
			edit: func(p *v1.Pod) {
				p.Spec.Containers = []v1.Container{{Name: "app", Lifecycle: hook}}
				p.Spec.InitContainers = []v1.Container{{Name: "proxy", RestartPolicy: &always, Lifecycle: hook}}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := withGrace(pod(tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, secs(600))), c.grace)
			if c.edit != nil {
				c.edit(p)
			}
			pl := PlanPod(p, spot, w, PodFilter{}, false)
			send := SendAt(pl)
			lands := send.Add(RequestAllowance)
			asked := GraceAt(pl.Grace, w, lands.Add(pl.Tail))
			// The kubelet starts the grace up to its reaction after the request lands.
			if end := lands.Add(KubeletReaction + kubeletStop(p, max(asked, MinGrace)) - 2*runtimeStop); end.After(w.End()) {
				t.Fatalf("plan %+v: sent at %v with %v, the kubelet stops it by %v, after the window's end %v", pl, send, asked, end, w.End())
			}
			if asked < time.Duration(min(max(c.grace, 2), 10))*time.Second {
				t.Fatalf("asked %v for a pod whose own grace is %d s and whose plan leaves room for it", asked, c.grace)
			}
			// At its last moment, the least grace it can ask still ends in time.
			late := w.End().Add(-MinGrace - pl.Tail - RequestAllowance)
			lateAsked := GraceAt(pl.Grace, w, late.Add(RequestAllowance+pl.Tail))
			if end := late.Add(RequestAllowance + KubeletReaction + kubeletStop(p, lateAsked) - 2*runtimeStop); end.After(w.End()) {
				t.Fatalf("sent at its last moment %v, the kubelet stops it by %v, after the window's end %v", late, end, w.End())
			}
		})
	}
}

// TestPlanPodVolumeRelease (issue 40, item 1): a pod with a volume that the attach/detach
// controller attaches must be gone VolumeRelease before the deadline, not only the safety
// margin: the kubelet still has to unmount it and publish volumesInUse without it, or the
// controller waits six minutes before it detaches. Its last safe moment moves earlier by the
// difference; a pod without such a volume keeps its plan.
func TestPlanPodVolumeRelease(t *testing.T) {
	spot := []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoExecute, t0)}
	w := Window{Deadline: t0.Add(120 * time.Second), SafetyMargin: 5 * time.Second, VolumeRelease: 16 * time.Second}
	claim := func(p *v1.Pod) *v1.Pod {
		p.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data-0"}}}}
		return p
	}
	tolerating := tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoExecute, secs(600))
	plain := PlanPod(withGrace(pod(tolerating), 30), spot, w, PodFilter{}, false)
	if want := t0.Add(120*time.Second - 5*time.Second - 30*time.Second - KubeletReaction); !plain.Latest.Equal(want) || plain.Volume {
		t.Fatalf("a pod without a volume: latest %v volume %v, want %v and no volume rule", plain.Latest, plain.Volume, want)
	}
	vol := PlanPod(claim(withGrace(pod(tolerating), 30)), spot, w, PodFilter{}, false)
	if want := t0.Add(120*time.Second - 16*time.Second - 30*time.Second - KubeletReaction); !vol.Latest.Equal(want) || !vol.Volume {
		t.Fatalf("a pod with a claim: latest %v volume %v, want %v (released 16 s before the deadline)", vol.Latest, vol.Volume, want)
	}
	// Its window ends at the release: a grace cut for it ends there.
	if end := vol.Bound(w).End(); !end.Equal(t0.Add(104 * time.Second)) {
		t.Fatalf("the volume pod's window ends at %v, want T+104s", end)
	}
	if g := GraceAt(vol.Grace, vol.Bound(w), t0.Add(90*time.Second)); g != 14*time.Second {
		t.Fatalf("grace at T+90s: %v, want 14s (to the release, not to D - margin)", g)
	}
	// Rule off (VolumeRelease 0), or shorter than the margin: the margin decides.
	off := w
	off.VolumeRelease = 0
	if p := PlanPod(claim(withGrace(pod(tolerating), 30)), spot, off, PodFilter{}, false); p.Volume || !p.Latest.Equal(plain.Latest) {
		t.Fatalf("rule off: latest %v volume %v, want the plain plan", p.Latest, p.Volume)
	}
	// Which volumes need attaching: claims, generic ephemeral volumes, in-tree disks; not an
	// emptyDir, a configMap or an inline CSI volume (CSI ephemeral volumes skip attach).
	for _, c := range []struct {
		src  v1.VolumeSource
		want bool
	}{
		{v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{}}, true},
		{v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}, true},
		{v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{}}, true},
		{v1.VolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{}}, true},
		{v1.VolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{}}, true},
		{v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}, false},
		{v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{}}, false},
		{v1.VolumeSource{CSI: &v1.CSIVolumeSource{}}, false},
	} {
		p := pod()
		p.Spec.Volumes = []v1.Volume{{Name: "v", VolumeSource: c.src}}
		if got := Attaches(p); got != c.want {
			t.Errorf("Attaches(%+v) = %v, want %v", c.src, got, c.want)
		}
	}
}

// TestCSINodePluginNeverEvicted (issue 40, item 3): a CSI node plugin (it mounts the kubelet's
// plugin registration directory) unstages the volumes of the pods being evicted, so it is never
// evicted, also when DaemonSet pods are.
func TestCSINodePluginNeverEvicted(t *testing.T) {
	p := pod()
	p.Spec.Volumes = []v1.Volume{{Name: "registration-dir", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/var/lib/kubelet/plugins_registry/"}}}}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ebs-csi-node", Controller: ptr(true)}}
	if r := (PodFilter{EvictDaemonSetPods: true}).Skip(p); r != SkipVolumePlugin {
		t.Fatalf("a CSI node plugin: skip %q, want %q", r, SkipVolumePlugin)
	}
	other := pod()
	other.Spec.Volumes = []v1.Volume{{Name: "logs", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/var/log"}}}}
	if IsVolumePlugin(other) {
		t.Fatal("a pod mounting /var/log is no volume plugin")
	}
}
