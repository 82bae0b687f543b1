package plan

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func taintSets() (kcm, reprieve TaintSet) {
	kcm = TaintSet{Interruption: v1.Taint{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoExecute}}
	reprieve = TaintSet{Interruption: v1.Taint{Key: "cloud", Value: "spot", Effect: v1.TaintEffectNoSchedule}}
	return kcm, reprieve
}

func TestTaintSetEviction(t *testing.T) {
	kcm, rp := taintSets()
	if kcm.Eviction() != EvictionKubeControllerManager || rp.Eviction() != EvictionReprieve {
		t.Errorf("Eviction() = %q, %q; want %q, %q", kcm.Eviction(), rp.Eviction(), EvictionKubeControllerManager, EvictionReprieve)
	}
	for _, ts := range []TaintSet{kcm, rp} {
		if e := ts.Evicting(); e.Effect != v1.TaintEffectNoExecute || e.Key != "cloud" || e.Value != "spot" || e.TimeAdded != nil {
			t.Errorf("%s: Evicting() = %+v; want cloud=spot:NoExecute without timeAdded", ts.Eviction(), e)
		}
		for _, eff := range []v1.TaintEffect{v1.TaintEffectNoExecute, v1.TaintEffectNoSchedule} {
			if !ts.IsInterruption(taint("cloud", "spot", eff, t0)) {
				t.Errorf("%s: cloud=spot:%s is not the interruption taint", ts.Eviction(), eff)
			}
		}
		for _, other := range []v1.Taint{taint("cloud", "other", v1.TaintEffectNoSchedule, t0), taint("cloud", "spot", v1.TaintEffectPreferNoSchedule, t0)} {
			if ts.IsInterruption(other) {
				t.Errorf("%s: %+v taken for the interruption taint", ts.Eviction(), other)
			}
		}
	}
}

// TestEvictingTaints: which of the node's taints the plan counts from, in each mode.
func TestEvictingTaints(t *testing.T) {
	kcm, rp := taintSets()
	noExec := taint("cloud", "spot", v1.TaintEffectNoExecute, t0)
	noSched := taint("cloud", "spot", v1.TaintEffectNoSchedule, t0.Add(3*time.Second))
	other := taint("node.kubernetes.io/not-ready", "", v1.TaintEffectNoExecute, t0.Add(time.Second))
	soft := taint("reprieve.io/scheduled-maintenance", "true", v1.TaintEffectNoSchedule, t0)
	str := func(ts []v1.Taint) []string {
		var out []string
		for _, t := range ts {
			s := t.Key + ":" + string(t.Effect)
			if t.TimeAdded != nil {
				s += "@" + t.TimeAdded.Sub(t0).String()
			}
			out = append(out, s)
		}
		return out
	}
	tests := []struct {
		name         string
		ts           TaintSet
		taints       []v1.Taint
		interrupting bool
		want         []string
	}{
		{name: "default: the NoExecute taints", ts: kcm, taints: []v1.Taint{noExec, other, soft}, interrupting: true,
			want: []string{"cloud:NoExecute@0s", "node.kubernetes.io/not-ready:NoExecute@1s"}},
		{name: "default: a NoSchedule taint of the key never evicts", ts: kcm, taints: []v1.Taint{noSched}, interrupting: true},
		{name: "reprieve: the NoSchedule interruption taint read as NoExecute while interrupting", ts: rp,
			taints: []v1.Taint{soft, noSched, other}, interrupting: true,
			want: []string{"cloud:NoExecute@3s", "node.kubernetes.io/not-ready:NoExecute@1s"}},
		{name: "reprieve: outside an interruption it evicts nothing", ts: rp, taints: []v1.Taint{noSched, other},
			want: []string{"node.kubernetes.io/not-ready:NoExecute@1s"}},
		{name: "reprieve: both effects (a switch of mode): once, the earlier timeAdded", ts: rp,
			taints: []v1.Taint{noSched, noExec}, interrupting: true, want: []string{"cloud:NoExecute@0s"}},
		{name: "default: both effects: once, the earlier timeAdded", ts: kcm,
			taints: []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoSchedule, t0.Add(-time.Second)), noExec}, interrupting: true,
			want: []string{"cloud:NoExecute@0s"}},
		{name: "reprieve: another value of the key is not the interruption", ts: rp,
			taints: []v1.Taint{taint("cloud", "ondemand", v1.TaintEffectNoSchedule, t0)}, interrupting: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]v1.Taint(nil), tc.taints...)
			got := str(EvictingTaints(in, tc.ts, tc.interrupting))
			if len(got) != len(tc.want) {
				t.Fatalf("EvictingTaints = %v; want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("EvictingTaints = %v; want %v", got, tc.want)
				}
			}
			for i := range in {
				if in[i].Effect != tc.taints[i].Effect {
					t.Errorf("the node's taints were changed: %+v", in)
				}
			}
		})
	}
}

// TestReprieveModePlansAsNoExecute: with --interruption-eviction=reprieve the node carries the
// interruption taint NoSchedule, and every pod is planned exactly as under the NoExecute taint
// of the default mode (upstream's schedule from the pod's own tolerations; the deadline's
// latest); a pod that tolerates only NoSchedule is due at once in both (the trade-off the docs
// name: kube-controller-manager would delete it at once under NoExecute too).
func TestReprieveModePlansAsNoExecute(t *testing.T) {
	kcm, rp := taintSets()
	added := &metav1.Time{Time: t0}
	onNode := func(ts TaintSet) []v1.Taint {
		it := ts.Interruption
		it.TimeAdded = added
		return []v1.Taint{it, taint("reprieve.io/rebalance-recommended", "true", v1.TaintEffectPreferNoSchedule, t0)}
	}
	w := Window{Deadline: t0.Add(120 * time.Second), SafetyMargin: 5 * time.Second}
	spotTol := func(s *int64) v1.Toleration {
		return tol("cloud", v1.TolerationOpEqual, "spot", v1.TaintEffectNoExecute, s)
	}
	pods := map[string]struct {
		pod     *v1.Pod
		skip    SkipReason
		evictAt time.Time
		bound   bool
	}{
		"no toleration":         {pod: withGrace(pod(), 5), evictAt: t0},
		"tolerates 30s":         {pod: withGrace(pod(spotTol(secs(30))), 5), evictAt: t0.Add(30 * time.Second)},
		"tolerates 600s":        {pod: withGrace(pod(spotTol(secs(600))), 10), evictAt: t0.Add(105*time.Second - KubeletReaction), bound: true},
		"tolerates forever":     {pod: withGrace(pod(spotTol(nil)), 5), skip: SkipTolerateForever},
		"tolerates NoSchedule":  {pod: withGrace(pod(tol("cloud", v1.TolerationOpExists, "", v1.TaintEffectNoSchedule, nil)), 5), evictAt: t0},
		"grace past the window": {pod: withGrace(pod(), 300), evictAt: t0.Add(-185*time.Second - KubeletReaction), bound: true},
	}
	for name, want := range pods {
		for _, ts := range []TaintSet{kcm, rp} {
			w := w
			w.Taint = ts.Evicting()
			p := PlanPod(want.pod, EvictingTaints(onNode(ts), ts, true), w, PodFilter{}, false)
			if p.Skip != want.skip || !p.EvictAt.Equal(want.evictAt) || p.ByDeadline != want.bound {
				t.Errorf("%s, %s: skip %q, evict at T%+v, by deadline %v; want %q, T%+v, %v", ts.Eviction(), name,
					p.Skip, p.EvictAt.Sub(t0), p.ByDeadline, want.skip, want.evictAt.Sub(t0), want.bound)
			}
		}
	}
	// Outside an interruption the reprieve mode's NoSchedule taint (say, left by an operator)
	// evicts nothing.
	if p := PlanPod(withGrace(pod(), 5), EvictingTaints(onNode(rp), rp, false), Window{}, PodFilter{}, false); p.Skip != SkipNoNoExecuteTaint {
		t.Errorf("reprieve mode, no interruption: %+v; want skipped: %s", p, SkipNoNoExecuteTaint)
	}
}

// TestCountdownTaints: the anchoring the reconcile loop and the what-if plan share. A NoExecute
// taint counts from the earlier of its timeAdded and when it was first seen; one without
// timeAdded from when it was first seen (now when the caller trusts the taint as it is); a
// timeAdded in the future from when it was seen; someone else's NoSchedule interruption taint,
// with reprieve evicting, from reprieve's own stamp and never from its old timeAdded; NoSchedule
// taints of other keys count for nothing.
func TestCountdownTaints(t *testing.T) {
	kcm, rp := taintSets()
	now := t0.Add(time.Minute)
	seenAt := func(at time.Time) func(v1.Taint) time.Time { return func(v1.Taint) time.Time { return at } }
	noTime := func(key string) v1.Taint { return v1.Taint{Key: key, Value: "x", Effect: v1.TaintEffectNoExecute} }
	day := t0.Add(-24 * time.Hour)
	for _, c := range []struct {
		name         string
		planned      []v1.Taint
		ts           TaintSet
		interrupting bool
		foreign      bool
		seen         func(v1.Taint) time.Time
		want         []string // key@anchor (seconds after t0)
	}{
		{name: "no timeAdded: first seen", planned: []v1.Taint{noTime("a")}, ts: kcm, seen: seenAt(t0.Add(10 * time.Second)), want: []string{"a@10"}},
		{name: "no timeAdded, trusted: now", planned: []v1.Taint{noTime("a")}, ts: kcm, seen: seenAt(time.Time{}), want: []string{"a@60"}},
		{name: "earlier timeAdded stands", planned: []v1.Taint{taint("a", "x", v1.TaintEffectNoExecute, t0)}, ts: kcm, seen: seenAt(t0.Add(5 * time.Second)), want: []string{"a@0"}},
		{name: "future timeAdded: first seen", planned: []v1.Taint{taint("a", "x", v1.TaintEffectNoExecute, t0.Add(time.Hour))}, ts: kcm, seen: seenAt(t0), want: []string{"a@0"}},
		{name: "future timeAdded, trusted: kept", planned: []v1.Taint{taint("a", "x", v1.TaintEffectNoExecute, t0.Add(time.Hour))}, ts: kcm, seen: seenAt(time.Time{}), want: []string{"a@3600"}},
		{name: "NoSchedule of another key: nothing", planned: []v1.Taint{taint("a", "x", v1.TaintEffectNoSchedule, t0)}, ts: rp, interrupting: true, seen: seenAt(t0), want: nil},
		{name: "foreign interruption taint: reprieve's stamp", planned: []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoSchedule, day)}, ts: rp, interrupting: true, foreign: true, seen: seenAt(time.Time{}), want: []string{"cloud@30"}},
		{name: "own interruption taint: its timeAdded", planned: []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoSchedule, day)}, ts: rp, interrupting: true, seen: seenAt(time.Time{}), want: []string{"cloud@-86400"}},
		{name: "foreign, kube-controller-manager evicting: its timeAdded", planned: []v1.Taint{taint("cloud", "spot", v1.TaintEffectNoExecute, day)}, ts: kcm, interrupting: true, foreign: true, seen: seenAt(time.Time{}), want: []string{"cloud@-86400"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := make([]v1.Taint, len(c.planned))
			copy(before, c.planned)
			got := CountdownTaints(c.planned, c.ts, c.interrupting, c.foreign, t0.Add(30*time.Second), now, c.seen)
			var s []string
			for _, g := range got {
				if g.Effect != v1.TaintEffectNoExecute {
					t.Errorf("%s: effect %s, want NoExecute", g.Key, g.Effect)
				}
				s = append(s, fmt.Sprintf("%s@%d", g.Key, int(g.TimeAdded.Sub(t0).Seconds())))
			}
			if fmt.Sprint(s) != fmt.Sprint(c.want) {
				t.Errorf("CountdownTaints = %v, want %v", s, c.want)
			}
			for i := range before {
				if !before[i].MatchTaint(&c.planned[i]) || !before[i].TimeAdded.Equal(c.planned[i].TimeAdded) {
					t.Errorf("the planned taints were changed: %+v, was %+v", c.planned[i], before[i])
				}
			}
		})
	}
}
