// Package informer is the agent's two informers, of its own node and of that node's pods, built
// from the core client alone, and what their caches keep of each object (Trim): an allow-list
// with every kept field's reader named, bounded against what a tenant may write into a pod.
package informer

import (
	"context"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/reprieve-dev/reprieve/agent/kube"
)

// New is the informer of one resource that the generated informers of
// k8s.io/client-go/informers/core/v1 build (NewTypedNodeInformerWithOptions), over the given
// list and watch, with the namespace index the listers use. Built here from the core client
// alone: the factory's ForResource names every group's informer and lister, which linked all of
// them into the binary. Its transform trims each object before the cache stores it.
func New(client kube.Interface, example k8sruntime.Object,
	list cache.ListWithContextFunc, watchFn cache.WatchFuncWithContext) cache.SharedIndexInformer {
	// The deprecated context-free funcs too, as the generated informers give them: a
	// ListerWatcher is expected to have both.
	lw := &cache.ListWatch{
		ListWithContextFunc:  list,
		WatchFuncWithContext: watchFn,
		ListFunc:             func(o metav1.ListOptions) (k8sruntime.Object, error) { return list(context.Background(), o) },
		WatchFunc:            func(o metav1.ListOptions) (watch.Interface, error) { return watchFn(context.Background(), o) },
	}
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), example,
		cache.SharedIndexInformerOptions{
			Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
		})
	// Only a started informer refuses a transform; this one has not started.
	_ = inf.SetTransform(Trim)
	return inf
}

// Node is the informer of the node named name alone: the agent must stay cheap for the API
// server at thousands of nodes.
func Node(client kube.Interface, name string) cache.SharedIndexInformer {
	core := client.CoreV1()
	sel := fields.OneTermEqualSelector(metav1.ObjectNameField, name).String()
	return New(client, &v1.Node{},
		func(ctx context.Context, o metav1.ListOptions) (k8sruntime.Object, error) {
			o.FieldSelector = sel
			return core.Nodes().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return core.Nodes().Watch(ctx, o)
		})
}

// Pods is the informer of the pods bound to the node named node, and no other.
func Pods(client kube.Interface, node string) cache.SharedIndexInformer {
	core := client.CoreV1()
	sel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	return New(client, &v1.Pod{},
		func(ctx context.Context, o metav1.ListOptions) (k8sruntime.Object, error) {
			o.FieldSelector = sel
			return core.Pods(metav1.NamespaceAll).List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return core.Pods(metav1.NamespaceAll).Watch(ctx, o)
		})
}
