package whatif

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/kubelet"
)

func TestPlanWhatIf(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.NodeName = nodeName
	// The NoExecute mode, explicitly (the default is --interruption-eviction=reprieve).
	cfg.InterruptionEviction = string(plan.EvictionKubeControllerManager)
	deadline := t0.Add(120 * time.Second)
	end := deadline.Add(-cfg.SafetyMargin)
	at := func(d time.Duration) *time.Time { x := t0.Add(d); return &x }

	pdbPod := testPod("pdb", 10, spotToleration(ptr(int64(30))))
	pdbPod.Labels = map[string]string{"app": "db"}
	ds := testPod("ds", 5)
	ds.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", Controller: ptr(true)}}
	done := testPod("done", 5)
	done.Status.Phase = v1.PodSucceeded
	in := Input{
		Node: testNode(v1.Taint{Key: "example.com/other", Effect: v1.TaintEffectNoSchedule}),
		Pods: []*v1.Pod{
			testPod("no-toleration", 30),
			testPod("tolerates-60", 10, spotToleration(ptr(int64(60)))),
			testPod("long-grace", 200, spotToleration(ptr(int64(60)))),
			testPod("tolerates-600", 10, spotToleration(ptr(int64(600)))),
			testPod("forever", 5, spotToleration(nil)),
			pdbPod, ds, done,
		},
		PDBs: []policyv1.PodDisruptionBudget{{
			ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "ns"},
			Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
			Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0},
		}},
		Deadline: deadline,
		Now:      t0,
	}
	got := Plan(cfg, in)
	if got.Deadline == nil || !got.Deadline.Equal(deadline) || !got.WindowEnd.Equal(end) || got.FarAhead {
		t.Fatalf("deadline %v, window end %v, far ahead %v", got.Deadline, got.WindowEnd, got.FarAhead)
	}
	if len(got.NoExecuteTaints) != 1 || got.NoExecuteTaints[0] != "cloud=spot:NoExecute@"+t0.UTC().Format(time.RFC3339) {
		t.Errorf("NoExecute taints %v, want the interruption taint from the notice", got.NoExecuteTaints)
	}
	byName := map[string]PodPlan{}
	for _, p := range got.Pods {
		byName[p.Name] = p
	}
	for name, want := range map[string]struct {
		action, skip string
		evictAt      *time.Time
		byDeadline   bool
		grace        float64
	}{
		"no-toleration": {"evict", "", at(0), false, 30},
		"tolerates-60":  {"evict", "", at(60 * time.Second), false, 10},
		// Its grace is longer than the window: due at once, with the grace that is left (less
		// the request's allowance and the kubelet's reaction).
		"long-grace":    {"evict", "", at(-85*time.Second - plan.KubeletReaction), true, 113},
		"tolerates-600": {"evict", "", at(105*time.Second - plan.KubeletReaction), true, 10},
		"forever":       {"skip", "tolerates-forever", nil, false, 0},
		"pdb":           {"evict", "", at(30 * time.Second), false, 10},
		"ds":            {"skip", "daemonset-pod", nil, false, 0},
		"done":          {"skip", "finished", nil, false, 0},
	} {
		p := byName[name]
		if p.Action != want.action || p.SkipReason != want.skip || p.ByDeadline != want.byDeadline || p.GraceSeconds != want.grace ||
			(want.evictAt == nil) != (p.EvictAt == nil) || (want.evictAt != nil && !p.EvictAt.Equal(*want.evictAt)) {
			t.Errorf("%s: %+v; want action %s skip %q evictAt %v byDeadline %v grace %v", name, p, want.action, want.skip, want.evictAt, want.byDeadline, want.grace)
		}
	}
	if p := byName["tolerates-60"]; p.Taint != "cloud=spot:NoExecute" || p.Toleration != "cloud=spot:NoExecute for 60s" || !p.Latest.Equal(end.Add(-10*time.Second-plan.KubeletReaction)) {
		t.Errorf("tolerates-60: taint %q toleration %q latest %v", p.Taint, p.Toleration, p.Latest)
	}
	if p := byName["no-toleration"]; p.Toleration != "none" {
		t.Errorf("no-toleration: toleration %q", p.Toleration)
	}
	if p := byName["long-grace"]; !p.SendAt.Equal(t0) {
		t.Errorf("long-grace: sent at %v, want at once (%v)", p.SendAt, t0)
	}
	if p := byName["tolerates-600"]; !p.SendAt.Equal(t0.Add(105*time.Second - plan.KubeletReaction - plan.EvictionLead)) {
		t.Errorf("tolerates-600: sent at %v, want %v before its latest start", p.SendAt, plan.EvictionLead)
	}
	if p := byName["tolerates-60"]; !p.SendAt.Equal(*p.EvictAt) {
		t.Errorf("tolerates-60: sent at %v, want at its due time %v", p.SendAt, p.EvictAt)
	}
	if p := byName["pdb"].PDB; p == nil || !p.Blocks || p.Name != "db" || !strings.Contains(p.Then, "kube-controller-manager's taint eviction deletes it at "+t0.Add(30*time.Second).Format(time.RFC3339)) {
		t.Errorf("pdb: %+v, want blocked by db, deleted past it by kube-controller-manager at its due time", p)
	}
	if got.InterruptionEviction != "kube-controller-manager" || got.InterruptionTaint != "cloud=spot:NoExecute" {
		t.Errorf("eviction %q, taint %q; want kube-controller-manager, cloud=spot:NoExecute", got.InterruptionEviction, got.InterruptionTaint)
	}

	// --interruption-eviction=reprieve: the node gets cloud=spot:NoSchedule, and every pod is
	// planned as before, from it read as NoExecute; the budget holds until the pod's latest.
	rcfg := cfg
	rcfg.InterruptionEviction = "reprieve"
	rp := Plan(rcfg, in)
	if rp.InterruptionEviction != "reprieve" || rp.InterruptionTaint != "cloud=spot:NoSchedule" {
		t.Errorf("reprieve mode: eviction %q, taint %q; want reprieve, cloud=spot:NoSchedule", rp.InterruptionEviction, rp.InterruptionTaint)
	}
	if len(rp.NoExecuteTaints) != 1 || rp.NoExecuteTaints[0] != got.NoExecuteTaints[0] {
		t.Errorf("reprieve mode: counts from %v; want %v", rp.NoExecuteTaints, got.NoExecuteTaints)
	}
	for i, p := range rp.Pods {
		q := got.Pods[i]
		if p.Name != q.Name || p.Action != q.Action || p.SkipReason != q.SkipReason || (p.EvictAt == nil) != (q.EvictAt == nil) ||
			(p.EvictAt != nil && !p.EvictAt.Equal(*q.EvictAt)) || p.GraceSeconds != q.GraceSeconds {
			t.Errorf("reprieve mode: %s planned %+v; want as in the default mode, %+v", p.Name, p, q)
		}
	}
	pdbLatest := byName["pdb"].Latest.Add(-plan.EvictionLead).UTC().Format(time.RFC3339)
	for _, p := range rp.Pods {
		if p.Name == "pdb" && (p.PDB == nil || !strings.Contains(p.PDB.Then, "until "+pdbLatest) || strings.Contains(p.PDB.Then, "kube-controller-manager")) {
			t.Errorf("reprieve mode: pdb %+v; want the budget kept until %s", p.PDB, pdbLatest)
		}
	}

	// A deadline further away than --maintenance-lead: only the maintenance taint, no eviction.
	in.Deadline = t0.Add(24 * time.Hour)
	far := Plan(cfg, in)
	if !far.FarAhead || far.Deadline != nil || len(far.NoExecuteTaints) != 0 {
		t.Errorf("a day away: far ahead %v, deadline %v, taints %v", far.FarAhead, far.Deadline, far.NoExecuteTaints)
	}
	for _, p := range far.Pods {
		if p.Action != "skip" {
			t.Errorf("a day away: %s would be evicted", p.Name)
		}
	}
}

// TestPlanWhatIfVolumeRelease (issue 40, item 1): `reprieve plan` says when a pod with a claim
// must be gone for its volume's release (15.4 s before the deadline with the kubelet's
// defaults), cuts its grace to that, and marks the volume at risk when even the least grace
// cannot end by then.
func TestPlanWhatIfVolumeRelease(t *testing.T) {
	cfg := config.DefaultConfig()
	cfg.NodeName, cfg.HostRoot = nodeName, t.TempDir() // no kubelet configuration: its defaults
	claimed := func(name string) *v1.Pod {
		p := testPod(name, 30)
		p.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}}
		return p
	}
	for _, c := range []struct {
		window time.Duration
		grace  float64
		risk   bool
	}{
		{window: 120 * time.Second, grace: 30},
		{window: 30 * time.Second, grace: 13},            // released by T+14.6, less the allowance and the kubelet's reaction
		{window: 15 * time.Second, grace: 2, risk: true}, // released by T-0.4
	} {
		np := Plan(cfg, Input{Node: testNode(), Pods: []*v1.Pod{claimed("db-0")}, Now: t0, NoticeTime: t0, Deadline: t0.Add(c.window),
			Kubelet: kubelet.Find(cfg.KubeletLookup())})
		pp := np.Pods[0]
		if pp.VolumeReleaseBy == nil || !pp.VolumeReleaseBy.Equal(t0.Add(c.window-15400*time.Millisecond)) {
			t.Fatalf("window %s: volume release by %v, want T+%s", c.window, pp.VolumeReleaseBy, c.window-15400*time.Millisecond)
		}
		if pp.GraceSeconds != c.grace || pp.VolumeAtRisk != c.risk {
			t.Errorf("window %s: grace %gs, at risk %v; want %gs, %v", c.window, pp.GraceSeconds, pp.VolumeAtRisk, c.grace, c.risk)
		}
	}
}

// The agent's test fixtures (agent/agent_test.go): one node and its pods.
const nodeName = "n1"

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func ptr[T any](v T) *T { return &v }

func testNode(taints ...v1.Taint) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"keep": "label"}},
		Spec: v1.NodeSpec{Taints: taints}}
}

func testPod(name string, grace int64, tolerations ...v1.Toleration) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec:       v1.PodSpec{NodeName: nodeName, TerminationGracePeriodSeconds: &grace, Tolerations: tolerations},
		Status:     v1.PodStatus{Phase: v1.PodRunning},
	}
}

func spotToleration(s *int64) v1.Toleration {
	return v1.Toleration{Key: "cloud", Operator: v1.TolerationOpEqual, Value: "spot", Effect: v1.TaintEffectNoExecute, TolerationSeconds: s}
}
