package agent

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// scriptedSource is a pressure source that the test sets reading by reading.
type scriptedSource struct {
	sample kubelet.Sample
	err    error
}

func (s *scriptedSource) Read(context.Context) (kubelet.Sample, error) { return s.sample, s.err }

func (s *scriptedSource) memory(availMi int64) {
	s.sample = kubelet.Sample{Node: kubelet.Observations{kubelet.MemoryAvailable: {Available: availMi << 20, Capacity: 8192 << 20}}}
	s.err = nil
}

func pressureConfig(t *testing.T) func(*Config) {
	return func(c *Config) {
		c.PressureSource = PressureSourceHost // the scripted source stands in for the host
		c.HostRoot = t.TempDir()              // no kubelet config there: the kubelet's defaults (memory.available<100Mi)
		c.PressureThresholds = "memory.available<1Gi"
		c.PressureMinimumReclaim = "memory.available=100Mi"
		c.PressureTransitionPeriod = 30 * time.Second
		c.SafetyMargin = 5 * time.Second
	}
}

func pressurePod(name string, grace int64, mutate ...func(*v1.Pod)) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name)},
		Spec:       v1.PodSpec{NodeName: nodeName, TerminationGracePeriodSeconds: &grace, Containers: []v1.Container{{Name: "c"}}},
		Status:     v1.PodStatus{Phase: v1.PodRunning},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

// observe advances the clock by a second, takes one reading and writes the node.
func (h *harness) observe(availMi int64) {
	h.clock.Step(time.Second)
	h.src.memory(availMi)
	h.a.observePressure(h.ctx)
	h.a.reconcile(h.ctx)
	h.syncStores()
}

func (h *harness) hasPressureTaint() bool {
	for _, t := range h.node().Spec.Taints {
		if t.Key == "reprieve.io/memory-pressure" && t.Effect == v1.TaintEffectNoSchedule && t.TimeAdded != nil {
			return true
		}
	}
	return false
}

// Below the threshold the taint goes on at once; when the fall would reach the kubelet's hard
// threshold before the next pod's grace plus the margin, that pod is evicted with its grace
// cut to fit, one at a time without per-pod usage; DaemonSet, mirror and critical pods and
// reprieve itself are never touched; the taint goes a whole transition period after the
// signal came back above threshold plus minimum reclaim.
func TestPressureTaintsAndEvictsGracefully(t *testing.T) {
	yes := true
	critical := int32(2000001000)
	h := newHarness(t, pressureConfig(t), testNode(),
		pressurePod("ds", 30, func(p *v1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "d", Controller: &yes}}
		}),
		pressurePod("mirror", 30, func(p *v1.Pod) { p.Annotations = map[string]string{v1.MirrorPodAnnotationKey: "x"} }),
		pressurePod("critical", 30, func(p *v1.Pod) { p.Spec.Priority = &critical }),
		pressurePod("web", 30),
		pressurePod("batch", 30, func(p *v1.Pod) { low := int32(-5); p.Spec.Priority = &low }),
	)
	for range 3 {
		h.observe(2048)
	}
	if h.hasPressureTaint() || len(h.evictions()) > 0 {
		t.Fatal("a taint or an eviction with memory well above the threshold")
	}
	// Crossing 1Gi, falling 100 MiB/s: the hard threshold (100Mi) is about 9 s away, less
	// than 30 s of grace + 5 s of margin: the lowest-priority pod goes now, with what fits.
	h.observe(1000)
	if !h.hasPressureTaint() {
		t.Fatal("no reprieve.io/memory-pressure taint one reading after crossing the threshold")
	}
	h.observe(900)
	evs := h.evictions()
	if len(evs) != 1 || evs[0].Name != "batch" {
		t.Fatalf("evictions %v, want batch alone (lowest priority)", evictionNames(evs))
	}
	// The fit over the last three readings (2048, 1000, 900) is steeper than 100 MiB/s: the
	// grace is cut to the estimate minus margin and request allowance, far below 30 s.
	if g := *evs[0].DeleteOptions.GracePeriodSeconds; g < 1 || g > 4 {
		t.Fatalf("batch evicted with %d s of grace, want the estimate's 1-4 s", g)
	}
	if evs[0].DeleteOptions.Preconditions == nil || *evs[0].DeleteOptions.Preconditions.UID != "batch" {
		t.Fatal("pressure eviction without a UID precondition")
	}
	// batch is still terminating: without per-pod usage nothing else goes meanwhile.
	h.observe(850)
	if n := len(h.evictions()); n != 1 {
		t.Fatalf("%d evictions while the first is in flight, want 1", n)
	}
	// batch is gone; the signal still falls: web is next, never ds, mirror or critical.
	if err := h.client.CoreV1().Pods("ns").Delete(h.ctx, "batch", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.syncStores()
	h.observe(800)
	if got := evictionNames(h.evictions()); !slices.Equal(got, []string{"batch", "web"}) {
		t.Fatalf("evictions %v, want batch then web", got)
	}
	// Back above threshold + minimum reclaim (1124Mi): the taint stays for the transition period.
	h.observe(2048)
	for range 28 {
		h.observe(2048)
	}
	if !h.hasPressureTaint() {
		t.Fatal("taint removed before the transition period")
	}
	h.observe(2048)
	if h.hasPressureTaint() {
		t.Fatal("taint still on a transition period after the pressure ended")
	}
	events := strings.Join(h.drainEvents(), "\n")
	for _, want := range []string{ReasonPressureDetected, ReasonPressureEviction, ReasonPressureCleared} {
		if !strings.Contains(events, want) {
			t.Errorf("no %s event in\n%s", want, events)
		}
	}
}

func evictionNames(evs []*policyv1.Eviction) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Name)
	}
	return out
}

// A failed reading keeps the state: no taint removed, no eviction, an error counted.
func TestPressureReadErrorKeepsState(t *testing.T) {
	h := newHarness(t, pressureConfig(t), testNode(), pressurePod("web", 30))
	h.observe(2048)
	h.observe(1000)
	if !h.hasPressureTaint() {
		t.Fatal("no taint")
	}
	h.src.sample, h.src.err = kubelet.Sample{}, errors.New("reading /host/proc/meminfo: permission denied")
	for range 40 {
		h.clock.Step(time.Second)
		h.a.observePressure(h.ctx)
		h.a.reconcile(h.ctx)
		h.syncStores()
	}
	if !h.hasPressureTaint() {
		t.Fatal("a failing source removed the taint")
	}
	if n := len(h.evictions()); n != 0 {
		t.Fatalf("%d evictions without a reading", n)
	}
}

// A restarted agent finds its own pressure taint and keeps it until the transition period
// shows the pressure is over: no lost taint, no flap.
func TestPressureTaintSurvivesRestart(t *testing.T) {
	n := testNode()
	added := metav1.NewTime(t0.Add(-time.Minute))
	n.Spec.Taints = []v1.Taint{{Key: "reprieve.io/memory-pressure", Value: "true", Effect: v1.TaintEffectNoSchedule, TimeAdded: &added}}
	n.Annotations = map[string]string{AnnotationOwned: `{"taints":["reprieve.io/memory-pressure:NoSchedule"]}`}
	h := newHarness(t, pressureConfig(t), n)
	h.src.memory(2048)
	if err := h.a.startPressure(h.ctx); err != nil {
		t.Fatal(err)
	}
	h.a.reconcile(h.ctx)
	h.syncStores()
	if !h.hasPressureTaint() {
		t.Fatal("restart removed the pressure taint at once")
	}
	for range 30 {
		h.observe(2048)
	}
	if h.hasPressureTaint() {
		t.Fatal("pressure taint kept past the transition period")
	}
}

// While an interruption is pending, a pressure eviction's grace is bounded by the window too:
// a pod that tolerates the interruption taint forever, evicted for pressure, still ends
// before the window's end.
func TestPressureEvictionFitsTheInterruptionWindow(t *testing.T) {
	h := newHarness(t, pressureConfig(t), testNode(), pressurePod("web", 60, func(p *v1.Pod) {
		p.Spec.Tolerations = []v1.Toleration{spotToleration(nil)}
	}))
	h.notice(t0.Add(42 * time.Second)) // window end: 42 s - 5 s margin
	// Falling 10 MiB/s from 1000 MiB: the hard threshold (100Mi) comes within 60 s of grace +
	// 5 s of margin after about 25 s. The estimate would allow about 59 s of grace; the window
	// leaves about 10.
	for i := range 40 {
		h.observe(int64(1000 - 10*i))
		if len(h.evictions()) > 0 {
			break
		}
	}
	evs := h.evictions()
	if len(evs) != 1 || evs[0].Name != "web" {
		t.Fatalf("evictions %v, want web", evictionNames(evs))
	}
	end := t0.Add(37 * time.Second)
	if left := end.Sub(h.clock.Now()); left < 5*time.Second || time.Duration(*evs[0].DeleteOptions.GracePeriodSeconds)*time.Second > left {
		t.Fatalf("grace %d s outlives the interruption window (%v left)", *evs[0].DeleteOptions.GracePeriodSeconds, left)
	}
}
