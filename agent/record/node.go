// Package record owns what reprieve writes on its own node: the interruption record (the taint
// with its timeAdded, the deadline, the notices with their source and when they were first seen),
// its soft and pressure taints, the load-balancer label, and the one writer that every loop hands
// its wishes to. Any agent process (a restart, a rollout, the next pod after an OOM kill) reads
// the record back from the node and resumes it exactly.
package record

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/reprieve-dev/reprieve/agent/plan"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// owned is the content of AnnotationOwned: what reprieve added and so may remove.
type owned struct {
	Taints      []string `json:"taints,omitempty"`
	Labels      []string `json:"labels,omitempty"`
	Annotations []string `json:"annotations,omitempty"`
}

func parseOwned(node *v1.Node) owned {
	var o owned
	if s, ok := node.Annotations[AnnotationOwned]; ok {
		// A damaged record is treated as empty: reprieve then removes nothing it cannot prove
		// it added, which is the safe side.
		_ = json.Unmarshal([]byte(s), &o)
	}
	return o
}

// TaintID identifies a taint by key and effect, as the node holds at most one of each.
func TaintID(t v1.Taint) string { return t.Key + ":" + string(t.Effect) }

func parseTaintID(id string) (key string, effect v1.TaintEffect) {
	for i := len(id) - 1; i >= 0; i-- {
		if id[i] == ':' {
			return id[:i], v1.TaintEffect(id[i+1:])
		}
	}
	return id, ""
}

// NodeChange is the difference between a node and what reprieve wants on it.
type NodeChange struct {
	// Taints is the node's complete new taint list (spec.taints is atomic: a patch replaces it).
	Taints        []v1.Taint
	TaintsChanged bool
	// Labels and Annotations map keys to new values; nil values delete.
	Labels      map[string]*string
	Annotations map[string]*string
	// Added and Removed list reprieve's own taints that the change adds and removes.
	Added, Removed []v1.Taint
}

// Empty reports whether the node already is as wanted.
func (c NodeChange) Empty() bool {
	return !c.TaintsChanged && len(c.Labels) == 0 && len(c.Annotations) == 0
}

// NodeDesire holds what the writer computes a change from.
type NodeDesire struct {
	Intent plan.Intent
	Taints plan.TaintSet
	// WriteDeadline is false with --provider none, where the deadline annotation is the
	// operator's input and reprieve must not write or remove it.
	WriteDeadline bool
	// AddedAt gives the timeAdded of each taint reprieve adds (by TaintID); the writer keeps it
	// stable across retries and dry runs.
	AddedAt func(id string) time.Time
	// Record is the interruption record to carry (AnnotationInterruption) when WriteDeadline
	// is set; nil leaves the annotation as it is, an empty record removes reprieve's own.
	Record *Record
	// Conditions has the writer keep ConditionInterruption on the node's status
	// (--node-conditions), and Lifecycle also KEP-5683's LifecycleConditions
	// (--lifecycle-conditions). ComputeNodeChange ignores them; ComputeConditionChange reads them.
	Conditions, Lifecycle bool
	// Drained says that every pod reprieve evicts for the interruption is gone (the executor's
	// Drained), for the Drained lifecycle condition.
	Drained bool
}

// ComputeNodeChange is pure: it returns how node must change to carry desire, touching nothing
// reprieve did not add. A taint, label or annotation that someone else already put on the node
// is left as it is and not claimed, so that undoing a notice never removes another writer's work.
func ComputeNodeChange(node *v1.Node, d NodeDesire) NodeChange {
	own := parseOwned(node)
	ch := NodeChange{Labels: map[string]*string{}, Annotations: map[string]*string{}}

	// Taints.
	want := map[string]v1.Taint{}
	if d.Intent.Interrupting() {
		want[TaintID(d.Taints.Interruption)] = d.Taints.Interruption
	}
	for _, t := range d.Intent.SoftTaints {
		want[TaintID(t)] = t
	}
	ownTaints := map[string]bool{}
	for _, id := range own.Taints {
		ownTaints[id] = true
	}
	var taints []v1.Taint
	present := map[string]bool{}
	for _, t := range node.Spec.Taints {
		id := TaintID(t)
		if _, wanted := want[id]; !wanted && ownTaints[id] {
			ch.TaintsChanged = true
			ch.Removed = append(ch.Removed, t)
			delete(ownTaints, id)
			continue
		}
		present[id] = true
		taints = append(taints, t)
	}
	for _, id := range sortedKeys(want) {
		if present[id] {
			continue
		}
		t := want[id]
		at := metav1.NewTime(d.AddedAt(id))
		for _, r := range ch.Removed {
			// reprieve's own taint of the same key and value under another effect, which this
			// one replaces (--interruption-eviction switched between two agents mid-window):
			// the countdown began at its timeAdded, and must not restart now.
			if r.Key == t.Key && r.Value == t.Value && r.TimeAdded != nil && r.TimeAdded.Before(&at) {
				at = *r.TimeAdded
			}
		}
		t.TimeAdded = &at
		taints = append(taints, t)
		ch.Added = append(ch.Added, t)
		ownTaints[id] = true
		ch.TaintsChanged = true
	}
	ch.Taints = taints
	own.Taints = sortedKeys(ownTaints)

	// The exclude-from-load-balancers label.
	ownLabels := setOf(own.Labels)
	if d.Intent.Interrupting() {
		if _, ok := node.Labels[LabelExcludeFromLB]; !ok {
			ch.Labels[LabelExcludeFromLB] = ptr("true")
			ownLabels[LabelExcludeFromLB] = true
		}
	} else if ownLabels[LabelExcludeFromLB] {
		if _, ok := node.Labels[LabelExcludeFromLB]; ok {
			ch.Labels[LabelExcludeFromLB] = nil
		}
		delete(ownLabels, LabelExcludeFromLB)
	}
	own.Labels = sortedKeys(ownLabels)

	// The deadline annotation.
	ownAnn := setOf(own.Annotations)
	if d.WriteDeadline {
		cur, has := node.Annotations[AnnotationReclaimDeadline]
		switch {
		case d.Intent.Interrupting():
			v := d.Intent.Deadline.UTC().Format(time.RFC3339)
			if !has || (cur != v && ownAnn[AnnotationReclaimDeadline]) {
				ch.Annotations[AnnotationReclaimDeadline] = ptr(v)
				ownAnn[AnnotationReclaimDeadline] = true
			}
		case ownAnn[AnnotationReclaimDeadline]:
			if has {
				ch.Annotations[AnnotationReclaimDeadline] = nil
			}
			delete(ownAnn, AnnotationReclaimDeadline)
		}
	}
	if d.WriteDeadline && d.Record != nil {
		cur, has := node.Annotations[AnnotationInterruption]
		switch v := d.Record.encode(); {
		case v != "":
			if !has || (cur != v && ownAnn[AnnotationInterruption]) {
				ch.Annotations[AnnotationInterruption] = ptr(v)
				ownAnn[AnnotationInterruption] = true
			}
		case ownAnn[AnnotationInterruption]:
			if has {
				ch.Annotations[AnnotationInterruption] = nil
			}
			delete(ownAnn, AnnotationInterruption)
		}
	}
	own.Annotations = sortedKeys(ownAnn)

	// The ownership record itself.
	cur, has := node.Annotations[AnnotationOwned]
	if len(own.Taints)+len(own.Labels)+len(own.Annotations) == 0 {
		if has {
			ch.Annotations[AnnotationOwned] = nil
		}
	} else if b, _ := json.Marshal(own); !has || cur != string(b) {
		ch.Annotations[AnnotationOwned] = ptr(string(b))
	}
	return ch
}

// mergePatch builds a JSON merge patch (RFC 7386) for ch with node's resourceVersion as a
// precondition, as upstream's PatchNodeTaints does: spec.taints is replaced whole, so a write
// based on a stale read must fail with a conflict rather than drop another writer's taint.
func mergePatch(node *v1.Node, ch NodeChange) ([]byte, error) {
	meta := map[string]any{}
	if node.ResourceVersion != "" {
		// Empty only for the write check's dry run, which stores nothing.
		meta["resourceVersion"] = node.ResourceVersion
	}
	if len(ch.Labels) > 0 {
		meta["labels"] = ch.Labels
	}
	if len(ch.Annotations) > 0 {
		meta["annotations"] = ch.Annotations
	}
	patch := map[string]any{"metadata": meta}
	if ch.TaintsChanged {
		taints := ch.Taints
		if taints == nil {
			taints = []v1.Taint{}
		}
		patch["spec"] = map[string]any{"taints": taints}
	}
	b, err := json.Marshal(patch)
	if err != nil {
		return nil, fmt.Errorf("encoding node patch: %w", err)
	}
	return b, nil
}

func setOf(xs []string) map[string]bool {
	m := make(map[string]bool, len(xs))
	for _, x := range xs {
		m[x] = true
	}
	return m
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func ptr[T any](v T) *T { return &v }

// HasTaint reports whether taints holds one with t's key and effect.
func HasTaint(taints []v1.Taint, t v1.Taint) bool {
	return slices.ContainsFunc(taints, func(x v1.Taint) bool { return x.Key == t.Key && x.Effect == t.Effect })
}
