package pressure

import (
	"cmp"
	"math"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// SystemCriticalPriority is the priority from which a pod is critical
// (scheduling.SystemCriticalPriority): the kubelet never evicts those for pressure.
const SystemCriticalPriority = 2000000000

// Why a pod is left alone by the pressure loop.
const (
	KeepFinished    = "finished"
	KeepTerminating = "terminating"
	KeepCritical    = "critical"
	KeepDaemonSet   = "daemonset"
	KeepSelf        = "reprieve itself"
)

// Keep returns why the pressure loop must never evict pod, or "" when it may. Critical pods
// are those the kubelet's IsCriticalPod names: static and mirror pods and priority >=
// SystemCriticalPriority. DaemonSet pods are kept whatever --evict-daemonset-pods says: their
// controller would put them straight back on the pressured node. selfNamespace/selfName is
// reprieve's own pod.
func Keep(pod *v1.Pod, selfNamespace, selfName string) string {
	switch {
	case pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed:
		return KeepFinished
	case pod.DeletionTimestamp != nil:
		// Already going (an interruption eviction, or ours): a second request could only
		// change its grace, and an interruption's shortened grace must never grow.
		return KeepTerminating
	case isCritical(pod):
		return KeepCritical
	case isDaemonSetPod(pod):
		return KeepDaemonSet
	case selfName != "" && pod.Name == selfName && pod.Namespace == selfNamespace:
		return KeepSelf
	}
	return ""
}

func isCritical(pod *v1.Pod) bool {
	if _, mirror := pod.Annotations[v1.MirrorPodAnnotationKey]; mirror {
		return true
	}
	// Static pods carry their source; pods from the API server say "api" or nothing.
	if src, ok := pod.Annotations["kubernetes.io/config.source"]; ok && src != "api" {
		return true
	}
	return pod.Spec.Priority != nil && *pod.Spec.Priority >= SystemCriticalPriority
}

func isDaemonSetPod(pod *v1.Pod) bool {
	for _, ref := range pod.OwnerReferences {
		if ref.Controller != nil && *ref.Controller && ref.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}

// Candidates turns the evictable pods into candidates for signal s, with their usage of what s
// measures from usage (nil when the source has none) and their own grace, ranked as the kubelet
// ranks them for s.
func Candidates(s kubelet.Signal, pods []*v1.Pod, usage map[types.UID]kubelet.PodUsage, grace func(*v1.Pod) time.Duration) []Candidate {
	cs := make([]Candidate, 0, len(pods))
	for _, p := range pods {
		c := Candidate{Pod: p, Grace: grace(p)}
		if usage != nil {
			if u, ok := usage[p.UID]; ok {
				c.Known = true
				switch s {
				case kubelet.MemoryAvailable:
					c.Usage = u.MemoryWorkingSet
				case kubelet.NodeFsAvailable, kubelet.ImageFsAvailable:
					c.Usage = diskUsage(s, p, u).Bytes
				case kubelet.NodeFsInodesFree, kubelet.ImageFsInodesFree:
					c.Usage = diskUsage(s, p, u).Inodes
				case kubelet.PIDAvailable:
					c.Usage = u.Processes
				}
			}
		}
		cs = append(cs, c)
	}
	Rank(s, cs)
	return cs
}

// diskUsage is what pod uses on the filesystem that disk signal s measures, added up as the
// kubelet's podDiskUsage adds it with the stats buildSignalToRankFunc picks for s:
//   - with a dedicated imagefs, nodefs counts the containers' logs and the pod's local volumes,
//     and imagefs only the writable layers (the images themselves belong to no pod);
//   - on one shared filesystem, both count the writable layers, the logs and the local volumes.
//
// The pod's ephemeral-storage total is not used: it also holds Secret, downward API and projected
// volumes and /etc/hosts, which the kubelet does not rank by. reprieve does not model a
// containerfs split from imagefs (KubeletSeparateDiskGC).
func diskUsage(s kubelet.Signal, pod *v1.Pod, u kubelet.PodUsage) kubelet.FsUsage {
	imageFs := s == kubelet.ImageFsAvailable || s == kubelet.ImageFsInodesFree
	if u.RootfsOnImageFs && imageFs {
		return u.Rootfs
	}
	var sum kubelet.FsUsage
	add := func(f kubelet.FsUsage) {
		sum.Bytes = addSaturating(sum.Bytes, f.Bytes)
		sum.Inodes = addSaturating(sum.Inodes, f.Inodes)
	}
	if !u.RootfsOnImageFs {
		add(u.Rootfs)
	}
	add(u.Logs)
	for _, v := range pod.Spec.Volumes {
		if isLocalVolume(v) {
			add(u.Volumes[v.Name])
		}
	}
	return sum
}

// isLocalVolume is the kubelet's localVolumeNames test: a hostPath, or a local ephemeral
// volume as volumeutil.IsLocalEphemeralVolume names one (gitRepo, an emptyDir on disk, a
// configMap). A Secret or a memory-backed emptyDir is tmpfs and frees no disk.
func isLocalVolume(v v1.Volume) bool {
	return v.HostPath != nil || v.GitRepo != nil || v.ConfigMap != nil ||
		(v.EmptyDir != nil && v.EmptyDir.Medium == v1.StorageMediumDefault)
}

func addSaturating(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Rank orders candidates for signal s the way the kubelet's eviction manager does
// (rankMemoryPressure, rankDiskPressureFunc, rankPIDPressure):
//   - memory and disk: a pod without usage figures first, then pods whose usage exceeds their
//     request, then lower priority first, then the larger usage above request first;
//   - PID: lower priority first, then, among equals, a pod without figures, then more processes.
//
// Requests are the pod's requests as the kubelet's GetResourceRequestQuantity computes them.
// Inodes have no request: any use exceeds it (exceedDiskRequests), but the usage above request
// has the pod's ephemeral-storage request subtracted from its inode count, as the kubelet's
// disk() does. Ties keep the input order.
func Rank(s kubelet.Signal, cs []Candidate) {
	var exceedName, aboveName v1.ResourceName
	switch s {
	case kubelet.MemoryAvailable:
		exceedName, aboveName = v1.ResourceMemory, v1.ResourceMemory
	case kubelet.NodeFsAvailable, kubelet.ImageFsAvailable:
		exceedName, aboveName = v1.ResourceEphemeralStorage, v1.ResourceEphemeralStorage
	case kubelet.NodeFsInodesFree, kubelet.ImageFsInodesFree:
		aboveName = v1.ResourceEphemeralStorage
	}
	exceeds := func(c Candidate) bool { return c.Usage > requestOf(c.Pod, exceedName) }
	above := func(c Candidate) int64 { return c.Usage - requestOf(c.Pod, aboveName) }
	unknownFirst := func(a, b Candidate) int {
		switch {
		case a.Known == b.Known:
			return 0
		case !a.Known:
			return -1
		}
		return 1
	}
	slices.SortStableFunc(cs, func(a, b Candidate) int {
		if s == kubelet.PIDAvailable {
			if c := cmp.Compare(priorityOf(a.Pod), priorityOf(b.Pod)); c != 0 {
				return c
			}
			if c := unknownFirst(a, b); c != 0 || !a.Known {
				return c
			}
			return cmp.Compare(b.Usage, a.Usage)
		}
		if c := unknownFirst(a, b); c != 0 {
			return c
		}
		if a.Known {
			if ea, eb := exceeds(a), exceeds(b); ea != eb {
				if ea {
					return -1
				}
				return 1
			}
		}
		if c := cmp.Compare(priorityOf(a.Pod), priorityOf(b.Pod)); c != 0 {
			return c
		}
		if !a.Known {
			return 0
		}
		return cmp.Compare(above(b), above(a))
	})
}

func priorityOf(pod *v1.Pod) int32 {
	if pod.Spec.Priority != nil {
		return *pod.Spec.Priority
	}
	return 0
}

// requestOf is the pod's request of name as the kubelet's ranking takes it
// (GetResourceRequestQuantity in pkg/api/v1/resource): component-helpers' PodRequests without
// overhead (init containers and sidecars count), only the pod-level resources when any are set
// (the PodLevelResources gate, on by default from 1.34), and the overhead added only when
// that total is non-zero. Name "" (inodes) has no request.
func requestOf(pod *v1.Pod, name v1.ResourceName) int64 {
	if name == "" {
		return 0
	}
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{
		SkipContainerLevelResources: resourcehelper.IsPodLevelResourcesSet(pod),
		ExcludeOverhead:             true,
	})
	q := reqs[name]
	if o, ok := pod.Spec.Overhead[name]; ok && !q.IsZero() {
		q.Add(o)
	}
	return q.Value()
}
