package replay

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	k8srecord "k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/evict"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	"github.com/reprieve-dev/reprieve/agent/metrics"
	"github.com/reprieve-dev/reprieve/agent/pressure"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/kubelet"
)

// NodeName is the replayed node's name.
const NodeName = "replay-node"

// t0 is the fake clock's start: the series' first reading.
var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// Options are reprieve's settings for a replay. DefaultOptions are the agent's defaults, as the
// chart runs it (config.DefaultConfig; TestReplayOptionsAreTheAgentDefaults holds them equal).
type Options struct {
	Interval, TransitionPeriod, TrendWindow, SafetyMargin time.Duration
	// Headroom is --pressure-headroom, for a series whose thresholds are derived.
	Headroom float64
	// NoReclaimable replays as if the source had no image filesystem figures (the host source):
	// a disk signal then does not count what the kubelet's image garbage collection frees.
	NoReclaimable bool
	// CutEarly and AnyFall are the pressure loop's timeliness-first rules
	// (pressure.LoopOptions).
	CutEarly, AnyFall bool
}

// DefaultOptions are the agent's defaults.
func DefaultOptions() Options {
	return Options{Interval: time.Second, TransitionPeriod: time.Minute, TrendWindow: 20 * time.Second,
		SafetyMargin: 5 * time.Second, Headroom: 0.05}
}

// Action is one eviction (or grace cut of a terminating pod) reprieve asked for.
type Action struct {
	Pod string
	// At is when, from the series' start; Grace the grace asked; PodGrace what the pod asks
	// (its terminationGracePeriodSeconds).
	At, Grace, PodGrace time.Duration
	// Delete says it was a DELETE (a terminating pod's grace cut), not an eviction.
	Delete bool
}

// Run replays s through the pressure loop with o and scores it.
func Run(ctx context.Context, s *Series, o Options) (*Result, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	kc, err := kubelet.ParseConfig([]byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" + s.Kubelet))
	if err != nil {
		return nil, fmt.Errorf("series %s: the kubelet's configuration: %w", s.Name, err)
	}
	kc.Found, kc.Path = true, "replay"
	explicit, err := kubelet.ParseThresholds(s.Thresholds)
	if err != nil {
		return nil, fmt.Errorf("series %s: thresholds: %w", s.Name, err)
	}
	var reclaim map[kubelet.Signal]kubelet.Threshold
	if s.MinimumReclaim != "" {
		if reclaim, err = kubelet.ParseMinimumReclaim(s.MinimumReclaim); err != nil {
			return nil, fmt.Errorf("series %s: minimum reclaim: %w", s.Name, err)
		}
	}
	r := newRun(s, o)
	ctx = klog.NewContext(ctx, klog.Background().V(10)) // the loop's log lines would drown the report
	lp := pressure.NewLoop(pressure.LoopOptions{NodeName: NodeName, Source: r, SourceName: "replay",
		Thresholds: pressure.ThresholdsFrom(kc, explicit, o.Headroom, reclaim), KubeletConfig: kc,
		Interval: o.Interval, TransitionPeriod: o.TransitionPeriod, TrendWindow: o.TrendWindow,
		TaintEffect: string(v1.TaintEffectNoSchedule), SafetyMargin: o.SafetyMargin, CutEarly: o.CutEarly, AnyFall: o.AnyFall,
		Clock: r.clock, Metrics: r.metrics, Recorder: r.recorder, Pods: r.lister, Node: r.node,
		Executor: r.exec, Writer: r.writer})
	var tainted time.Duration
	for i := range s.Readings {
		at := time.Duration(s.Readings[i].AtMs) * time.Millisecond
		r.clock.SetTime(t0.Add(at))
		r.advance(at)
		r.mu.Lock()
		r.cur = i
		r.mu.Unlock()
		if i == 0 {
			if err := lp.Start(ctx); err != nil {
				return nil, fmt.Errorf("series %s: starting the pressure loop: %w", s.Name, err)
			}
		} else {
			lp.Observe(ctx)
		}
		if err := r.writer.Sync(ctx); err != nil {
			return nil, fmt.Errorf("series %s: writing the node: %w", s.Name, err)
		}
		if i+1 < len(s.Readings) && r.tainted(ctx) {
			tainted += time.Duration(s.Readings[i+1].AtMs-s.Readings[i].AtMs) * time.Millisecond
		}
	}
	return score(s, r.actions, tainted), nil
}

// run is one replay's world: the fake API server, the pods as the loop sees them, and what
// reprieve did.
type run struct {
	s       *Series
	o       Options
	w       *world
	clock   *clocktesting.FakeClock
	client  *fake.Clientset
	indexer cache.Indexer
	lister  corelisters.PodLister
	metrics *metrics.Metrics
	// recorder drops the loop's events (a nil channel).
	recorder *k8srecord.FakeRecorder
	exec     *evict.Executor
	writer   *record.Writer

	mu  sync.Mutex
	cur int
	// pods are the series' pods as they stand, by name; endAt when each terminating pod ends.
	pods  map[string]*v1.Pod
	endAt map[string]time.Duration
	// kubeletEnds is when each pod the kubelet evicted in the recording ended there.
	kubeletEnds map[string]time.Duration
	actions     []Action
}

func newRun(s *Series, o Options) *run {
	r := &run{s: s, o: o, w: newWorld(s), clock: clocktesting.NewFakeClock(t0), recorder: &k8srecord.FakeRecorder{},
		pods: map[string]*v1.Pod{}, endAt: map[string]time.Duration{}, kubeletEnds: map[string]time.Duration{}}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: NodeName}}
	r.client = fake.NewClientset(node)
	// A DELETE (a terminating pod's grace cut) leaves the pod terminating with the shorter grace,
	// as the API server does; the fake clientset would remove it at once.
	r.client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		d := a.(k8stesting.DeleteActionImpl)
		grace := time.Duration(0)
		if g := d.DeleteOptions.GracePeriodSeconds; g != nil {
			grace = time.Duration(*g) * time.Second
		}
		r.terminate(d.Name, grace, true)
		return true, nil, nil
	})
	r.indexer = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	r.lister = corelisters.NewPodLister(r.indexer)
	r.metrics, _ = metrics.New(prometheus.NewRegistry(), "replay")
	client := kubetest.Wrap(r.client)
	r.exec = evict.New(evict.Options{Client: client, Pods: r.lister, Clock: r.clock, Metrics: r.metrics, Recorder: r.recorder,
		NodeName: NodeName, SafetyMargin: o.SafetyMargin,
		Evict: func(_ context.Context, ev *policyv1.Eviction) error {
			grace := time.Duration(0)
			if g := ev.DeleteOptions.GracePeriodSeconds; g != nil {
				grace = time.Duration(*g) * time.Second
			}
			r.terminate(ev.Name, grace, false)
			return nil
		}})
	r.writer = record.NewWriter(record.WriterOptions{Client: client, NodeName: NodeName, Clock: r.clock})
	for _, e := range s.KubeletEvictions {
		if _, ok := r.kubeletEnds[e.Pod]; !ok {
			r.kubeletEnds[e.Pod] = time.Duration(e.AtMs)*time.Millisecond + max(time.Duration(e.Grace)*time.Second, minKill)
		}
	}
	for _, p := range s.Pods {
		r.pods[p.Name] = podObject(p)
		_ = r.indexer.Add(r.pods[p.Name])
	}
	return r
}

// podObject is p as the API server holds it.
func podObject(p Pod) *v1.Pod {
	grace, prio := p.Grace, p.Priority
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: Namespace, UID: types.UID(p.Name)},
		Spec: v1.PodSpec{NodeName: NodeName, TerminationGracePeriodSeconds: &grace, Priority: &prio,
			Containers: []v1.Container{{Name: "c"}}},
		Status: v1.PodStatus{Phase: v1.PodRunning},
	}
	if p.MemoryRequest != "" {
		pod.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse(p.MemoryRequest)}
	}
	if p.DaemonSet {
		yes := true
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: p.Name, UID: "ds", Controller: &yes}}
	}
	if p.EmptyDir {
		pod.Spec.Volumes = []v1.Volume{{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
	}
	return pod
}

// advance brings the pods to at: a rollout's DELETE that is due, the ends of terminating pods
// (their usage freed from then on), and the pods the kubelet evicted in the recording, gone
// from the API (Failed) once they ended there.
func (r *run) advance(at time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.s.Pods {
		pod := r.pods[p.Name]
		if pod == nil {
			continue
		}
		if p.DeletedAtMs != nil && pod.DeletionTimestamp == nil && time.Duration(*p.DeletedAtMs)*time.Millisecond <= at {
			r.setTerminating(p.Name, time.Duration(*p.DeletedAtMs)*time.Millisecond, time.Duration(p.DeletionGrace)*time.Second)
		}
		if end, ok := r.endAt[p.Name]; ok && end <= at {
			r.w.end(p.Name, end)
			r.remove(p.Name)
			continue
		}
		if end, ok := r.kubeletEnds[p.Name]; ok && end <= at {
			// Gone in the recording: the kubelet's eviction. The loop sees a Failed pod.
			failed := pod.DeepCopy()
			failed.Status.Phase = v1.PodFailed
			_ = r.indexer.Update(failed)
			r.pods[p.Name] = failed
		}
	}
}

func (r *run) remove(name string) {
	if pod := r.pods[name]; pod != nil {
		_ = r.indexer.Delete(pod)
		delete(r.pods, name)
	}
}

// setTerminating marks pod name terminating from at with grace (a later DELETE only
// shortens it). Called with mu held.
func (r *run) setTerminating(name string, at, grace time.Duration) {
	pod := r.pods[name]
	if pod == nil {
		return
	}
	end := at + max(grace, minKill)
	if cur, ok := r.endAt[name]; ok && cur <= end {
		return
	}
	r.endAt[name] = end
	p := pod.DeepCopy()
	ts := metav1.NewTime(t0.Add(at + grace))
	secs := int64(grace / time.Second)
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &ts, &secs
	_ = r.indexer.Update(p)
	r.pods[name] = p
}

// terminate is reprieve's eviction (or DELETE) of pod name with grace, now.
func (r *run) terminate(name string, grace time.Duration, del bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now().Sub(t0)
	var podGrace time.Duration
	for _, p := range r.s.Pods {
		if p.Name == name {
			podGrace = time.Duration(p.Grace) * time.Second
		}
	}
	r.actions = append(r.actions, Action{Pod: name, At: now, Grace: grace, PodGrace: podGrace, Delete: del})
	r.setTerminating(name, now, grace)
}

// Read is the loop's source: the current reading, in this run's world.
func (r *run) Read(context.Context) (kubelet.Sample, error) {
	r.mu.Lock()
	i := r.cur
	r.mu.Unlock()
	sample := r.w.sample(i, t0)
	if r.o.NoReclaimable {
		sample.ImageFsUsed = 0
	}
	sample.SetReclaimable()
	return sample, nil
}

func (r *run) node() *v1.Node {
	n, err := r.client.CoreV1().Nodes().Get(context.Background(), NodeName, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return n
}

// tainted reports whether the node carries one of reprieve's pressure taints.
func (r *run) tainted(ctx context.Context) bool {
	n, err := r.client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	if err != nil {
		return false
	}
	return slices.ContainsFunc(n.Spec.Taints, func(t v1.Taint) bool {
		return slices.Contains([]string{pressure.TaintKey(pressure.Memory), pressure.TaintKey(pressure.Disk), pressure.TaintKey(pressure.PID)}, t.Key)
	})
}
