package kubelet

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Signal is an eviction signal, spelled as the kubelet spells it (pkg/kubelet/eviction/api).
type Signal string

// The eviction signals reprieve reads. The kubelet also knows containerfs.*, which it derives
// from the nodefs or imagefs thresholds and never reads as given (UpdateContainerFsThresholds);
// reprieve ignores them too (see Config.Ignored).
const (
	MemoryAvailable Signal = "memory.available"
	// AllocatableMemoryAvailable is the pods cgroup's memory: what is available below its limit
	// (node allocatable), observed on the Summary API's "pods" system container as the kubelet's
	// makeSignalObservations does. The kubelet copies every hard memory.available threshold to
	// it when enforceNodeAllocatable holds "pods" (addAllocatableThresholds).
	AllocatableMemoryAvailable Signal = "allocatableMemory.available"
	NodeFsAvailable            Signal = "nodefs.available"
	NodeFsInodesFree           Signal = "nodefs.inodesFree"
	ImageFsAvailable           Signal = "imagefs.available"
	ImageFsInodesFree          Signal = "imagefs.inodesFree"
	PIDAvailable               Signal = "pid.available"
)

// Signals lists every signal, in the order above.
var Signals = []Signal{
	MemoryAvailable,
	AllocatableMemoryAvailable,
	NodeFsAvailable,
	NodeFsInodesFree,
	ImageFsAvailable,
	ImageFsInodesFree,
	PIDAvailable,
}

// Valid reports whether s is one of Signals.
func (s Signal) Valid() bool { return signalIndex(s) >= 0 }

func signalIndex(s Signal) int {
	for i, x := range Signals {
		if x == s {
			return i
		}
	}
	return -1
}

// Observation is one signal's reading: what is available out of what capacity (bytes, inodes or
// PIDs). Available can be negative for pid.available, as in the kubelet, when more tasks run than
// the limit it computes.
type Observation struct {
	Available, Capacity int64
	// Reclaimable is what the kubelet deletes on the signal's filesystem before it evicts pods
	// for it (reclaimNodeLevelResources: unused images and dead containers), as far as the
	// source can tell (Sample.SetReclaimable); 0 for the other signals, and unknown (0) with
	// the host source.
	Reclaimable int64
	// Time is when the source measured it; zero when it was read just now (the host source).
	// The Summary API serves stats that the kubelet refreshes about every 10 s: a trend must
	// use their own time, and skip a reading it has already seen.
	Time time.Time
}

// Observations holds one Observation per signal that could be read.
type Observations map[Signal]Observation

// PodUsage is one pod's usage (from the Summary API).
type PodUsage struct {
	Namespace, Name string
	UID             types.UID
	// MemoryWorkingSet is the pod's memory working set, in bytes.
	MemoryWorkingSet int64
	// EphemeralStorage is the pod's ephemeral-storage usedBytes.
	EphemeralStorage int64
	// Processes is the pod's process count.
	Processes int64
	// Inodes is the inodes the pod's ephemeral storage uses (rootfs, logs, local volumes).
	Inodes int64
	// Rootfs and Logs are the pod's containers' writable layers and logs, summed over its
	// containers, and Volumes each of its volumes by name: the parts the kubelet's eviction
	// ranking adds up for a disk signal (podDiskUsage), where EphemeralStorage and Inodes are
	// the pod's totals.
	Rootfs, Logs FsUsage
	Volumes      map[string]FsUsage
	// RootfsOnImageFs is true when the writable layers live on a dedicated imagefs (the
	// sample's DedicatedImageFs): they then count for imagefs signals, not for nodefs ones.
	RootfsOnImageFs bool
}

// FsUsage is what one part of a pod's storage uses: bytes and inodes.
type FsUsage struct {
	Bytes, Inodes int64
}

// Sample is one reading of the node. Pods is nil when the source has no per-pod usage (the host
// source).
type Sample struct {
	Node Observations
	Pods map[types.UID]PodUsage
	// DedicatedImageFs is true when the image store is on a filesystem of its own, judged by
	// its capacity differing from nodefs's. Only then does the kubelet not free nodefs by
	// deleting unused images before it evicts pods for nodefs.
	DedicatedImageFs bool
	// PodsMemoryAndPIDsOnly is true when Pods holds memory and process figures alone (the host
	// source reads them from the pods' cgroups): the disk signals then have no per-pod usage.
	PodsMemoryAndPIDsOnly bool
	// SplitContainerFs is true when the containers' writable layers are on a filesystem apart
	// from the images (KEP-4191, KubeletSeparateDiskGC; the Summary API's runtime.containerFs
	// differing from runtime.imageFs): the writable layers are then on nodefs.
	SplitContainerFs bool
	// ImageFsUsed is what the images take on the image filesystem: the Summary API's
	// node.runtime.imageFs.usedBytes (the runtime's image filesystem usage, which with
	// containerd also holds the containers' writable layers); 0 when not read (the host source).
	ImageFsUsed int64
}

// Source reads the node's signals. A partial read returns what it could read and an error naming
// what failed.
type Source interface {
	Read(ctx context.Context) (Sample, error)
}

// SetReclaimable sets each image filesystem signal's Reclaimable from ImageFsUsed: the bytes the
// images take, less the containers' writable layers when they are on that filesystem too (with
// containerd the runtime's usage counts every snapshot). The kubelet deletes unused images and
// dead containers before it evicts for imagefs.available, and for nodefs.available when the
// images share nodefs (buildSignalToNodeReclaimFuncs); its image garbage collection also frees
// them from imageGCHighThresholdPercent on. Which images are in use the Summary API does not say:
// this counts them all, the most the kubelet's reclaim can free. Without ImageFsUsed (the host
// source) nothing is set.
func (s *Sample) SetReclaimable() {
	if s.ImageFsUsed <= 0 {
		return
	}
	images := s.ImageFsUsed
	if !s.SplitContainerFs {
		for _, u := range s.Pods {
			images -= u.Rootfs.Bytes
		}
	}
	images = max(images, 0)
	set := func(sig Signal) {
		if o, ok := s.Node[sig]; ok {
			o.Reclaimable = images
			s.Node[sig] = o
		}
	}
	set(ImageFsAvailable)
	if !s.DedicatedImageFs {
		set(NodeFsAvailable)
	}
}
