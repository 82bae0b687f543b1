package replay

import (
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// Namespace is the namespace of every pod of a replay; a pod's UID is its name.
const Namespace = "ns"

// minKill is the least time the kubelet gives a container to stop, whatever grace it was asked
// for (minimumGracePeriodInSeconds, pkg/kubelet/kuberuntime/kuberuntime_container.go): a pod
// evicted with 1 s still holds its memory for 2 s.
const minKill = 2 * time.Second

// world is a series as it would have gone with some of its pods ended earlier than in the
// recording: from the moment a pod has ended, what it used is free again (its memory, its
// processes, its disk) and it has no usage figures. A pod the recording shows ending later
// (the kubelet evicted it) has figures of zero from then on in the recording itself.
type world struct {
	s *Series
	// ended holds the pods ended (by reprieve, or by the kubelet in KubeletEvictions' model),
	// with when.
	ended map[string]time.Duration
}

func newWorld(s *Series) *world { return &world{s: s, ended: map[string]time.Duration{}} }

// end records that pod ended at at (the first end counts).
func (w *world) end(pod string, at time.Duration) {
	if _, ok := w.ended[pod]; !ok {
		w.ended[pod] = at
	}
}

func (w *world) endedBy(pod string, at time.Duration) bool {
	e, ok := w.ended[pod]
	return ok && e <= at
}

// sample is reading i as the source would have read it in this world: the recording's figures,
// plus what the pods ended by then no longer use.
func (w *world) sample(i int, t0 time.Time) kubelet.Sample {
	r := w.s.Readings[i]
	at := time.Duration(r.AtMs) * time.Millisecond
	var freed Usage
	pods := map[types.UID]kubelet.PodUsage{}
	for name, u := range r.Pods {
		if w.endedBy(name, at) {
			freed.Memory += u.Memory
			freed.Processes += u.Processes
			freed.Rootfs += u.Rootfs
			freed.Local += u.Local
			continue
		}
		pu := kubelet.PodUsage{Namespace: Namespace, Name: name, UID: types.UID(name), MemoryWorkingSet: u.Memory, Processes: u.Processes}
		if w.s.Source == "summary" {
			pu.Rootfs = kubelet.FsUsage{Bytes: u.Rootfs}
			pu.Logs = kubelet.FsUsage{Bytes: u.Local}
			pu.RootfsOnImageFs = w.s.DedicatedImageFs
		}
		pods[pu.UID] = pu
	}
	obs := kubelet.Observations{}
	for sig, v := range r.Node {
		o := kubelet.Observation{Available: v[0], Capacity: v[1]}
		switch {
		case r.MeasuredMs != nil:
			o.Time = t0.Add(time.Duration(*r.MeasuredMs) * time.Millisecond)
		case w.s.Source == "summary":
			o.Time = t0.Add(at)
		}
		switch sig {
		case kubelet.MemoryAvailable, kubelet.AllocatableMemoryAvailable:
			o.Available += freed.Memory
		case kubelet.PIDAvailable:
			o.Available += freed.Processes
		case kubelet.NodeFsAvailable:
			o.Available += freed.Local
			if !w.s.DedicatedImageFs {
				o.Available += freed.Rootfs
			}
		case kubelet.ImageFsAvailable:
			o.Available += freed.Rootfs
			if !w.s.DedicatedImageFs {
				o.Available += freed.Local
			}
		}
		o.Available = min(o.Available, o.Capacity)
		obs[sig] = o
	}
	sample := kubelet.Sample{Node: obs, Pods: pods, DedicatedImageFs: w.s.DedicatedImageFs, PodsMemoryAndPIDsOnly: w.s.Source == "host"}
	if r.ImageFsUsed > 0 {
		sample.ImageFsUsed = r.ImageFsUsed
	}
	return sample
}
