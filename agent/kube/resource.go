package kube

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// resource is the typed client of one resource in one namespace ("" for a cluster-scoped
// resource or every namespace): the requests of client-go's gentype.Client, which this mirrors
// (k8s.io/client-go/gentype/type.go), without its fake and apply configurations, whose imports
// (client-go/testing, managedfields, the OpenAPI models) weigh more than the clients.
type resource[T, L runtime.Object] struct {
	client    rest.Interface
	resource  string
	namespace string
	newObject func() T
	newList   func() L
}

// Get reads the object name.
func (r *resource[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	out := r.newObject()
	err := r.client.Get().
		NamespaceIfScoped(r.namespace, r.namespace != "").
		Resource(r.resource).
		Name(name).
		VersionedParams(&opts, ParameterCodec).
		Do(ctx).
		Into(out)
	return out, err
}

// List lists the objects that opts selects.
func (r *resource[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	out := r.newList()
	err := r.client.Get().
		NamespaceIfScoped(r.namespace, r.namespace != "").
		Resource(r.resource).
		VersionedParams(&opts, ParameterCodec).
		Timeout(timeout(opts)).
		Do(ctx).
		Into(out)
	return out, err
}

// Watch watches the objects that opts selects.
func (r *resource[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return r.client.Get().
		NamespaceIfScoped(r.namespace, r.namespace != "").
		Resource(r.resource).
		VersionedParams(&opts, ParameterCodec).
		Timeout(timeout(opts)).
		Watch(ctx)
}

// Create creates obj.
func (r *resource[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	out := r.newObject()
	err := r.client.Post().
		NamespaceIfScoped(r.namespace, r.namespace != "").
		Resource(r.resource).
		VersionedParams(&opts, ParameterCodec).
		Body(obj).
		Do(ctx).
		Into(out)
	return out, err
}

// Patch patches the object name, or its subresource.
func (r *resource[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error) {
	out := r.newObject()
	err := r.client.Patch(pt).
		NamespaceIfScoped(r.namespace, r.namespace != "").
		Resource(r.resource).
		Name(name).
		SubResource(subresources...).
		VersionedParams(&opts, ParameterCodec).
		Body(data).
		Do(ctx).
		Into(out)
	return out, err
}

// Delete deletes the object name.
func (r *resource[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return r.client.Delete().
		NamespaceIfScoped(r.namespace, r.namespace != "").
		Resource(r.resource).
		Name(name).
		Body(&opts).
		Do(ctx).
		Error()
}

// timeout is the request's timeout that opts asks for, as gentype's List and Watch set it.
func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}
