package pressure

import (
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// Issue 37's cases, each as the kubelet v1.37.2 handles it (pkg/kubelet/eviction).

const gi = 1 << 30

// Case 1: allocatableMemory.available is a memory signal with the memory ranking
// (buildSignalToRankFunc: rankMemoryPressure), and its level is computed like memory.available's
// from the kubelet's threshold copied to it (addAllocatableThresholds). A 256 GiB node with
// 13 GiB reserved of which the system uses 3: memory.available shows 20 GiB, above reprieve's
// threshold, and the pods cgroup is 50 MiB above the kubelet's 100 MiB.
func TestCase1AllocatableMemory(t *testing.T) {
	hard, err := kubelet.ParseThresholds("memory.available<100Mi,allocatableMemory.available<100Mi")
	if err != nil {
		t.Fatal(err)
	}
	obs := kubelet.Observations{
		kubelet.MemoryAvailable:            {Available: 20 * gi, Capacity: 256 * gi},
		kubelet.AllocatableMemoryAvailable: {Available: 150 * mi, Capacity: 243 * gi},
	}
	levels := Thresholds{Headroom: 0.05, Hard: hard}.Levels(obs)
	var alloc Level
	for _, l := range levels {
		if l.Signal == kubelet.AllocatableMemoryAvailable {
			alloc = l
		}
	}
	if alloc.Signal == "" || alloc.Hard != 100*mi || !alloc.Met(false) {
		t.Fatalf("levels %+v: want allocatableMemory.available under pressure against the kubelet's 100Mi", levels)
	}
	if ResourceOf(kubelet.AllocatableMemoryAvailable) != Memory {
		t.Fatalf("allocatableMemory.available is resource %s, want memory", ResourceOf(kubelet.AllocatableMemoryAvailable))
	}
	tr := NewTracker(time.Minute)
	if ch := tr.Observe(t0, levels); len(ch) != 1 || ch[0].Resource != Memory || ch[0].Level.Signal != kubelet.AllocatableMemoryAvailable {
		t.Fatalf("changes %+v, want memory pressure set by allocatableMemory.available", ch)
	}
	pods := []*v1.Pod{pod("quiet", 0, "1Gi", 30), pod("leak", 0, "1Gi", 30)}
	usage := map[types.UID]kubelet.PodUsage{"quiet": {MemoryWorkingSet: 512 * mi}, "leak": {MemoryWorkingSet: 3 * gi}}
	if got := names(Candidates(kubelet.AllocatableMemoryAvailable, pods, usage, grace)); !slices.Equal(got, []string{"leak", "quiet"}) {
		t.Fatalf("allocatable order %v, want leak first (the memory ranking)", got)
	}
	if c := Candidates(kubelet.AllocatableMemoryAvailable, pods, usage, grace); c[0].Usage != 3*gi {
		t.Fatalf("leak's usage for allocatableMemory.available %d, want its working set", c[0].Usage)
	}
}

// Cases 2, 6 and 9: the kubelet's candidates are its active pods (GetActivePods: terminating ones
// included, filterOutInactivePods) less what evictPod refuses (IsCriticalPod: its own copy's
// config.source, which it overwrites with "api" for pods from the API server
// (pkg/kubelet/config/config.go), a mirror pod, priority >= 2000000000). A DaemonSet's pod, of
// any API group, is ranked like any pod; so is one whose tenant wrote config.source "file".
func TestKeepAsTheKubelet(t *testing.T) {
	yes := true
	now := metav1.NewTime(t0)
	ds := pod("ds", 0, "", 30)
	ds.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "x", Controller: &yes}}
	evil := pod("evil-ds", 0, "", 30)
	evil.OwnerReferences = []metav1.OwnerReference{{APIVersion: "evil.example.com/v1", Kind: "DaemonSet", Name: "x", Controller: &yes}}
	forged := pod("forged-static", 0, "", 30)
	forged.Annotations = map[string]string{"kubernetes.io/config.source": "file"}
	rollout := pod("rollout", 0, "", 600)
	rollout.DeletionTimestamp = &now
	mirror := pod("mirror", 0, "", 30)
	mirror.Annotations = map[string]string{v1.MirrorPodAnnotationKey: "x", "kubernetes.io/config.source": "file"}
	for _, c := range []struct {
		pod  *v1.Pod
		want string
	}{
		{ds, ""}, {evil, ""}, {forged, ""}, {rollout, ""},
		{mirror, KeepCritical}, {pod("crit", SystemCriticalPriority, "", 30), KeepCritical},
	} {
		if got := Keep(c.pod, "ns", "reprieve-abcde"); got != c.want {
			t.Errorf("Keep(%s) = %q, want %q", c.pod.Name, got, c.want)
		}
	}
}

// Case 4: the kubelet frees to its hard threshold plus the minimum reclaim, one pod a pass
// (synchronize; thresholdsMet with enforceMinReclaim), not to reprieve's threshold (the hard
// threshold plus 5% of capacity). On a 1 TiB node three pods of 20 GiB: the kubelet evicts one.
func TestCase4FreesWhatTheKubeletFrees(t *testing.T) {
	const capacity = 1024 * gi
	lvl := Level{Signal: kubelet.MemoryAvailable, Capacity: capacity, Available: 5 * gi, Hard: 100 * mi,
		Threshold: 100*mi + capacity/20, MinReclaim: 1 * gi}
	// How many, the timing aside: with CutEarly a pod whose grace is cut goes as soon as it is due.
	in := Input{Level: lvl, Active: true, TimeToHard: 20 * time.Second, SafetyMargin: 5 * time.Second, CutEarly: true, Falling: time.Hour,
		Ranked: []Candidate{cand("a", 20*gi, true, 30*time.Second), cand("b", 20*gi, true, 30*time.Second), cand("c", 20*gi, true, 30*time.Second)}}
	got := Decide(in).Evict
	if len(got) != 1 || got[0].Pod.Name != "a" {
		t.Fatalf("evicts %v, want a alone: 20 GiB covers the 1 GiB minimum reclaim above the hard threshold", evictionsOf(got))
	}
	// Already below the hard threshold, by 2 GiB: it takes the shortfall plus the reclaim.
	in.Level.Available, in.TimeToHard = 100*mi-2*gi, 0
	in.Ranked = []Candidate{cand("a", 2*gi, true, 30*time.Second), cand("b", 2*gi, true, 30*time.Second), cand("c", 2*gi, true, 30*time.Second)}
	if got := evictionsOf(Decide(in).Evict); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("evicts %v below the hard threshold, want a and b (4 GiB for 3 GiB)", got)
	}
}

// Case 5: the kubelet ranks its pods as allocated (getAllocatedPods: UpdatePodFromAllocation),
// not as their spec asks: a Deferred resize from 4Gi to 24Gi still ranks by 4Gi. The API shows
// the allocation in status.containerStatuses[].allocatedResources, and the pod-level one in
// status.allocatedResources.
func TestCase5RanksByAllocatedRequests(t *testing.T) {
	resized := pod("resized", 0, "24Gi", 30)
	resized.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "c",
		AllocatedResources: v1.ResourceList{v1.ResourceMemory: resource.MustParse("4Gi")}}}
	neighbour := pod("neighbour", 0, "1Gi", 30)
	usage := map[types.UID]kubelet.PodUsage{"resized": {MemoryWorkingSet: 6 * gi}, "neighbour": {MemoryWorkingSet: 2 * gi}}
	if got := names(Candidates(kubelet.MemoryAvailable, []*v1.Pod{neighbour, resized}, usage, grace)); !slices.Equal(got, []string{"resized", "neighbour"}) {
		t.Fatalf("order %v, want resized first: 6Gi is 2Gi above its allocated 4Gi", got)
	}
	// Pod-level resources: the allocated pod-level request.
	podLevel := pod("pod-level", 0, "", 30)
	podLevel.Spec.Resources = &v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("24Gi")}}
	podLevel.Status.AllocatedResources = v1.ResourceList{v1.ResourceMemory: resource.MustParse("4Gi")}
	usage["pod-level"] = kubelet.PodUsage{MemoryWorkingSet: 6 * gi}
	if got := names(Candidates(kubelet.MemoryAvailable, []*v1.Pod{neighbour, podLevel}, usage, grace)); !slices.Equal(got, []string{"pod-level", "neighbour"}) {
		t.Fatalf("order %v, want pod-level first: 6Gi is 2Gi above its allocated pod-level 4Gi", got)
	}
	// The pod's own spec is not changed (the cache's copy is shared).
	if q := resized.Spec.Containers[0].Resources.Requests[v1.ResourceMemory]; q.String() != "24Gi" {
		t.Fatalf("resized's spec changed to %s", q.String())
	}
}

// Case 7: each pod the shortfall needs goes when its own grace still fits, not when the first
// one's does: a 10 s pod ranked first and a 120 s pod needed too. The 120 s pod goes about 125 s
// before the hard threshold with (nearly) its whole grace; the 10 s pod 15 s before.
func TestCase7LaterPodsGetTheirGrace(t *testing.T) {
	lvl := Level{Signal: kubelet.MemoryAvailable, Capacity: 8192 * mi, Available: 1000 * mi, Hard: 100 * mi, Threshold: 1200 * mi, MinReclaim: 600 * mi}
	ranked := []Candidate{cand("short", 300*mi, true, 10*time.Second), cand("long", 400*mi, true, 120*time.Second), cand("spare", 900*mi, true, 30*time.Second)}
	in := Input{Level: lvl, Active: true, SafetyMargin: 5 * time.Second, Allowance: 250 * time.Millisecond, Ranked: ranked, Falling: time.Hour}
	in.TimeToHard = 130 * time.Second
	if got := Decide(in).Evict; len(got) != 0 {
		t.Fatalf("evicts %v 130 s before the hard threshold, want none", evictionsOf(got))
	}
	// A reading ahead of the last moment its whole grace fits (125.25 s: 120 s, the margin, the
	// allowance). (Before issue 47 this was 124 s, where long went with 118 s: a grace cut now
	// waits, below.)
	in.TimeToHard = 125500 * time.Millisecond
	got := Decide(in).Evict
	if len(got) != 1 || got[0].Pod.Name != "long" || got[0].Grace != 120*time.Second {
		t.Fatalf("evicts %v with %v, want long alone with its 120 s", evictionsOf(got), gracesOf(got))
	}
	// long in flight; 14 s left: short's 10 s no longer fits, spare is not needed. Precision
	// first, short waits for the last reading that leaves it MinCutGrace (about 9.25 s: 3 s, the
	// margin, the allowance and a reading), and goes with what fits then; with CutEarly it goes
	// at once with what fits.
	in.TimeToHard, in.InFlight, in.Reclaiming = 14*time.Second, 1, 400*mi
	in.Ranked = []Candidate{ranked[0], ranked[2]}
	if got := Decide(in).Evict; len(got) != 0 {
		t.Fatalf("evicts %v with %v 14 s before the hard threshold, want short to wait", evictionsOf(got), gracesOf(got))
	}
	in.TimeToHard = 9 * time.Second
	got = Decide(in).Evict
	if len(got) != 1 || got[0].Pod.Name != "short" || got[0].Grace != 3*time.Second {
		t.Fatalf("evicts %v with %v, want short with 3 s", evictionsOf(got), gracesOf(got))
	}
	in.TimeToHard, in.CutEarly = 14*time.Second, true
	got = Decide(in).Evict
	if len(got) != 1 || got[0].Pod.Name != "short" || got[0].Grace != 8*time.Second {
		t.Fatalf("CutEarly: evicts %v with %v, want short with 8 s", evictionsOf(got), gracesOf(got))
	}
}

// Case 8: a container filesystem split from imagefs (KEP-4191): the writable layers are on
// nodefs, and the kubelet ranks nodefs by them (buildSignalToRankFunc, withImageFs &&
// imageContainerSplitFs: logs, local volumes and rootfs). The 10 GiB writable layer goes before
// the 5 GiB emptyDir.
func TestCase8SplitContainerFs(t *testing.T) {
	s, err := kubelet.ParseSummary(summaryJSON(50 << 30))
	if err != nil {
		t.Fatal(err)
	}
	for uid, u := range s.Pods {
		u.RootfsOnImageFs = false // what ParseSummary says with a split containerfs
		s.Pods[uid] = u
	}
	if got := names(Candidates(kubelet.NodeFsAvailable, diskPods(), s.Pods, grace)); !slices.Equal(got, []string{"layer", "scratch"}) {
		t.Fatalf("nodefs order %v with the writable layers on nodefs, want layer first", got)
	}
}

// Case 3: a soft threshold evicts once it has held for its grace period (thresholdsFirstObservedAt,
// thresholdsMetGracePeriod); it holds while not back above threshold plus minimum reclaim once
// met (thresholdsNotYetResolved); one reading above it starts the period again.
func TestCase3SoftTracker(t *testing.T) {
	soft := func(availMi int64) Level {
		return Level{Signal: kubelet.MemoryAvailable, Available: availMi * mi, Capacity: 8192 * mi, HasSoft: true,
			Soft: 1000 * mi, SoftGrace: 30 * time.Second, MinReclaim: 200 * mi}
	}
	st := NewSoftTracker()
	steps := []struct {
		at    time.Duration
		avail int64
		met   bool
	}{
		{0, 1500, false},
		{1 * time.Second, 900, false},  // first observed
		{20 * time.Second, 950, false}, // 19 s
		{31 * time.Second, 990, true},  // 30 s: the grace period has passed
		{32 * time.Second, 1100, true}, // above the threshold, within the reclaim: still met
		{33 * time.Second, 1250, false},
		{34 * time.Second, 900, false}, // starts again
		{60 * time.Second, 900, false},
		{64 * time.Second, 900, true},
	}
	for _, s := range steps {
		got := st.Observe(t0.Add(s.at), []Level{soft(s.avail)})
		if (len(got) == 1 && got[0] == kubelet.MemoryAvailable) != s.met {
			t.Fatalf("at %v with %d MiB: grace met %v, want %v", s.at, s.avail, got, s.met)
		}
	}
	// A level without a soft threshold is never met.
	if got := st.Observe(t0.Add(70*time.Second), []Level{mem(10)}); len(got) != 0 {
		t.Fatalf("met %v without a soft threshold", got)
	}
}

// Case 3: the grace of a soft eviction is min(evictionMaxPodGracePeriod, the pod's), and a
// result of 0 gives 1 s (calculateEffectiveGracePeriod: "we always supply a grace period of 1").
// One pod a pass, the next once it is gone.
func TestCase3DecideSoft(t *testing.T) {
	ranked := []Candidate{cand("a", 300*mi, true, 30*time.Second), cand("b", 0, true, 10*time.Second)}
	for _, c := range []struct {
		max  time.Duration
		want time.Duration
	}{{0, time.Second}, {10 * time.Second, 10 * time.Second}, {90 * time.Second, 30 * time.Second}} {
		got := DecideSoft(ranked, 0, c.max)
		if len(got) != 1 || got[0].Pod.Name != "a" || got[0].Grace != c.want {
			t.Errorf("evictionMaxPodGracePeriod %v: %v with %v, want a with %v", c.max, evictionsOf(got), gracesOf(got), c.want)
		}
	}
	if got := DecideSoft(ranked, 1, time.Minute); len(got) != 0 {
		t.Fatalf("evicts %v while one is in flight", evictionsOf(got))
	}
}

func evictionsOf(evs []Eviction) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Pod.Name)
	}
	return out
}

func gracesOf(evs []Eviction) []time.Duration {
	var out []time.Duration
	for _, e := range evs {
		out = append(out, e.Grace)
	}
	return out
}
