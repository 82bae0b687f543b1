package guard

import (
	"context"
	"errors"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"unique"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// PodIndex is the guard's memory of the cluster's pods, fed by a watch of every pod bound to a
// node (a cache.Reflector whose store it is), so that a review is answered without a call to the
// API server it admits for (issue 46: under a reclaimed pool the guard's GET per review queued
// behind the very evictions that waited for it, and the webhook timed out).
//
// It keeps, per pod UID, the node the pod is bound to and a hash of its namespace and name, and
// nothing else (indexEntry). The UID is the key because the guard admits only evictions that
// carry a UID precondition (Handler.review): the API server deletes the pod the Eviction names
// only if it still has that UID (the eviction registry's precondition check), so the UID alone
// names the one pod the eviction can end, and a pod's node never changes once it is bound (the
// binding subresource refuses a pod that has one; spec.nodeName is immutable on update). So what
// the index knows of a UID stays true while the pod lives, whether or not the watch is current:
//
//   - a pod re-created under the same name has a new UID: an eviction with the old UID can only
//     fail its precondition, and one with the new UID is judged by the new pod's node;
//   - a pod the index has not seen bound yet (created a moment ago, or while the watch is down)
//     is not known: the Handler reads it with a GET (its pod-read budget bounds those);
//   - a pod deleted since the index saw it is judged by the node it was on: the eviction then
//     finds no pod (404) or another UID (409).
//
// The namespace and name are kept as a hash to refuse an eviction whose UID is another pod's
// (the API server would refuse it too, with 409): that check needs no more, and the names of a
// hundred thousand pods would cost more than the rest of the index.
type PodIndex struct {
	seed maphash.Seed

	mu    sync.RWMutex
	byUID map[types.UID]indexEntry

	synced  atomic.Bool
	metrics *IndexMetrics
	// changed, if set, is called after every change (tests wait on it instead of sleeping).
	changed func()
	// reckoner, if set, is handed each pod's reprieve mark (Reckoner).
	reckoner *Reckoner
}

// indexEntry is what the index keeps of one pod. The node's name is interned (unique.Make): the
// pods of a node share one copy, and a node gone with all its pods leaves none behind.
type indexEntry struct {
	pod  uint64 // maphash of namespace + "/" + name
	node unique.Handle[string]
}

// indexedPod is a pod trimmed to what the index keeps, with its UID: the reflector's transform
// (PodIndex.Transformer) makes one of every pod it receives, before it holds on to it.
type indexedPod struct {
	uid types.UID
	indexEntry
	// mark is the pod's reprieve mark, for the Reckoner; nil for almost every pod.
	mark *podMark
}

// NewPodIndex returns an empty index; Run fills it. m may be nil.
func NewPodIndex(m *IndexMetrics) *PodIndex {
	return &PodIndex{seed: maphash.MakeSeed(), byUID: map[types.UID]indexEntry{}, metrics: m}
}

// IndexSelector is the field selector of the index's list and watch: pods bound to a node. A
// pod the scheduler has not placed cannot be judged by its node; its binding comes as an add.
const IndexSelector = "spec.nodeName!="

// indexListPage is how many pods a page of the index's list holds. Each page is trimmed before
// the next is read, so that a list decodes at most this many whole pods at once: client-go's
// reflector decodes a list whole before anything trims it (a peak of 1.2 GiB at 100,000 pods,
// BenchmarkPodIndexMemory).
const indexListPage = 500

// ListWatch is the list and watch the index runs on, over a client's pods of every namespace:
// IndexSelector applied, and each list or watch that fails to start counted. The list pages
// through the pods from the most recent state (a consistent read, as the reflector's own relists
// make), trimming each page to the index's entries; a watch-list (kube-apiserver 1.34 and later)
// streams them through the index's transform instead, and lists nothing.
func (x *PodIndex) ListWatch(list func(context.Context, metav1.ListOptions) (*v1.PodList, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	failed := func(err error) error {
		if err != nil && x.metrics != nil {
			x.metrics.ListWatchErrors.Inc()
		}
		return err
	}
	l := func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		o.FieldSelector, o.Limit, o.ResourceVersion, o.ResourceVersionMatch = IndexSelector, indexListPage, "", ""
		out := &indexList{}
		for {
			page, err := list(ctx, o)
			if err != nil {
				// An expired continue token too: the reflector lists again, from the start.
				return nil, failed(err)
			}
			for i := range page.Items {
				if e, ok := x.trim(&page.Items[i]); ok {
					out.Items = append(out.Items, e)
				}
			}
			if page.Continue == "" {
				out.ResourceVersion = page.ResourceVersion
				return out, nil
			}
			o.Continue = page.Continue
		}
	}
	w := func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.FieldSelector = IndexSelector
		wi, err := watchFn(ctx, o)
		return wi, failed(err)
	}
	// The deprecated context-free funcs too, as the generated informers give them: a
	// ListerWatcher is expected to have both.
	return &cache.ListWatch{ListWithContextFunc: l, WatchFuncWithContext: w,
		ListFunc:  func(o metav1.ListOptions) (runtime.Object, error) { return l(context.Background(), o) },
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) { return w(context.Background(), o) }}
}

// indexList is a list trimmed to the index's entries (ListWatch), which the reflector hands to
// Replace item by item (meta.ExtractList reads Items).
type indexList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []indexedPod
}

// DeepCopyObject copies the list (runtime.Object).
func (l *indexList) DeepCopyObject() runtime.Object {
	c := *l
	c.Items = slices.Clone(l.Items)
	return &c
}

// GetObjectKind is an entry's (runtime.Object): none.
func (p *indexedPod) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies the entry (runtime.Object).
func (p *indexedPod) DeepCopyObject() runtime.Object {
	c := *p
	return &c
}

// Run keeps the index from lw (a list and watch of pods, IndexSelector applied) until ctx ends:
// the reflector lists (or streams the list, where the API server and client serve watch-list),
// watches, and lists and watches again after a failure, with client-go's backoff. While it is
// between watches, the index keeps what it had: see PodIndex.
func (x *PodIndex) Run(ctx context.Context, lw cache.ListerWatcher) {
	r := cache.NewReflectorWithOptions(lw, &v1.Pod{}, x, cache.ReflectorOptions{Name: "eviction-guard-pods", TypeDescription: "*v1.Pod"})
	r.RunWithContext(ctx)
}

// Reckon hands each pod's reprieve mark to r from now on (call it before Run).
func (x *PodIndex) Reckon(r *Reckoner) { x.reckoner = r }

// Synced says whether the index has had its first full list: before it, every review reads its
// pod (the guard is not ready then, so the API server's Service sends it none).
func (x *PodIndex) Synced() bool { return x.synced.Load() }

// errNotSynced is IndexReady's answer before the first full list.
var errNotSynced = errors.New("the pod index has not had its first list of the cluster's pods yet")

// IndexReady is the guard's readiness with the index x (ServerOptions.Ready): not ready before
// its first full list, when every review would cost a GET and the read budget would refuse a
// reclaimed pool; ready from then on, whether or not its watch is current (PodIndex).
func (x *PodIndex) IndexReady() error {
	if !x.Synced() {
		return errNotSynced
	}
	return nil
}

// Len is how many pods the index holds.
func (x *PodIndex) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.byUID)
}

// Location is what the index says of the pod an eviction names.
type Location int

// The index's answers.
const (
	// Unknown: the index has not seen a bound pod with the UID; the pod must be read.
	Unknown Location = iota
	// Bound: the pod with the UID is the one named, bound to the node returned.
	Bound
	// OtherPod: the UID is a pod of another namespace or name than the one named.
	OtherPod
)

// Locate says where the pod namespace/name with uid is bound, as far as the index knows.
func (x *PodIndex) Locate(namespace, name string, uid types.UID) (node string, loc Location) {
	x.mu.RLock()
	e, ok := x.byUID[uid]
	x.mu.RUnlock()
	switch {
	case !ok:
		return "", Unknown
	case e.pod != x.podHash(namespace, name):
		return "", OtherPod
	}
	return e.node.Value(), Bound
}

func (x *PodIndex) podHash(namespace, name string) uint64 {
	var h maphash.Hash
	h.SetSeed(x.seed)
	_, _ = h.WriteString(namespace)
	_ = h.WriteByte('/')
	_, _ = h.WriteString(name)
	return h.Sum64()
}

// trim makes the index's entry of obj: a *v1.Pod, or an entry trimmed already. ok is false for
// anything else, and for a pod without a UID or a node.
func (x *PodIndex) trim(obj any) (indexedPod, bool) {
	switch o := obj.(type) {
	case *indexedPod:
		return *o, true
	case *v1.Pod:
		if o.UID == "" || o.Spec.NodeName == "" {
			return indexedPod{}, false
		}
		e := indexedPod{uid: o.UID, indexEntry: indexEntry{pod: x.podHash(o.Namespace, o.Name), node: unique.Make(o.Spec.NodeName)}}
		if m, ok := markOf(o); ok {
			e.mark = &m
		}
		return e, true
	case cache.DeletedFinalStateUnknown:
		return x.trim(o.Obj)
	}
	return indexedPod{}, false
}

// Transformer trims each pod to what the index keeps before the reflector stores it
// (cache.TransformingStore): while a watch-list streams the cluster's pods, its temporary store
// then holds entries of a few dozen bytes, not whole pods. Objects that are no pod pass as they
// are.
func (x *PodIndex) Transformer() cache.TransformFunc {
	return func(obj any) (any, error) {
		if p, ok := obj.(*v1.Pod); ok {
			if e, ok := x.trim(p); ok {
				return &e, nil
			}
		}
		return obj, nil
	}
}

// Add records a pod (cache.ReflectorStore).
func (x *PodIndex) Add(obj any) error {
	if e, ok := x.trim(obj); ok {
		x.mu.Lock()
		x.byUID[e.uid] = e.indexEntry
		n := len(x.byUID)
		x.mu.Unlock()
		if x.reckoner != nil {
			x.reckoner.observe(e.uid, e.mark, false)
		}
		x.after(n)
	}
	return nil
}

// Update records a pod's new state; its node cannot have changed, but it may just have been bound.
func (x *PodIndex) Update(obj any) error { return x.Add(obj) }

// Delete forgets a pod.
func (x *PodIndex) Delete(obj any) error {
	var uid types.UID
	switch o := obj.(type) {
	case *v1.Pod:
		uid = o.UID
	case *indexedPod:
		uid = o.uid
	case cache.DeletedFinalStateUnknown:
		return x.Delete(o.Obj)
	default:
		return nil
	}
	x.mu.Lock()
	delete(x.byUID, uid)
	n := len(x.byUID)
	x.mu.Unlock()
	if x.reckoner != nil {
		x.reckoner.observe(uid, nil, true)
	}
	x.after(n)
	return nil
}

// Replace sets the index to a full list (the reflector's list, or its streamed watch-list), and
// marks it synced. The new map is built before the lock is taken: reviews go on meanwhile.
func (x *PodIndex) Replace(list []any, _ string) error {
	m := make(map[types.UID]indexEntry, len(list))
	marks := map[types.UID]podMark{}
	for _, obj := range list {
		if e, ok := x.trim(obj); ok {
			m[e.uid] = e.indexEntry
			if e.mark != nil {
				marks[e.uid] = *e.mark
			}
		}
	}
	if x.reckoner != nil {
		x.reckoner.replace(marks, func(uid types.UID) bool { _, ok := m[uid]; return ok })
	}
	x.mu.Lock()
	x.byUID = m
	x.mu.Unlock()
	if !x.synced.Swap(true) && x.metrics != nil {
		x.metrics.Synced.Set(1)
	}
	x.after(len(m))
	return nil
}

// Resync does nothing: the index has no handlers to replay to.
func (x *PodIndex) Resync() error { return nil }

func (x *PodIndex) after(n int) {
	if x.metrics != nil {
		x.metrics.Pods.Set(float64(n))
	}
	if x.changed != nil {
		x.changed()
	}
}
