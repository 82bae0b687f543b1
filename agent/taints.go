package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/reprieve-dev/reprieve/agent/plan"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
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

func taintID(t v1.Taint) string { return t.Key + ":" + string(t.Effect) }

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
	// AddedAt gives the timeAdded of each taint reprieve adds (by taintID); the writer keeps it
	// stable across retries and dry runs.
	AddedAt func(id string) time.Time
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
		want[taintID(d.Taints.Interruption)] = d.Taints.Interruption
	}
	for _, t := range d.Intent.SoftTaints {
		want[taintID(t)] = t
	}
	ownTaints := map[string]bool{}
	for _, id := range own.Taints {
		ownTaints[id] = true
	}
	var taints []v1.Taint
	present := map[string]bool{}
	for _, t := range node.Spec.Taints {
		id := taintID(t)
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
	meta := map[string]any{"resourceVersion": node.ResourceVersion}
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

// nodeWriter applies desires to the node.
type nodeWriter struct {
	client   kubernetes.Interface
	nodeName string
	dryRun   bool
	// cached returns the informer's copy of the node (nil when not known); a conflict falls
	// back to a live GET.
	cached func() *v1.Node
	// lastDryRun is the last change a dry run logged.
	lastDryRun string
	// written is the node as the last successful patch returned it, and writtenFrom the
	// resourceVersion the informer's copy had then. While the informer's copy is still at
	// writtenFrom it has not seen the write (after an API server outage its watch
	// backs off for up to 30 s), and written is the fresher view: without it every poll would
	// patch again and fail the resourceVersion precondition.
	written     *v1.Node
	writtenFrom string
	// cachedRV is the informer copy's resourceVersion that base last saw.
	cachedRV string
	// observe, when set, is told the outcome of every patch sent.
	observe func(error)
}

// base returns the node to compute a change from: the informer's copy, unless it has not yet
// caught up with reprieve's own last write.
func (w *nodeWriter) base() *v1.Node {
	if w.cached == nil {
		return nil
	}
	node := w.cached()
	if node == nil {
		return nil
	}
	w.cachedRV = node.ResourceVersion
	if w.written != nil && node.ResourceVersion == w.writtenFrom {
		return w.written
	}
	w.written = nil
	return node
}

// ensure makes the node carry d, retrying on conflict. It returns the change it made: empty
// when the node already was as wanted, or (in a dry run) when it already logged the same change.
func (w *nodeWriter) ensure(ctx context.Context, d NodeDesire) (NodeChange, error) {
	logger := klog.FromContext(ctx)
	first := true
	var done NodeChange
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		done = NodeChange{}
		var node *v1.Node
		if first {
			node = w.base()
		}
		first = false
		if node == nil {
			n, err := w.client.CoreV1().Nodes().Get(ctx, w.nodeName, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("getting node %s: %w", w.nodeName, err)
			}
			node = n
		}
		ch := ComputeNodeChange(node, d)
		if ch.Empty() {
			w.lastDryRun = ""
			return nil
		}
		patch, err := mergePatch(node, ch)
		if err != nil {
			return err
		}
		if w.dryRun {
			// Nothing is written, so the same change comes back at every poll: say it once.
			b, _ := json.Marshal(struct {
				T []v1.Taint
				L map[string]*string
				A map[string]*string
			}{ch.Taints, ch.Labels, ch.Annotations})
			if key := string(b); key != w.lastDryRun {
				w.lastDryRun = key
				logger.Info("Dry run: would patch node", "node", klog.KObj(node), "patch", string(patch))
				done = ch
			}
			return nil
		}
		logger.V(2).Info("Patching node", "node", klog.KObj(node), "patch", string(patch))
		out, err := w.client.CoreV1().Nodes().Patch(ctx, w.nodeName, types.MergePatchType, patch, metav1.PatchOptions{})
		if w.observe != nil {
			w.observe(err)
		}
		if err != nil {
			return fmt.Errorf("patching node %s: %w", w.nodeName, err)
		}
		w.written, w.writtenFrom = out, w.cachedRV
		done = ch
		return nil
	})
	return done, err
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

// hasTaint reports whether taints holds one with t's key and effect.
func hasTaint(taints []v1.Taint, t v1.Taint) bool {
	return slices.ContainsFunc(taints, func(x v1.Taint) bool { return x.Key == t.Key && x.Effect == t.Effect })
}
