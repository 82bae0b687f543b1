package informer

import (
	"reflect"
	"slices"
	"strings"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/klog/v2"

	"github.com/reprieve-dev/reprieve/agent/pressure"
	"github.com/reprieve-dev/reprieve/agent/record"
)

// What the agent's caches keep of its node and of its node's pods (issue 39 item 3). The pods
// that name the node are written by anyone who may create a pod in any namespace (spec.nodeName
// set by hand needs no scheduler), up to the API server's 1.5 MiB an object, and the kubelet
// leaves those it refuses past maxPods as Failed pods: a cache of whole pods let a tenant's 70
// pods of 1.3 MiB push the agent past the chart's 112Mi limit at every start. So the pod cache
// keeps an allow-list, built afresh for each pod (a field the API gains later is dropped too),
// with every kept field's reader named below, and bounds every part a tenant writes.
//
// Nothing here goes back to the API server: every write of the agent is a patch of its own
// fields (the pod's DisruptionTarget and reprieve.io/Interruption conditions and warning
// annotations, the node's taints, labels, annotations and conditions), an eviction or a delete
// by name with a UID precondition, or an event that refers to the pod by name, UID and
// resourceVersion.
//
// Kept of every pod:
//   - name, namespace, UID, resourceVersion: the informer's keys, the executor's and the
//     pressure loop's state (by UID), the UID preconditions, the events' object references;
//   - deletionTimestamp, deletionGracePeriodSeconds: plan.NeedsShortening and the executor's
//     shortening, the pressure loop (a terminating pod ranked with the grace it has left) and
//     its in-flight shortening;
//   - spec.nodeName (at most 253 bytes): Overlaps counts only the node's own pods;
//   - status.phase: plan.PodFilter.Skip and pressure.Keep (finished), the notice endpoint's
//     claimants, the pressure loop's in-flight bookkeeping;
//   - the annotations podWarningAnnotations names, and the conditions keptConditionTypes names
//     (at most maxKeptConditions): the pods' warning (carries, warningPatch) and the executor's
//     DisruptionTarget patch (markDisruptionTarget); of a finished pod, only whether the
//     annotations are there and the conditions' type, status and transition time.
//
// Kept of a pod that is not finished (Succeeded or Failed), as well:
//   - the annotations keptPodAnnotations names and the labels keptPodLabels names, each value
//     cut to maxKeptValue bytes;
//   - the controller owner reference (the API server allows one): plan's DaemonSet test; every
//     other owner reference is dropped (no reader looks past the controller);
//   - spec.hostNetwork and status.podIP(s) (the kubelet's, at most two): the notice endpoint's
//     claimants;
//   - spec.priority: pressure's ranking and isCritical;
//   - spec.terminationGracePeriodSeconds: plan.PodGrace;
//   - the tolerations that can tolerate a NoExecute taint (effect NoExecute or empty), in
//     order, at most maxKeptTolerations: plan.NoExecuteDue and plan.ToleratesForever, which
//     look only at the node's NoExecute taints and take the first toleration that matches;
//     a toleration of another effect never matches one;
//   - the memory and ephemeral-storage requests, summed over the containers as the kubelet's
//     GetResourceRequestQuantity sums them (init containers and sidecars counted), into one
//     container, and the pod-level resources and overhead the same ranking reads: pressure's
//     requestOf, which reads no other resource and no other container field; as allocated
//     (pressure.Allocated: the container statuses' and the pod's allocatedResources over the
//     spec's), since the kubelet ranks its pods as allocated;
//   - each volume's name and kind (which source it has, and an emptyDir's medium), at most
//     maxKeptVolumes: pressure's diskUsage, which adds a local volume's usage by name; of a
//     claim, its name, and of an inline in-tree cloud disk (EBS, GCE PD, Azure Disk, Cinder,
//     vSphere, Portworx: a few short strings) the whole source: the executor's reader of a
//     pod's volumes (volumes_api.go) names them from these.
//
// Dropped: labels and annotations other than the above (a tenant's, up to 256 KiB of
// annotations and any number of labels), the other owner references, finalizers, managedFields,
// every container field but the requests above (image, command, args, environment, probes,
// mounts, security context, ports), the volumes' contents, the scheduling constraints, and of the
// status the other conditions, the container statuses, reason and message. A finished pod keeps
// only its identity, phase and warning: nothing evicts, ranks or answers for it, and the
// executor and the warning writer must still see it go.
//
// A kept value over its bound is cut to it, and a list over its bound is cut in order; both are
// counted (trimCuts) and logged. A cut value keeps every reader's answer: each compares the value
// with a string far under maxKeptValue (an RFC 3339 time, "api"), or only asks whether the key
// is there, and a value cut to maxKeptValue bytes still is there and still differs. A pod cut at
// maxKeptTolerations may be evicted sooner than its later tolerations allow (it is then planned
// as not tolerating what only those tolerate); one cut at maxKeptVolumes has the usage of its
// later volumes left out of its pressure ranking. No pod the agent should handle comes near
// either bound.
const (
	maxKeptValue       = 1 << 10
	maxKeptTolerations = 64
	maxKeptVolumes     = 128
	maxKeptConditions  = 4
)

// podWarningAnnotations are the pods' warning (podnotice.go: carries, warningPatch), kept on
// every pod: a finished pod that carries a warning from before a restart is still withdrawn.
var podWarningAnnotations = []string{record.AnnotationEvictAt, record.AnnotationReclaimDeadline}

// keptPodAnnotations are the annotations of a pod that is not finished that the agent reads:
// the warning, and the kubelet's static and mirror pod markers, which plan.PodFilter.Skip
// (mirror: present) and pressure's isCritical (mirror: present) read; config.source is kept for
// plan, though pressure no longer trusts it (issue 37 case 9). A new
// reader of a pod's annotation adds its key here.
var keptPodAnnotations = append([]string{v1.MirrorPodAnnotationKey, "kubernetes.io/config.source"}, podWarningAnnotations...)

// keptPodLabels are the labels Overlaps reads of the node's pods (aws-node-termination-handler's
// pod). Overlaps runs at start on a list of its own today; the cache keeps them so that it can
// run on the cache too. No other reader of the cache reads a pod's labels (the PodDisruptionBudget
// selectors of `reprieve plan` read live pods, never the agent's cache).
var keptPodLabels = []string{"app.kubernetes.io/name", "app"}

// keptConditionTypes are the pod conditions the agent reads: its own warning's condition
// (carries, warningPatch) and DisruptionTarget (markDisruptionTarget).
var keptConditionTypes = []v1.PodConditionType{record.PodConditionInterruption, v1.DisruptionTarget}

// trimCuts counts the values and lists Trim cut to their bounds since the agent started.
var trimCuts atomic.Int64

// cut counts one cut and logs it at the first, second, fourth, eighth... cut, so that a tenant
// who rewrites its pods cannot flood the log.
func cut(pod *v1.Pod, what string) {
	if n := trimCuts.Add(1); n&(n-1) == 0 {
		klog.Background().Info("A pod holds more than the pod cache keeps; cut to its bound", "pod", klog.KObj(pod), "what", what, "cutsSoFar", n)
	}
}

// Trim drops from a node or pod what no part of the agent reads, before it enters the
// cache. Of a pod it keeps what the comment above lists (TrimPod). Of the node it drops
// managedFields (server-side apply's bookkeeping), the image list and the attached volumes'
// list (the attach/detach controller's, with device paths); the node is the agent's own,
// written by the kubelet and the cluster's controllers, and every other part of it is read
// (taints, labels, annotations, conditions, capacity, addresses, the kubelet's endpoint,
// providerID, and status.volumesInUse: the window's summary of released volumes,
// Executor.ObserveVolumes). It is idempotent: an object it trimmed comes out the same.
func Trim(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Pod:
		return TrimPod(o), nil
	case *v1.Node:
		o.ManagedFields = nil
		o.Status.Images = nil
		o.Status.VolumesAttached = nil
	}
	return obj, nil
}

// TrimPod returns the part of p the agent reads, as a new pod: the rest of p becomes garbage
// at once.
func TrimPod(p *v1.Pod) *v1.Pod {
	out := &v1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			DeletionTimestamp: p.DeletionTimestamp, DeletionGracePeriodSeconds: p.DeletionGracePeriodSeconds,
		},
		Spec:   v1.PodSpec{NodeName: p.Spec.NodeName},
		Status: v1.PodStatus{Phase: p.Status.Phase, Conditions: keptConditions(p)},
	}
	if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
		// A finished pod's warning is only ever withdrawn (warningFor), which asks whether the
		// annotations are there and the condition is True (carries), and keeps the condition's
		// transition time (warningPatch): their values, reasons and messages go.
		for _, k := range podWarningAnnotations {
			if _, ok := p.Annotations[k]; ok {
				if out.Annotations == nil {
					out.Annotations = map[string]string{}
				}
				out.Annotations[k] = ""
			}
		}
		for i := range out.Status.Conditions {
			out.Status.Conditions[i].Reason, out.Status.Conditions[i].Message = "", ""
		}
		return out
	}
	out.Annotations = keptValues(p, "annotation", p.Annotations, keptPodAnnotations)
	out.Labels = keptValues(p, "label", p.Labels, keptPodLabels)
	out.OwnerReferences = controllerRef(p)
	out.Spec.HostNetwork = p.Spec.HostNetwork
	out.Spec.Priority = p.Spec.Priority
	out.Spec.TerminationGracePeriodSeconds = p.Spec.TerminationGracePeriodSeconds
	out.Spec.Tolerations = noExecuteTolerations(p)
	// The requests as the kubelet has allocated them (pressure.Allocated: the status's
	// allocatedResources over the spec's), which the pressure ranking reads (issue 37 case 5).
	alloc := pressure.Allocated(p)
	out.Spec.Containers = requestsContainer(alloc)
	out.Spec.Resources = podLevelResources(alloc.Spec.Resources)
	out.Spec.Overhead = onlyResources(p.Spec.Overhead, rankedResources)
	out.Spec.Volumes = volumeKinds(p)
	keepTail(p, out)
	out.Status.PodIP = p.Status.PodIP
	if len(p.Status.PodIPs) > 0 {
		// The kubelet's, one per family; bounded all the same.
		out.Status.PodIPs = slices.Clone(p.Status.PodIPs[:min(len(p.Status.PodIPs), 2)])
	}
	return out
}

// bounded is s cut to maxKeptValue bytes, and whether it was cut.
func bounded(s string) (string, bool) {
	if len(s) <= maxKeptValue {
		return s, false
	}
	// A copy: the cut would keep the whole value alive.
	return strings.Clone(s[:maxKeptValue]), true
}

// keptValues is the entries of m whose keys are in keys, each value bounded; nil for none.
func keptValues(p *v1.Pod, what string, m map[string]string, keys []string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		v, ok := m[k]
		if !ok {
			continue
		}
		if out == nil {
			out = make(map[string]string, len(keys))
		}
		var c bool
		if out[k], c = bounded(v); c {
			cut(p, what+" "+k)
		}
	}
	return out
}

// controllerRef is p's controller owner reference alone, its strings bounded (kind and
// apiVersion have no length limit of their own); nil without one.
func controllerRef(p *v1.Pod) []metav1.OwnerReference {
	for _, ref := range p.OwnerReferences {
		if ref.Controller == nil || !*ref.Controller {
			continue
		}
		var c [3]bool
		ref.APIVersion, c[0] = bounded(ref.APIVersion)
		ref.Kind, c[1] = bounded(ref.Kind)
		ref.Name, c[2] = bounded(ref.Name)
		if c[0] || c[1] || c[2] {
			cut(p, "owner reference")
		}
		return []metav1.OwnerReference{ref}
	}
	return nil
}

// keptConditions is p's conditions of keptConditionTypes, their reason and message bounded.
func keptConditions(p *v1.Pod) []v1.PodCondition {
	var out []v1.PodCondition
	for _, c := range p.Status.Conditions {
		if !slices.Contains(keptConditionTypes, c.Type) {
			continue
		}
		if len(out) == maxKeptConditions {
			cut(p, "conditions")
			break
		}
		var r, m bool
		c.Reason, r = bounded(c.Reason)
		c.Message, m = bounded(c.Message)
		if r || m {
			cut(p, "condition "+string(c.Type))
		}
		out = append(out, c)
	}
	return out
}

// noExecuteTolerations is p's tolerations that may tolerate a NoExecute taint, in order, at
// most maxKeptTolerations. Keys and values are bounded by the API server's validation (a
// qualified name and a label value).
func noExecuteTolerations(p *v1.Pod) []v1.Toleration {
	var out []v1.Toleration
	for _, t := range p.Spec.Tolerations {
		if t.Effect != "" && t.Effect != v1.TaintEffectNoExecute {
			continue
		}
		if len(out) == maxKeptTolerations {
			cut(p, "tolerations")
			break
		}
		out = append(out, t)
	}
	return out
}

// rankedResources are the resources whose requests pressure's ranking reads (requestOf: memory
// for memory.available, ephemeral-storage for the filesystems and their inodes).
var rankedResources = []v1.ResourceName{v1.ResourceMemory, v1.ResourceEphemeralStorage}

// onlyResources is the entries of l named in names; nil for none.
func onlyResources(l v1.ResourceList, names []v1.ResourceName) v1.ResourceList {
	var out v1.ResourceList
	for _, n := range names {
		if q, ok := l[n]; ok {
			if out == nil {
				out = v1.ResourceList{}
			}
			out[n] = q
		}
	}
	return out
}

// requestsContainer is one container that requests what all of p's containers request together
// of rankedResources, as the kubelet's ranking adds them (resourcehelper.AggregateContainerRequests:
// the containers and sidecars summed, the init containers' peak if larger); nil when they
// request none. pressure's requestOf on the trimmed pod then reads what it read on the whole one,
// whatever the number of containers.
func requestsContainer(p *v1.Pod) []v1.Container {
	reqs := onlyResources(resourcehelper.AggregateContainerRequests(p, resourcehelper.PodResourcesOptions{}), rankedResources)
	if len(reqs) == 0 {
		return nil
	}
	return []v1.Container{{Name: "requests", Resources: v1.ResourceRequirements{Requests: reqs}}}
}

// podLevelResources keeps of the pod-level resources what pressure's requestOf reads: whether
// any are set (IsPodLevelResourcesSet, IsPodLevelRequestsSet: then the containers' are not
// counted) and the memory request. Each list keeps its memory entry, or, without one, one other
// entry the pod level supports (cpu, a hugepages size), which keeps the answer of those tests.
func podLevelResources(r *v1.ResourceRequirements) *v1.ResourceRequirements {
	if r == nil {
		return nil
	}
	keep := func(l v1.ResourceList) v1.ResourceList {
		if q, ok := l[v1.ResourceMemory]; ok {
			return v1.ResourceList{v1.ResourceMemory: q}
		}
		names := make([]v1.ResourceName, 0, len(l))
		for n := range l {
			if resourcehelper.IsSupportedPodLevelResource(n) {
				names = append(names, n)
			}
		}
		if len(names) == 0 {
			return nil
		}
		n := slices.Min(names)
		return v1.ResourceList{n: l[n]}
	}
	out := &v1.ResourceRequirements{Requests: keep(r.Requests), Limits: keep(r.Limits)}
	if out.Requests == nil && out.Limits == nil {
		return nil
	}
	return out
}

// volumeKinds is each of p's volumes reduced to its name and which source it has (a new, empty
// source of that kind; an emptyDir keeps its medium), at most maxKeptVolumes: pressure's
// diskUsage and isLocalVolume read no more. Kept for every kind, so that a reader that counts
// one more kind as local finds it.
func volumeKinds(p *v1.Pod) []v1.Volume {
	if len(p.Spec.Volumes) == 0 {
		return nil
	}
	n := min(len(p.Spec.Volumes), maxKeptVolumes)
	if n < len(p.Spec.Volumes) {
		cut(p, "volumes")
	}
	out := make([]v1.Volume, n)
	for i, vol := range p.Spec.Volumes[:n] {
		out[i].Name = vol.Name
		src, kind := reflect.ValueOf(vol.VolumeSource), reflect.ValueOf(&out[i].VolumeSource).Elem()
		for f := range src.NumField() {
			if sf := src.Field(f); sf.Kind() == reflect.Pointer && !sf.IsNil() {
				kind.Field(f).Set(reflect.New(sf.Type().Elem()))
			}
		}
		if vol.EmptyDir != nil {
			out[i].EmptyDir.Medium = vol.EmptyDir.Medium
		}
		if vol.PersistentVolumeClaim != nil {
			// A claim's name is a DNS subdomain: at most 253 bytes (API validation).
			out[i].PersistentVolumeClaim.ClaimName = strings.Clone(vol.PersistentVolumeClaim.ClaimName)
		}
		keepInTreeDisk(&out[i].VolumeSource, &vol.VolumeSource)
	}
	return out
}

// keepInTreeDisk copies into dst the whole source of an inline in-tree cloud disk of src, which
// csi-translation-lib needs to name it as the kubelet does. Their fields are short: a disk's ID
// or URI, a filesystem type, a partition, flags.
func keepInTreeDisk(dst, src *v1.VolumeSource) {
	switch {
	case src.AWSElasticBlockStore != nil:
		dst.AWSElasticBlockStore = src.AWSElasticBlockStore.DeepCopy()
	case src.GCEPersistentDisk != nil:
		dst.GCEPersistentDisk = src.GCEPersistentDisk.DeepCopy()
	case src.AzureDisk != nil:
		dst.AzureDisk = src.AzureDisk.DeepCopy()
	case src.Cinder != nil:
		dst.Cinder = src.Cinder.DeepCopy()
	case src.VsphereVolume != nil:
		dst.VsphereVolume = src.VsphereVolume.DeepCopy()
	case src.PortworxVolume != nil:
		dst.PortworxVolume = src.PortworxVolume.DeepCopy()
	}
}
