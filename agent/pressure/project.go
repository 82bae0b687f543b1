package pressure

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// podUsageKey names one pod's usage of one kind over time.
type podUsageKey struct {
	uid  types.UID
	kind usageKind
}

// usageKind is what a pod's usage series measures.
type usageKind int

const (
	usageMemory usageKind = iota
	usageProcesses
	usageRootfs
	usageLocal // logs and volumes
)

// observePods records each pod's usage of this reading (at the memory reading's measurement
// time, as the Summary API serves them together), and forgets the pods no longer read. Each
// series keeps the trend window's readings, and the drops of TrendHistory.
func (lp *Loop) observePods(now time.Time, levels []Level, sample kubelet.Sample) {
	if sample.Pods == nil {
		return
	}
	at := now
	capacity := map[usageKind]int64{}
	for _, l := range levels {
		switch l.Signal {
		case kubelet.MemoryAvailable:
			at = l.At
			capacity[usageMemory] = l.Capacity
		case kubelet.PIDAvailable:
			capacity[usageProcesses] = l.Capacity
		case kubelet.NodeFsAvailable:
			capacity[usageLocal] = l.Capacity
			capacity[usageRootfs] = l.Capacity
		}
	}
	add := func(uid types.UID, kind usageKind, v int64) {
		k := podUsageKey{uid, kind}
		ts := lp.pods[k]
		if ts == nil {
			ts = &series{}
			lp.pods[k] = ts
		}
		// The window's readings; the drops of the trend's history (podsSawtooth).
		ts.addKeeping(at, float64(v), capacity[kind], lp.o.TrendWindow, lp.o.TrendWindow, max(lp.o.TrendWindow, TrendHistory))
	}
	for uid, u := range sample.Pods {
		add(uid, usageMemory, u.MemoryWorkingSet)
		add(uid, usageProcesses, u.Processes)
		if !sample.PodsMemoryAndPIDsOnly {
			local := u.Logs.Bytes
			for _, v := range u.Volumes {
				local += v.Bytes
			}
			add(uid, usageRootfs, u.Rootfs.Bytes)
			add(uid, usageLocal, local)
		}
	}
	for k := range lp.pods {
		if _, ok := sample.Pods[k.uid]; !ok {
			delete(lp.pods, k)
		}
	}
	lp.rootfsOnImageFs = sample.DedicatedImageFs && !sample.SplitContainerFs
}

// project ranks cs where the kubelet would rank them: at the pass where its threshold is met,
// ttl from now, on the stats of that pass (synchronize ranks on the summary it just read). Each
// pod's usage is carried forward by its own trend over the window, when that trend is beyond
// the noise: a pod leaking 50 MiB/s is ranked by what it will use then, not by what it uses now,
// so that reprieve evicts the pod the kubelet would, and frees what the kubelet would free
// (issue 47: ranked on the usage of now, reprieve took a large steady pod first, then the leaking
// one anyway). Pods without figures, and signals without a time to the threshold, are left as
// they are.
func (lp *Loop) project(s kubelet.Signal, cs []Candidate, ttl time.Duration) []Candidate {
	if ttl == Never || ttl <= 0 {
		return cs
	}
	moved := false
	for i := range cs {
		c := &cs[i]
		if !c.Known {
			continue
		}
		var slope float64
		for _, k := range lp.kindsOf(s) {
			if ts := lp.pods[podUsageKey{c.Pod.UID, k}]; ts != nil {
				if e := ts.estimate(lp.o.TrendWindow); e.Rising || e.Falling {
					slope += e.Slope
				}
			}
		}
		if slope != 0 {
			c.Usage = max(satAdd(c.Usage, int64(slope*ttl.Seconds())), 0)
			moved = true
		}
	}
	if moved {
		Rank(s, cs)
	}
	return cs
}

// kindsOf is what a pod's usage of s is made of (Candidates, diskUsage); the inode signals are
// not projected.
func (lp *Loop) kindsOf(s kubelet.Signal) []usageKind {
	switch s {
	case kubelet.MemoryAvailable, kubelet.AllocatableMemoryAvailable:
		return []usageKind{usageMemory}
	case kubelet.PIDAvailable:
		return []usageKind{usageProcesses}
	case kubelet.NodeFsAvailable:
		if lp.rootfsOnImageFs {
			return []usageKind{usageLocal}
		}
		return []usageKind{usageLocal, usageRootfs}
	case kubelet.ImageFsAvailable:
		if lp.rootfsOnImageFs {
			return []usageKind{usageRootfs}
		}
		return []usageKind{usageLocal, usageRootfs}
	}
	return nil
}

// explainedShare is how much of a memory signal's fall the pods in their own sawtooth must
// explain for their peaks to bound it (podsSawtooth).
const explainedShare = 0.8

// podsSawtooth reports whether l's fall is the pods' own sawtooth, not headed for the hard
// threshold: the pods whose memory grows after a drop of theirs (a collector that freed, a cache
// dropped; in the last 5 minutes) and below the lowest of their peaks (ceiling) grow at 80% or more of the
// fall's pace, and what they can still take until those peaks leaves the signal above the hard
// threshold. The node may then fall as far as they did before, no further, and the kubelet left
// it alone there. Memory signals, with per-pod usage; a pod past its peak is no sawtooth's.
func (lp *Loop) podsSawtooth(l Level, e Estimate) bool {
	var pace, room float64
	for k, ts := range lp.pods {
		if k.kind != usageMemory || len(ts.points) == 0 {
			continue
		}
		pe := ts.estimate(lp.o.TrendWindow)
		if !pe.Rising {
			continue
		}
		peak, ok := ts.ceiling()
		usage := ts.points[len(ts.points)-1].value
		if !ok || usage > peak+pe.Noise*slopeK {
			continue
		}
		pace += pe.Slope
		room += max(peak-usage, 0)
	}
	if pace <= 0 || pace < -e.Slope*explainedShare {
		return false
	}
	return float64(l.Effective())-room-slopeK*e.Noise > float64(l.Hard)
}

// unexplained reports whether the pods' own growth explains less than half of s's fall e, when
// their figures for s are known (known): the pods' usage series of what s measures, each rising
// beyond its noise, added up.
func (lp *Loop) unexplained(s kubelet.Signal, e Estimate, known bool) bool {
	kinds := lp.kindsOf(s)
	if !known || len(kinds) == 0 || e.Slope >= 0 {
		return false
	}
	var growth float64
	for k, ts := range lp.pods {
		if !slices.Contains(kinds, k.kind) {
			continue
		}
		if pe := ts.estimate(lp.o.TrendWindow); pe.Rising {
			growth += pe.Slope
		}
	}
	return growth < -e.Slope/2
}
