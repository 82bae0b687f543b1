package replay

import (
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/reprieve-dev/reprieve/agent/pressure"
	"github.com/reprieve-dev/reprieve/kubelet"
)

// KubeletEvictions labels a synthetic series as the kubelet's eviction manager would have
// handled it without reprieve (pkg/kubelet/eviction, synchronize), hard thresholds only:
//   - at every reading (the kernel's memory-cgroup notification: the kubelet sees a crossing at
//     once, the worst case for reprieve; without it the kubelet's pass comes up to 10 s later),
//     a hard threshold is met while the signal is below it, and once met until it is back
//     above it plus its minimum reclaim (thresholdsMet, thresholdsNotYetResolved);
//   - for a disk signal it first deletes unused images: a series that models that carries it in
//     its readings, so no disk signal is evicted for here (the series' own readings show what
//     the reclaim left);
//   - it evicts the first pod ranked for the signal (rankMemoryPressure, rankPIDPressure: the
//     stats of that pass) with a 1 s grace, one pod at a time, the next only once the last has
//     ended (waitForPodsCleanup); the pod's usage is free again 2 s later (minKill).
//
// The ranking is pressure.Candidates, reprieve's copy of the kubelet's, fed with the usage at
// the pass that evicts.
func KubeletEvictions(s *Series) ([]KubeletEviction, error) {
	kc, err := kubelet.ParseConfig([]byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" + s.Kubelet))
	if err != nil {
		return nil, fmt.Errorf("series %s: the kubelet's configuration: %w", s.Name, err)
	}
	hard, reclaim := kc.EvictionHard()
	w := newWorld(s)
	var out []KubeletEviction
	met := map[kubelet.Signal]bool{}
	var inFlight string
	for i, r := range s.Readings {
		at := time.Duration(r.AtMs) * time.Millisecond
		sample := w.sample(i, t0)
		if inFlight != "" {
			if !w.endedBy(inFlight, at) {
				continue
			}
			inFlight = ""
		}
		// byEvictionPriority: memory first, then the others in the kubelet's order.
		var signal kubelet.Signal
		for _, t := range hard {
			o, ok := sample.Node[t.Signal]
			if !ok || pressure.ResourceOf(t.Signal) == pressure.Disk {
				continue
			}
			v := t.Value(o.Capacity)
			if m, ok := reclaim[t.Signal]; ok && met[t.Signal] {
				v += m.Value(o.Capacity)
			}
			met[t.Signal] = o.Available < v
			if met[t.Signal] && (signal == "" || pressure.ResourceOf(t.Signal) == pressure.Memory && pressure.ResourceOf(signal) != pressure.Memory) {
				signal = t.Signal
			}
		}
		if signal == "" {
			continue
		}
		var pods []*v1.Pod
		for _, p := range s.Pods {
			if w.endedBy(p.Name, at) {
				continue
			}
			if pod := podObject(p); pressure.Keep(pod, "", "") == "" {
				pods = append(pods, pod)
			}
		}
		usage := sample.Pods
		if sample.PodsMemoryAndPIDsOnly && pressure.ResourceOf(signal) == pressure.Disk {
			usage = nil
		}
		ranked := pressure.Candidates(signal, pods, usage, func(p *v1.Pod) time.Duration {
			return time.Duration(*p.Spec.TerminationGracePeriodSeconds) * time.Second
		})
		if len(ranked) == 0 {
			continue
		}
		name := ranked[0].Pod.Name
		out = append(out, KubeletEviction{Pod: name, AtMs: r.AtMs, Signal: signal, Grace: 1})
		w.end(name, at+minKill)
		inFlight = name
	}
	slices.SortStableFunc(out, func(a, b KubeletEviction) int { return int(a.AtMs - b.AtMs) })
	return out, nil
}
