package record

import v1 "k8s.io/api/core/v1"

// Every key reprieve writes on nodes and pods, in one place. The taints' keys are flags
// (config.DefaultConfig: cloud=spot, reprieve.io/rebalance-recommended,
// reprieve.io/scheduled-maintenance) and the pressure loop's (pressure.TaintKey:
// reprieve.io/{memory,disk,pid}-pressure); `reprieve cleanup` removes every key under Prefix
// (Cleanup).

// Prefix is the prefix of reprieve's own taint, annotation and condition keys.
const Prefix = "reprieve.io/"

// Annotation and label keys that reprieve writes on its node and its pods.
const (
	// AnnotationReclaimDeadline holds the reclaim deadline (RFC 3339) while an interruption is
	// pending. With --provider none it is the input: an operator sets it to start the handling.
	AnnotationReclaimDeadline = "reprieve.io/reclaim-deadline"
	// AnnotationEvictAt is when reprieve plans to evict a pod (RFC 3339), written on the pod by
	// the agent's pod notice with AnnotationReclaimDeadline; absent on a pod that tolerates the
	// interruption forever. The eviction guard reckons from it (guard.Reckoner).
	AnnotationEvictAt = "reprieve.io/evict-at"
	// AnnotationOwned records which taints, labels and annotations reprieve added, so that it
	// removes only those when a notice goes away.
	AnnotationOwned = "reprieve.io/owned"
	// AnnotationInterruption holds the interruption record (Record, JSON): every notice in
	// force with its source and when it was first seen, so that a new agent process resumes
	// each deadline and countdown where the last one left them.
	AnnotationInterruption = "reprieve.io/interruption"
	// LabelExcludeFromLB takes the node out of external load balancers while it is going away.
	LabelExcludeFromLB = v1.LabelNodeExcludeBalancers

	// PodConditionInterruption is the condition of the pods' early warning (--pod-notice):
	// True while a notice plans the pod's eviction (or, for a pod that tolerates the
	// interruption forever, its end with the machine), False once withdrawn. The pod carries
	// AnnotationEvictAt and AnnotationReclaimDeadline beside it, which a job reads through the
	// downward API to checkpoint at the notice rather than at SIGTERM.
	PodConditionInterruption v1.PodConditionType = "reprieve.io/Interruption"
)

// ConditionInterruption is the node condition reprieve sets beside its interruption taint, so
// that `kubectl describe node`, node-problem-detector-style dashboards and autoscalers see the
// interruption where they look for a node's state: True with the notice's event reason and a
// message naming the deadline and the source, False (reason NoInterruption) once withdrawn.
const ConditionInterruption v1.NodeConditionType = "reprieve.io/Interruption"

// LifecycleConditions are KEP-5683's node lifecycle conditions (k8s.io/api core/v1, alpha in
// Kubernetes 1.37 behind the NodeLifecycleConditions gate) that reprieve sets with
// --lifecycle-conditions: MaintenancePlanned at a notice that will stop the node,
// DrainInProgress while reprieve evicts for an interruption, Drained once every pod it evicts
// is gone. Upstream leaves their writers to the admin ("Any authorized actor can write"), so
// reprieve changes one only while it carries one of reprieve's reasons (ownReason), and never
// turns off another writer's (kubectl drain --report-node-conditions).
var LifecycleConditions = []v1.NodeConditionType{v1.NodeMaintenancePlanned, v1.NodeDrainInProgress, v1.NodeDrained}
