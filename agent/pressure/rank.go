package pressure

import (
	"cmp"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

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

// Candidates turns the evictable pods into candidates for r, with their usage from pods (nil
// when the source has none) and their own grace, ranked as the kubelet ranks them.
func Candidates(r Resource, pods []*v1.Pod, usage map[types.UID]kubelet.PodUsage, grace func(*v1.Pod) time.Duration) []Candidate {
	cs := make([]Candidate, 0, len(pods))
	for _, p := range pods {
		c := Candidate{Pod: p, Grace: grace(p)}
		if usage != nil {
			if u, ok := usage[p.UID]; ok {
				c.Known = true
				switch r {
				case Memory:
					c.Usage = u.MemoryWorkingSet
				case Disk:
					c.Usage = u.EphemeralStorage
				case PID:
					c.Usage = u.Processes
				}
			}
		}
		cs = append(cs, c)
	}
	Rank(r, cs)
	return cs
}

// Rank orders candidates the way the kubelet's eviction manager does (rankMemoryPressure,
// rankDiskPressureFunc, rankPIDPressure):
//   - memory and disk: pods whose usage exceeds their request first, then lower priority
//     first, then the larger usage above request first;
//   - PID: lower priority first, then more processes first.
//
// A pod without usage figures ranks first among its peers, as the kubelet's comparators place
// a pod it has no stats for. Ties keep the input order.
func Rank(r Resource, cs []Candidate) {
	name := v1.ResourceMemory
	if r == Disk {
		name = v1.ResourceEphemeralStorage
	}
	above := func(c Candidate) int64 { return c.Usage - requestOf(c.Pod, name) }
	slices.SortStableFunc(cs, func(a, b Candidate) int {
		if a.Known != b.Known {
			if !a.Known {
				return -1
			}
			return 1
		}
		if r != PID {
			if ea, eb := above(a) > 0, above(b) > 0; a.Known && ea != eb {
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
		if r == PID {
			return cmp.Compare(b.Usage, a.Usage)
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

// requestOf sums the containers' requests of name (as the kubelet's eviction ranking does,
// init containers aside).
func requestOf(pod *v1.Pod, name v1.ResourceName) int64 {
	var sum resource.Quantity
	for _, c := range pod.Spec.Containers {
		if q, ok := c.Resources.Requests[name]; ok {
			sum.Add(q)
		}
	}
	return sum.Value()
}
