package pressure

import (
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
// series keeps the trend window only.
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
		ts.add(at, float64(v), capacity[kind], lp.o.TrendWindow, lp.o.TrendWindow)
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
