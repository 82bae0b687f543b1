package pressure

import (
	"cmp"
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
					c.Usage = u.EphemeralStorage
				case kubelet.NodeFsInodesFree, kubelet.ImageFsInodesFree:
					c.Usage = u.Inodes
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

// Rank orders candidates for signal s the way the kubelet's eviction manager does
// (rankMemoryPressure, rankDiskPressureFunc, rankPIDPressure):
//   - memory and disk: a pod without usage figures first, then pods whose usage exceeds their
//     request, then lower priority first, then the larger usage above request first (inodes
//     have no request: any use counts as above it);
//   - PID: lower priority first, then, among equals, a pod without figures, then more processes.
//
// Requests are the pod's effective requests as the kubelet computes them (init containers,
// sidecars, pod-level resources and overhead). Ties keep the input order.
func Rank(s kubelet.Signal, cs []Candidate) {
	var name v1.ResourceName
	switch s {
	case kubelet.MemoryAvailable:
		name = v1.ResourceMemory
	case kubelet.NodeFsAvailable, kubelet.ImageFsAvailable:
		name = v1.ResourceEphemeralStorage
	}
	above := func(c Candidate) int64 { return c.Usage - requestOf(c.Pod, name) }
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
			if ea, eb := above(a) > 0, above(b) > 0; ea != eb {
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

// requestOf is the pod's effective request of name, as the kubelet's ranking takes it
// (GetResourceRequestQuantity): component-helpers' PodRequests, which counts init containers
// and sidecars, pod-level resources and overhead. Inodes (name "") have no request.
func requestOf(pod *v1.Pod, name v1.ResourceName) int64 {
	if name == "" {
		return 0
	}
	q, ok := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})[name]
	if !ok {
		return 0
	}
	return q.Value()
}
