package plan

import (
	"math"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// DefaultGracePeriod is what the API server defaults terminationGracePeriodSeconds to.
const DefaultGracePeriod = 30 * time.Second

// MinGrace is the shortest grace reprieve ever asks for, and the least time a pod takes to stop
// once its grace starts: the kubelet raises any grace below minimumGracePeriodInSeconds (2) to
// 2 s when it stops a container, after the API's own value (killContainer,
// pkg/kubelet/kuberuntime/kuberuntime_container.go, v1.37). Planned as 1 s, a pod sent at its
// last chance outlived the window by up to a second (issue 38, case 2). 0 would force-remove a
// running pod without the kubelet's confirmation, never what a graceful handler wants.
const MinGrace = 2 * time.Second

// HookTail is how long past its grace the kubelet may take to stop a pod whose stop has a stage
// that can use the whole grace, and SidecarHookTail where a native sidecar has a preStop hook of
// its own. killContainersWithSyncResult (pkg/kubelet/kuberuntime/kuberuntime_container.go,
// v1.37.2) kills every container at once, each with the same grace; killContainer runs a preStop
// hook within it and takes the whole seconds it used, rounded down, off it; a native sidecar
// then waits for its turn (terminationOrdering.waitForTurn, kuberuntime_termination_order.go:
// every regular container, and the next sidecar in spec order) at most what is left, and the
// whole seconds it waited come off too; what is left below minimumGracePeriodInSeconds is raised
// to 2 s. So a regular container's hook that uses the whole grace ends its container by grace +
// 2 s, and every sidecar's wait ends by the same grace, counted from the same start, however
// many sidecars wait in turn: each is stopped by grace + 2 s. A sidecar's own hook loses up to
// a second more to the two roundings (its hook's and its wait's): grace + 3 s.
const (
	HookTail        = 2 * time.Second
	SidecarHookTail = 3 * time.Second
)

// KubeletReaction is how long after a deletion takes effect the kubelet may take to start the
// grace: the grace runs from its kill (killContainer), and between the two lie the pod's watch
// event, the sync loop (SyncLoop DELETE) and the pod's worker. A real node's kubelet log
// (test/realnode, the run of 2026-12-06 11:48, a burst of evictions at a notice on a loaded
// two-core node) showed 0.11 s for one pod and 0.93 s for another: a 34 s grace that fitted at
// the server's receipt ended 0.55 s past the window's end. Every pod's tail counts it.
const KubeletReaction = time.Second

// Tail is how long past its grace, counted from when its deletion takes effect, the kubelet may
// take to stop pod: KubeletReaction, and HookTail more when a regular container has a preStop
// hook or the pod has native sidecars (restartable init containers), SidecarHookTail more when
// a native sidecar has a preStop hook of its own. It is a bound, not a measure: a hook that
// ends early leaves that time to the containers, within the grace.
func Tail(pod *v1.Pod) time.Duration {
	tail := KubeletReaction
	for _, c := range pod.Spec.Containers {
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
			tail = KubeletReaction + HookTail
			break
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy == nil || *c.RestartPolicy != v1.ContainerRestartPolicyAlways {
			continue
		}
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
			return KubeletReaction + SidecarHookTail
		}
		tail = KubeletReaction + HookTail
	}
	return tail
}

// SkipReason says why a pod is left alone. The empty reason means the pod is planned.
type SkipReason string

// Reasons a pod is not evicted.
const (
	SkipNone             SkipReason = ""
	SkipFinished         SkipReason = "finished"
	SkipMirror           SkipReason = "mirror-pod"
	SkipDaemonSet        SkipReason = "daemonset-pod"
	SkipSelf             SkipReason = "reprieve-itself"
	SkipTolerateForever  SkipReason = "tolerates-forever"
	SkipNoNoExecuteTaint SkipReason = "no-noexecute-taint"
	SkipVolumePlugin     SkipReason = "volume-plugin"
)

// PodFilter says which pods the eviction loop leaves alone whatever the taints.
type PodFilter struct {
	// EvictDaemonSetPods evicts DaemonSet pods too (their controller recreates them on the
	// tainted node unless they lack a toleration; kubectl drain skips them, and so do we by
	// default).
	EvictDaemonSetPods bool
	// SelfNamespace and SelfName identify reprieve's own pod, which is never evicted.
	SelfNamespace, SelfName string
}

// Skip returns why pod is left alone, or SkipNone.
func (f PodFilter) Skip(pod *v1.Pod) SkipReason {
	switch {
	case pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed:
		return SkipFinished
	case isMirrorPod(pod):
		// Deleting a mirror pod does not stop its static pod: the kubelet recreates it.
		return SkipMirror
	case IsVolumePlugin(pod):
		// A CSI node plugin unstages the volumes of the pods being evicted: it must outlive
		// them, or their volumes are never released (issue 40), also with
		// EvictDaemonSetPods.
		return SkipVolumePlugin
	case !f.EvictDaemonSetPods && isDaemonSetPod(pod):
		return SkipDaemonSet
	case f.SelfName != "" && pod.Name == f.SelfName && pod.Namespace == f.SelfNamespace:
		return SkipSelf
	}
	return SkipNone
}

// IsVolumePlugin reports whether pod is a CSI node plugin: it mounts the kubelet's plugin
// registration directory (plugins_registry, where node-driver-registrar registers the driver
// with the kubelet), as the node plugins of the EBS, GCE PD and Azure Disk drivers and every
// driver registered through node-driver-registrar do.
func IsVolumePlugin(pod *v1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.Volumes, IsRegistrationDir)
}

// IsRegistrationDir reports whether v is a hostPath volume of the kubelet's plugin registration
// directory (IsVolumePlugin).
func IsRegistrationDir(v v1.Volume) bool {
	return v.HostPath != nil && strings.HasSuffix(strings.TrimRight(v.HostPath.Path, "/"), "/plugins_registry")
}

func isMirrorPod(pod *v1.Pod) bool {
	_, ok := pod.Annotations[v1.MirrorPodAnnotationKey]
	return ok
}

func isDaemonSetPod(pod *v1.Pod) bool {
	for _, ref := range pod.OwnerReferences {
		if ref.Controller != nil && *ref.Controller && ref.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}

// Window is the reclaim deadline and the margin every evicted pod must finish before it.
type Window struct {
	// Deadline is when the machine is reclaimed; zero when no interruption is pending.
	Deadline time.Time
	// SafetyMargin is how long before Deadline every evicted pod must be gone.
	SafetyMargin time.Duration
	// Taint is the interruption taint (key, value, effect; no timeAdded). A pod that
	// tolerates it forever has said that it stays until the machine goes: the deadline never
	// pulls it in, and only upstream's own timing (another NoExecute taint) applies to it.
	// Empty: every pod is bound by the deadline.
	Taint v1.Taint
	// SoftOff is when the machine's OS gets the ACPI soft-off, before the deadline (GCP's
	// extended preemption notice; zero when unknown or at the deadline), and ShutdownCut how
	// long the kubelet's graceful node shutdown then gives the ordinary pods still running
	// (shutdownGracePeriod - shutdownGracePeriodCriticalPods; zero when it is off). With both,
	// every pod is evicted by the soft-off, through the Eviction API and its budgets, and is gone
	// by SoftOff + ShutdownCut, before the kubelet would stop it itself with a shorter grace.
	SoftOff     time.Time
	ShutdownCut time.Duration
	// VolumeRelease is how long before Deadline a pod with a volume that the attach/detach
	// controller attaches (Attaches) must be gone, so that the kubelet unmounts it and
	// publishes status.volumesInUse without it before the machine goes: the controller does
	// not detach a volume the node lists in use until six minutes have passed
	// (ReconcilerMaxWaitForUnmountDuration), and a StatefulSet's replacement waits that long
	// with a Multi-Attach error. Zero: the rule is off. When it is shorter than the safety
	// margin, the margin decides.
	VolumeRelease time.Duration
}

// kubeletCut is when the kubelet's graceful node shutdown stops the pods still running; zero
// when it does not apply.
func (w Window) kubeletCut() time.Time {
	if w.SoftOff.IsZero() || w.ShutdownCut <= 0 {
		return time.Time{}
	}
	return w.SoftOff.Add(w.ShutdownCut)
}

// End is the moment by which every evicted pod must have finished terminating: the deadline less
// the safety margin, or earlier, when the kubelet's graceful node shutdown would stop the pods
// before it.
func (w Window) End() time.Time {
	end := w.Deadline.Add(-w.SafetyMargin)
	if cut := w.kubeletCut(); !cut.IsZero() && cut.Before(end) {
		return cut
	}
	return end
}

// Equal reports whether two windows are the same instant and margin.
func (w Window) Equal(o Window) bool {
	return w.Deadline.Equal(o.Deadline) && w.SafetyMargin == o.SafetyMargin && w.VolumeRelease == o.VolumeRelease &&
		w.Taint.Key == o.Taint.Key && w.Taint.Value == o.Taint.Value && w.Taint.Effect == o.Taint.Effect &&
		w.SoftOff.Equal(o.SoftOff) && w.ShutdownCut == o.ShutdownCut
}

// HasDeadline reports whether an interruption deadline is pending.
func (w Window) HasDeadline() bool { return !w.Deadline.IsZero() }

// Plan is what the eviction loop intends for one pod.
type Plan struct {
	// Skip is set when the pod is left alone; the other fields are then meaningless except
	// for Due (zero).
	Skip SkipReason
	// Due is the upstream NoExecute time: when kube-controller-manager's taint eviction would
	// delete the pod, anchored on each taint's timeAdded. Zero when it tolerates forever.
	Due time.Time
	// DueTaint is the taint that decides Due (for logs and `reprieve plan`).
	DueTaint *v1.Taint
	// Grace is the pod's own termination grace period.
	Grace time.Duration
	// Latest is the last moment the pod can be evicted with its full grace and still be gone
	// by the window's end; zero without a deadline.
	Latest time.Time
	// EvictAt is when the eviction is due: min(Due, Latest).
	EvictAt time.Time
	// ByDeadline is true when Latest, not Due, decides EvictAt.
	ByDeadline bool
	// Unbound is true when the window does not bind the pod: it tolerates the interruption
	// taint forever, so only upstream's timing applies and its grace is its own (see Bound).
	Unbound bool
	// Tail is how long past its grace the kubelet may take to stop the pod (see Tail): its
	// last safe moment leaves room for it, and a grace cut to the window leaves it too.
	Tail time.Duration
	// Volume is set when the pod has a volume that needs attaching and the window's
	// VolumeRelease binds it: it must be gone VolumeRelease before the deadline (see Bound).
	Volume bool
}

// Bound is the window that binds the pod planned as p: w itself; for a pod with a volume that
// needs attaching (Plan.Volume), w with its margin grown to VolumeRelease, so that the pod is
// gone in time for the kubelet to release the volume; or no deadline for a pod that tolerates
// the interruption forever (Plan.Unbound).
func (p Plan) Bound(w Window) Window {
	if p.Unbound {
		return Window{SafetyMargin: w.SafetyMargin}
	}
	if p.Volume {
		w.SafetyMargin = max(w.SafetyMargin, w.VolumeRelease)
	}
	return w
}

// Attaches reports whether pod has a volume that the attach/detach controller attaches to the
// node, and so must release before the machine goes: a PersistentVolumeClaim or a generic
// ephemeral volume (which is one), or an in-tree disk that is attached (EBS, GCE PD, Azure
// Disk, Cinder, vSphere, Portworx, RBD, iSCSI, FC). An inline CSI volume is not (CSI
// ephemeral volumes skip attach). A claim bound to a volume that needs no attaching (NFS,
// EFS, a local volume) counts all the same: telling them apart needs the PersistentVolume and
// its CSIDriver, which the agent does not read; the rule then costs that pod only the
// seconds between the margin and VolumeRelease.
func Attaches(pod *v1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		s := v.VolumeSource
		if s.PersistentVolumeClaim != nil || s.Ephemeral != nil || s.AWSElasticBlockStore != nil || s.GCEPersistentDisk != nil ||
			s.AzureDisk != nil || s.Cinder != nil || s.VsphereVolume != nil || s.PortworxVolume != nil || s.RBD != nil ||
			s.ISCSI != nil || s.FC != nil {
			return true
		}
	}
	return false
}

// PlanPod is PlanPodAt for taints that already carry their anchors in TimeAdded, as the
// agent's plan view and `reprieve plan` fill them (min(timeAdded, first seen)). A taint without
// TimeAdded counts from the zero time, that is at once: use PlanPodAt when that can happen.
func PlanPod(pod *v1.Pod, taints []v1.Taint, w Window, filter PodFilter, comparisonOperators bool) Plan {
	return PlanPodAt(pod, taints, time.Time{}, w, filter, comparisonOperators)
}

// PlanPodAt computes when pod is to be evicted, from the node's NoExecute taints, when the
// caller first saw them (firstSeen; see NoExecuteDue) and the reclaim window. It is pure: the
// same inputs give the same plan, so a restarted agent re-plans to the same times.
func PlanPodAt(pod *v1.Pod, taints []v1.Taint, firstSeen time.Time, w Window, filter PodFilter, comparisonOperators bool) Plan {
	if r := filter.Skip(pod); r != SkipNone {
		return Plan{Skip: r}
	}
	due, dueTaint, anyNoExecute := NoExecuteDue(pod.Spec.Tolerations, taints, firstSeen, comparisonOperators)
	if !anyNoExecute {
		return Plan{Skip: SkipNoNoExecuteTaint}
	}
	if due.IsZero() {
		// Upstream semantics: a pod that tolerates every NoExecute taint forever stays, even
		// when the machine is going away (it chose to; DaemonSet-like agents rely on it).
		return Plan{Skip: SkipTolerateForever}
	}
	p := Plan{Due: due, DueTaint: dueTaint, Grace: PodGrace(pod), EvictAt: due, Tail: Tail(pod)}
	if w.HasDeadline() && ToleratesForever(pod.Spec.Tolerations, w.Taint, comparisonOperators) {
		// It stays until the machine goes; another NoExecute taint (the node lifecycle
		// controller's not-ready, with everyone's default 300 s) evicts it on upstream's
		// schedule, never on the deadline's.
		p.Unbound = true
		return p
	}
	if w.HasDeadline() {
		// A volume that needs attaching must be released before the machine goes (Bound).
		p.Volume = w.VolumeRelease > w.SafetyMargin && Attaches(pod)
		w = p.Bound(w)
		// Never less than the 2 s the kubelet gives every container (MinGrace): a pod whose
		// own grace is 0 still takes them, and must start them before the window's end; and
		// the kubelet's tail after the grace (a preStop hook, native sidecars).
		// Two steps: a grace near math.MaxInt64 less the tail would wrap to a short one.
		p.Latest = w.End().Add(-max(p.Grace, MinGrace)).Add(-p.Tail)
		if !w.kubeletCut().IsZero() && p.Latest.After(w.SoftOff) {
			// From the soft-off the kubelet stops the pod itself, past any budget: the eviction
			// goes before it.
			p.Latest = w.SoftOff
		}
		if p.Latest.Before(p.Due) {
			p.EvictAt = p.Latest
			p.ByDeadline = true
		}
	}
	return p
}

// NoExecuteDue mirrors kube-controller-manager's taint eviction (processPodOnNode and
// getMinTolerationTime in pkg/controller/tainteviction/taint_eviction.go), with one change:
// each taint's time is anchored on its timeAdded instead of on when a controller happened to
// observe it, as the DRA device-taint controller does, so that restarts reset nothing.
//
// Each taint's anchor is the earlier of its timeAdded and firstSeen, when the caller first saw
// the taints (as upstream anchors on observing them): a taint without timeAdded (kubectl never
// sets one) counts from firstSeen, and a timeAdded in the future (a writer with a fast clock)
// does not delay a pod upstream would evict at once. A zero firstSeen trusts timeAdded alone.
//
// For every NoExecute taint the first toleration in spec order that tolerates it is used:
// none tolerates it: anchor; tolerationSeconds <= 0: anchor; finite: anchor + s; unset:
// never. due is the earliest of these (zero when all are never), taint the one that decides
// it, and anyNoExecute whether the node has a NoExecute taint at all.
func NoExecuteDue(tolerations []v1.Toleration, taints []v1.Taint, firstSeen time.Time, comparisonOperators bool) (due time.Time, taint *v1.Taint, anyNoExecute bool) {
	logger := klog.Background()
	for i := range taints {
		t := &taints[i]
		if t.Effect != v1.TaintEffectNoExecute {
			continue
		}
		anyNoExecute = true
		anchor := firstSeen
		if t.TimeAdded != nil && (firstSeen.IsZero() || t.TimeAdded.Time.Before(firstSeen)) {
			anchor = t.TimeAdded.Time
		}
		var tol *v1.Toleration
		for j := range tolerations {
			if tolerations[j].ToleratesTaint(logger, t, comparisonOperators) {
				tol = &tolerations[j]
				break
			}
		}
		at := anchor
		switch {
		case tol == nil:
		case tol.TolerationSeconds == nil:
			continue
		case *tol.TolerationSeconds > maxSeconds:
			// More seconds than a time.Duration holds (about 292 years): upstream's product
			// wraps, and reads the negative results as forever; any such value is forever
			// for a node.
			continue
		case *tol.TolerationSeconds > 0:
			at = anchor.Add(time.Duration(*tol.TolerationSeconds) * time.Second)
		}
		if due.IsZero() || at.Before(due) {
			due, taint = at, t
		}
	}
	return due, taint, anyNoExecute
}

// ToleratesForever reports whether tolerations tolerate the NoExecute taint t with no
// tolerationSeconds (the first toleration in spec order that matches decides, as upstream's
// getMatchingTolerations and getMinTolerationTime pick it). False for an empty or a
// non-NoExecute taint.
func ToleratesForever(tolerations []v1.Toleration, t v1.Taint, comparisonOperators bool) bool {
	if t.Key == "" || t.Effect != v1.TaintEffectNoExecute {
		return false
	}
	t.TimeAdded = nil
	due, _, any := NoExecuteDue(tolerations, []v1.Taint{t}, time.Unix(0, 0), comparisonOperators)
	return any && due.IsZero()
}

// PodGrace is the pod's termination grace period as the kubelet would use it.
func PodGrace(pod *v1.Pod) time.Duration {
	if pod.Spec.TerminationGracePeriodSeconds == nil {
		return DefaultGracePeriod
	}
	s := *pod.Spec.TerminationGracePeriodSeconds
	switch {
	case s < 0:
		return 0
	case s > maxSeconds:
		// It would wrap to a short or negative time.Duration; a window cuts it anyway.
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s) * time.Second
}

// maxSeconds is the largest number of seconds a time.Duration holds.
const maxSeconds = int64(math.MaxInt64 / int64(time.Second))

// GraceAt is the grace to give a pod evicted at now: its own grace, shortened so that it is
// gone by the window's end, and never below one second. Without a deadline it is the pod's own.
// The result is whole seconds, rounded down, because the API takes whole seconds and rounding
// up would overshoot the window.
func GraceAt(grace time.Duration, w Window, now time.Time) time.Duration {
	if w.HasDeadline() {
		if left := w.End().Sub(now); left < grace {
			grace = left
		}
	}
	grace = grace.Truncate(time.Second)
	if grace < MinGrace {
		grace = MinGrace
	}
	return grace
}

// RequestAllowance is the time reprieve allows a request to reach the API server: a grace cut
// to fit the window is computed from now + RequestAllowance, so that the request's own latency
// never pushes the pod's end past the window (graces are whole seconds, rounded down). Seen: a
// 40 s grace computed 10 ms before the window's end minus 40 s landed 20 ms later and ended
// 14 ms past it.
const RequestAllowance = 250 * time.Millisecond

// EvictionLead is how much before Latest a deadline-bound eviction is sent: the request's
// allowance plus room for the queue to wake late, so that such a pod still gets its whole grace
// (sent at Latest itself, the allowance would cost it a second).
const EvictionLead = RequestAllowance + 250*time.Millisecond

// SendAt is when the eviction loop sends plan's request: deadline-bound evictions leave early
// so that they keep their whole grace.
func SendAt(plan Plan) time.Time {
	if plan.ByDeadline {
		return plan.EvictAt.Add(-EvictionLead)
	}
	return plan.EvictAt
}

// NeedsShortening reports whether a pod that is already terminating (deleted by someone else,
// for example kube-controller-manager with the pod's full grace) would outlive the window, and
// so needs a DELETE with a shorter grace. Later DELETEs can only shorten a pod's grace.
func NeedsShortening(pod *v1.Pod, w Window) bool {
	if pod.DeletionTimestamp == nil || !w.HasDeadline() {
		return false
	}
	return pod.DeletionTimestamp.Add(Tail(pod)).After(w.End())
}
