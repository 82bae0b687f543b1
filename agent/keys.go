// Package agent is reprieve's node agent: it turns a cloud's notices into taints on its own node
// and evicts the node's pods at the time upstream Kubernetes semantics give them, clamped so that
// every evicted pod has finished terminating before the machine is reclaimed.
package agent

import "github.com/reprieve-dev/reprieve/agent/record"

// Annotation, label and taint keys that reprieve writes.
const (
	// AnnotationReclaimDeadline holds the reclaim deadline (RFC 3339) while an interruption is
	// pending. With --provider none it is the input: an operator sets it to start the handling.
	AnnotationReclaimDeadline = record.AnnotationReclaimDeadline
	// AnnotationOwned records which taints, labels and annotations reprieve added, so that it
	// removes only those when a notice goes away.
	AnnotationOwned = record.AnnotationOwned
	// AnnotationInterruption holds the interruption record: every notice in force with its
	// source and when it was first seen, which a new agent process resumes.
	AnnotationInterruption = record.AnnotationInterruption
	// LabelExcludeFromLB takes the node out of external load balancers while it is going away.
	LabelExcludeFromLB = record.LabelExcludeFromLB
)
