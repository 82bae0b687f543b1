package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/reprieve-dev/reprieve/test/scenario"
)

const gi, mi = int64(1) << 30, int64(1) << 20

// fakeKubelet serves a Summary API whose node memory the test scripts: available falls (or
// holds) linearly from base at rate bytes per second since since; pods report their usage.
type fakeKubelet struct {
	mu    sync.Mutex
	base  int64
	rate  int64 // bytes per second, negative when falling
	since time.Time
	pods  map[*v1.Pod]int64
	// leaker, when set, is the pod whose working set grows as available memory falls: the fall
	// is its leak, as the kubelet's Summary API shows one (the pod's cgroup grows with the
	// node's working set; the real-node tests' hogs do). issue 47's predictor acts on a fall a
	// pod's growth explains, and waits out one that no pod explains for its whole horizon.
	leaker *v1.Pod
	leaked int64 // what the leaker had leaked by since
}

// leakedLocked is what the leaker has leaked by t; k.mu held.
func (k *fakeKubelet) leakedLocked(t time.Time) int64 {
	if k.since.IsZero() || k.rate >= 0 {
		return k.leaked
	}
	return k.leaked + int64(float64(-k.rate)*t.Sub(k.since).Seconds())
}

func (k *fakeKubelet) availableAt(t time.Time) int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.base + int64(float64(k.rate)*t.Sub(k.since).Seconds())
}

// set makes available base from now on, changing at rate.
func (k *fakeKubelet) set(base, rate int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := time.Now()
	k.leaked = k.leakedLocked(now)
	k.base, k.rate, k.since = base, rate, now
}

func (k *fakeKubelet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/stats/summary" {
		http.NotFound(w, r)
		return
	}
	avail := uint64(max(k.availableAt(time.Now()), 0))
	ws := uint64(8*gi) - avail
	s := statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{NodeName: "pressure-node",
		Memory: &statsv1alpha1.MemoryStats{AvailableBytes: &avail, WorkingSetBytes: &ws}}}
	k.mu.Lock()
	now := time.Now()
	for p, u := range k.pods {
		if p == k.leaker {
			u += k.leakedLocked(now)
		}
		u := uint64(u)
		s.Pods = append(s.Pods, statsv1alpha1.PodStats{
			PodRef: statsv1alpha1.PodReference{Name: p.Name, Namespace: p.Namespace, UID: string(p.UID)},
			Memory: &statsv1alpha1.MemoryStats{WorkingSetBytes: &u},
		})
	}
	k.mu.Unlock()
	_ = json.NewEncoder(w).Encode(s)
}

// TestPressure drives reprieve's local-pressure handling through a scripted kubelet Summary
// API, with the shipped ClusterRole, on the real API server:
//   - the reprieve.io/memory-pressure taint is on within one observation interval of the
//     signal crossing reprieve's threshold, with its timeAdded;
//   - once the fall would reach the kubelet's hard threshold (from its config file) before the
//     next pod's grace plus the margin, the pod the kubelet would pick is evicted through the
//     Eviction API with its grace cut to fit, and is gone before the hard threshold would have
//     been reached; a PodDisruptionBudget is respected (the next pod in rank goes instead);
//     mirror and system-critical pods are never touched; a DaemonSet's pod is ranked like any pod,
//     as the kubelet ranks it (issue 37 case 2), and uses little here;
//   - the taint goes a transition period after the signal came back, not before.
func TestPressure(t *testing.T) {
	// Not parallel: Go runs it alone, before the parallel tests start. Its pod may be evicted only
	// at the last reading that still leaves it 3 s (issue 47: precision first, a grace cut waits),
	// a window one reading wide; under -parallel 32 on two cores a reading came late past it in
	// two of four whole runs, and the pod was left to the kubelet. A pod held for that window now
	// goes at the reading that steps over it, with what fits (docs/pressure.md), but with less
	// than this test's bounds assume: it still runs alone.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, node = "pressure", "pressure-node"
	c := env.Client
	setupNode(ctx, t, ns, node, nil)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	// mirror uses a lot of memory but must never be evicted; ds is ranked like any pod (the
	// kubelet's rule) and uses little; quiet stays within its request.
	// Instant (here and in mkPod): it runs alone and only waits for its pods to run before the
	// agent starts.
	if err := scenario.Create(ctx, c, ns, node, taint, scenario.InstantAll([]scenario.Pod{
		{Name: "ds", Kind: scenario.DaemonSet}, {Name: "mirror", Kind: scenario.Mirror},
	})); err != nil {
		t.Fatal(err)
	}
	mkPod := func(namespace, name string, request string, grace int64, mutate func(*v1.Pod)) *v1.Pod {
		p := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{"app": name}},
			Spec: v1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: &grace, AutomountServiceAccountToken: new(bool),
				Containers: []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
					Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse(request)}}}}},
		}
		scenario.Instant(p)
		if mutate != nil {
			mutate(p)
		}
		p, err := c.CoreV1().Pods(namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// guarded exceeds its request the most, so it ranks first, but its PDB allows no disruption.
	guarded := mkPod(ns, "guarded", "100Mi", 30, nil)
	zero := intstr.FromInt32(0)
	if _, err := c.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "guarded"},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &zero,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hog := mkPod(ns, "hog", "100Mi", 30, nil)
	quiet := mkPod(ns, "quiet", "1Gi", 30, nil)
	// kube-system has no default ServiceAccount without kube-controller-manager.
	if _, err := c.CoreV1().ServiceAccounts("kube-system").Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	critical := mkPod("kube-system", "pressure-critical", "10Mi", 30, func(p *v1.Pod) { p.Spec.PriorityClassName = "system-node-critical" })
	defer func() {
		_ = c.CoreV1().Pods("kube-system").Delete(context.Background(), critical.Name, metav1.DeleteOptions{})
	}()
	waitFor(ctx, t, "the pods running", func() bool {
		list, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false
		}
		running := 0
		for _, p := range list.Items {
			if p.Status.Phase == v1.PodRunning {
				running++
			}
		}
		return running == 6
	})
	obs, err := scenario.Observe(ctx, c, ns)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Stop()
	podsIn := func() map[*v1.Pod]int64 {
		// hog leaks the fall (fakeKubelet.leaker): about 1.1 GiB by the hard threshold, 2 GiB in
		// all; guarded still uses more there, so the kubelet would pick it first.
		out := map[*v1.Pod]int64{guarded: 2300 * mi, hog: 900 * mi, quiet: 200 * mi, critical: 3 * gi}
		for name, usage := range map[string]int64{"ds": 50 * mi, "mirror": 3 * gi} {
			p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out[p] = usage
		}
		return out
	}()
	kl := &fakeKubelet{pods: podsIn, leaker: hog}
	kl.set(2*gi+80*mi, -20*mi) // crosses 2Gi in 4 s; the hard threshold is 50 s away
	srv := httptest.NewServer(kl)
	defer srv.Close()

	// The kubelet's own config: evictionHard memory.available<1Gi (which zeroes its other
	// defaults).
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "kubelet-config.yaml")
	if err := os.WriteFile(cfgPath, []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard:\n  memory.available: 1Gi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const interval, transition, margin = 500 * time.Millisecond, 3 * time.Second, 2 * time.Second
	rp, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none",
		"--pressure-source=summary", "--kubelet-summary-url="+srv.URL+"/stats/summary", "--kubelet-token-file="+filepath.Join(dir, "none"),
		"--host-root="+dir, "--kubelet-config=kubelet-config.yaml",
		"--pressure-thresholds=memory.available<2Gi", "--pressure-minimum-reclaim=memory.available=256Mi",
		"--pressure-interval="+interval.String(), "--pressure-trend-window=5s", "--pressure-transition-period="+transition.String(),
		"--safety-margin="+margin.String())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	const key = "reprieve.io/memory-pressure"
	crossAt := kl.since.Add(4 * time.Second)
	n := waitNode(ctx, t, node, "the memory-pressure taint", func(n *v1.Node) bool { return hasTaint(n, key, v1.TaintEffectNoSchedule) })
	seen := time.Now()
	t.Logf("taint seen %v after the crossing", seen.Sub(crossAt).Round(time.Millisecond))
	if late := seen.Sub(crossAt); late > interval+time.Second {
		t.Errorf("taint seen %v after the crossing, want within one interval (%v) plus the write", late, interval)
	}
	for _, tt := range n.Spec.Taints {
		if tt.Key == key && tt.TimeAdded == nil {
			t.Error("pressure taint without timeAdded")
		}
	}
	if recs := obs.Records(); !recs["hog"].DeletedAt.IsZero() {
		t.Fatal("hog evicted while the hard threshold was still far")
	}

	// The fall speeds up to 100 MiB/s: the hard threshold is about 9 s away.
	kl.set(kl.availableAt(time.Now()), -100*mi)
	accelerated := time.Now()
	hardAt := accelerated.Add(time.Duration(float64(kl.availableAt(accelerated)-gi) / float64(100*mi) * float64(time.Second)))
	waitFor(ctx, t, "hog evicted", func() bool { return !obs.Records()["hog"].DeletedAt.IsZero() })
	// The leak was the hog's: the fall stops with its eviction, and its memory comes back once
	// it is gone.
	kl.set(kl.availableAt(time.Now()), 0)
	waitFor(ctx, t, "hog gone", func() bool { return !obs.Records()["hog"].GoneAt.IsZero() })
	rec := obs.Records()["hog"]
	t.Logf("hog evicted %v after the fall sped up with %d s of grace; gone %v before the hard threshold would have been reached",
		rec.DeletedAt.Sub(accelerated).Round(time.Millisecond), rec.Grace, hardAt.Sub(rec.GoneAt).Round(time.Millisecond))
	if rec.Grace >= 30 || rec.Grace < 1 {
		t.Errorf("hog evicted with %d s of grace, want its 30 s cut to fit the estimate", rec.Grace)
	}
	if !rec.GoneAt.Before(hardAt) {
		t.Errorf("hog gone at %v, after the hard threshold's %v", rec.GoneAt, hardAt)
	}
	kl.mu.Lock()
	delete(kl.pods, hog)
	kl.mu.Unlock()
	kl.set(3*gi, 0)
	recovered := time.Now()

	waitNode(ctx, t, node, "the memory-pressure taint removed", func(n *v1.Node) bool { return !hasTaint(n, key, v1.TaintEffectNoSchedule) })
	if d := time.Since(recovered); d < transition-interval {
		t.Errorf("taint removed %v after the recovery, before the %v transition period", d, transition)
	}
	for _, name := range []string{"guarded", "quiet", "ds", "mirror"} {
		if r := obs.Records()[name]; !r.DeletedAt.IsZero() {
			t.Errorf("%s was evicted", name)
		}
	}
	if p, err := c.CoreV1().Pods("kube-system").Get(ctx, critical.Name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("the system-node-critical pod was touched: %v", err)
	}
	waitFor(ctx, t, "the "+events.ReasonEvictionBlocked+" event on the PDB-guarded pod", func() bool {
		evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=guarded,reason=" + events.ReasonEvictionBlocked})
		return err == nil && len(evs.Items) > 0
	})
	metrics, err := scenario.Scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`reprieve_pressure_evictions_total{signal="memory.available"} 1`,
		`reprieve_pressure_threshold_bytes{kind="kubelet_hard",signal="memory.available"} 1.073741824e+09`,
		`reprieve_pressure_active{resource="memory"} 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestPressureHostSource runs the real binary on this machine's own /proc, /sys and root
// filesystem (--pressure-source=host, the DaemonSet's default) with thresholds that cannot be
// crossed: every signal is read, with sane values, no read error, and no taint.
func TestPressureHostSource(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "pressure-host", "pressure-host-node"
	setupNode(ctx, t, ns, node, nil)
	rp, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none",
		"--pressure-source=host", "--host-root=/", "--kubelet-root-dir=/", "--imagefs-dir=/", "--kubelet-config=/nonexistent/config.yaml",
		"--pressure-thresholds=memory.available<1Ki,nodefs.available<1Ki,nodefs.inodesFree<1,imagefs.available<1Ki,imagefs.inodesFree<1,pid.available<1",
		"--pressure-interval=200ms")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	var metrics string
	waitFor(ctx, t, "every signal in the metrics", func() bool {
		metrics, _ = scenario.Scrape(addr)
		return strings.Contains(metrics, `reprieve_pressure_available_pids{signal="pid.available"}`) &&
			strings.Contains(metrics, `reprieve_pressure_available_inodes{signal="imagefs.inodesFree"}`)
	})
	values := map[string]float64{}
	for _, line := range strings.Split(metrics, "\n") {
		// One metric per unit: _bytes, _inodes, _pids.
		name, rest, _ := strings.Cut(line, "{")
		if !strings.HasPrefix(name, "reprieve_pressure_available_") {
			continue
		}
		if v, ok := strings.CutPrefix(rest, `signal="`); ok {
			name, num, _ := strings.Cut(v, `"} `)
			f, err := strconv.ParseFloat(num, 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			values[name] = f
		}
	}
	meminfo, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(string(meminfo), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			total = kb * 1024
		}
	}
	t.Logf("signals read on this machine: %v (MemTotal %.0f)", values, total)
	if m := values["memory.available"]; m <= 0 || m >= total {
		t.Errorf("memory.available %v, want between 0 and MemTotal %v", m, total)
	}
	for _, s := range []string{"nodefs.available", "nodefs.inodesFree", "imagefs.available", "imagefs.inodesFree", "pid.available"} {
		if values[s] <= 0 {
			t.Errorf("%s = %v, want > 0", s, values[s])
		}
	}
	if !strings.Contains(metrics, "reprieve_pressure_read_errors_total 0") {
		t.Error("pressure read errors on this machine's own host files")
	}
	if n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil || hasTaint(n, "reprieve.io/memory-pressure", v1.TaintEffectNoSchedule) {
		t.Errorf("a pressure taint with thresholds that cannot be crossed: %v", err)
	}
}
