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
	KeepFinished = "finished"
	KeepCritical = "critical"
	KeepSelf     = "reprieve itself"
)

// Keep returns why the pressure loop must never evict pod, or "" when it may. It leaves out
// what the kubelet's eviction manager never evicts, and nothing more:
//   - a finished pod: not among the kubelet's active pods (GetActivePods, filterOutInactivePods);
//     a terminating one is, and is ranked with the others (its grace is cut);
//   - a critical pod, as the kubelet's evictPod refuses one (kubelettypes.IsCriticalPod; see
//     isCritical);
//   - reprieve's own pod (selfNamespace/selfName), which the kubelet would evict: reprieve
//     cannot hand over its own eviction and keep acting.
//
// A DaemonSet's pod is ranked like any pod, as the kubelet ranks it: its controller does not put
// it back while reprieve's NoSchedule pressure taint is on the node, unless it tolerates it.
func Keep(pod *v1.Pod, selfNamespace, selfName string) string {
	switch {
	case pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed:
		return KeepFinished
	case isCritical(pod):
		return KeepCritical
	case selfName != "" && pod.Name == selfName && pod.Namespace == selfNamespace:
		return KeepSelf
	}
	return ""
}

// isCritical is the kubelet's IsCriticalPod (pkg/kubelet/types/pod_update.go) on the kubelet's
// own copy of the pod, from what reprieve can see of it in the API and a tenant cannot forge:
//   - static (its config.source not "api"): the kubelet overwrites config.source with "api" on
//     every pod from the API server (podStorage.merge, pkg/kubelet/config/config.go), so the
//     annotation a tenant writes on the API object says nothing; a real static pod shows in the
//     API only as its mirror pod;
//   - mirror (the kubernetes.io/config.mirror annotation): the mirror pod of a static pod. A
//     tenant may create a pod with it (the API server only requires spec.nodeName,
//     ValidatePodSpecificAnnotations, and refuses adding it later), but the kubelet never runs
//     such a pod: it files it as a mirror pod (basicManager.updatePodsInternal), outside its
//     active pods, and deletes it as orphaned (HandlePodCleanups). It uses nothing to evict;
//   - priority >= SystemCriticalPriority: set by the Priority admission plugin from the
//     priority class, not by the pod's author.
func isCritical(pod *v1.Pod) bool {
	if _, mirror := pod.Annotations[v1.MirrorPodAnnotationKey]; mirror {
		return true
	}
	return pod.Spec.Priority != nil && *pod.Spec.Priority >= SystemCriticalPriority
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
				case kubelet.MemoryAvailable, kubelet.AllocatableMemoryAvailable:
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
// With a container filesystem split from imagefs (KEP-4191, KubeletSeparateDiskGC) the writable
// layers are on nodefs: ParseSummary then says RootfsOnImageFs false, and nodefs counts them
// (buildSignalToRankFunc's withImageFs && imageContainerSplitFs: logs, local volumes, rootfs),
// while imagefs counts no pod's usage (fsStatsImages only). The pod's ephemeral-storage total is
// not used: it also holds Secret, downward API and projected volumes and /etc/hosts, which the
// kubelet does not rank by.
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
	case kubelet.MemoryAvailable, kubelet.AllocatableMemoryAvailable:
		// buildSignalToRankFunc: rankMemoryPressure for both.
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
// (GetResourceRequestQuantity in pkg/api/v1/resource) on the pod as allocated (the eviction
// manager ranks getAllocatedPods, which UpdatePodFromAllocation gives each container's allocated
// resources and, with in-place pod-level resize, the pod's): component-helpers' PodRequests
// without overhead (init containers and sidecars count), only the pod-level resources when any
// are set (the PodLevelResources gate, on by default from 1.34), and the overhead added only when
// that total is non-zero. Name "" (inodes) has no request.
func requestOf(pod *v1.Pod, name v1.ResourceName) int64 {
	if name == "" {
		return 0
	}
	pod = Allocated(pod)
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

// Allocated returns pod with the requests the kubelet has allocated in place of the spec's,
// where the status shows them: each container's status.containerStatuses[].allocatedResources
// (and the init containers'), and the pod-level status.allocatedResources. This is what the
// kubelet's UpdatePodFromAllocation does with its allocation checkpoint, which the kubelet
// mirrors into those fields; a resize not yet allocated (Deferred, Infeasible) leaves the
// allocation as it was. The pod-level field is there only with the
// InPlacePodLevelResourcesVerticalScaling gate. Only the requests change (the ranking reads nothing else); pod itself
// is not modified: a copy is returned when anything differs.
func Allocated(pod *v1.Pod) *v1.Pod {
	alloc := map[string]v1.ResourceList{}
	for _, ss := range [][]v1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		for _, cs := range ss {
			if cs.AllocatedResources != nil {
				alloc[cs.Name] = cs.AllocatedResources
			}
		}
	}
	podLevel := pod.Spec.Resources != nil && pod.Status.AllocatedResources != nil
	if len(alloc) == 0 && !podLevel {
		return pod
	}
	out := pod.DeepCopy()
	for _, cs := range []([]v1.Container){out.Spec.Containers, out.Spec.InitContainers} {
		for i := range cs {
			if a, ok := alloc[cs[i].Name]; ok {
				cs[i].Resources.Requests = a.DeepCopy()
			}
		}
	}
	if podLevel {
		// status.allocatedResources is PodRequests of the allocated pod, overhead included
		// (generateAPIPodStatus): the pod-level requests are that less the overhead.
		reqs := out.Status.AllocatedResources.DeepCopy()
		for name, o := range out.Spec.Overhead {
			if q, ok := reqs[name]; ok {
				q.Sub(o)
				reqs[name] = q
			}
		}
		out.Spec.Resources.Requests = reqs
	}
	return out
}
