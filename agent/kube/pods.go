package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// metadataOnly is the Accept of a pod write whose answer the agent does not read: the API server
// then converts the pod it would return into a PartialObjectMetadata
// (transformResponseObject in k8s.io/apiserver/pkg/endpoints/handlers/response.go, which the
// create, update, patch and delete handlers all call), as client-go's metadata client asks for
// its reads, and sends no spec nor status. JSON second, for a server without the conversion.
const metadataOnly = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"

// pods is the pods client: resource's requests, except that a patch and a delete ask for the
// pod's metadata only and read the answer into nothing. A tenant's pod may be 1.5 MiB (the API
// server's limit on an object), all of it the tenant's own annotations, labels, env and args,
// and the agent writes to every pod on its node in an interruption (the warning condition, the
// fallback DELETE): each answer decoded whole came to several MiB of garbage per pod, and took
// the agent's peak past its memory limit (issue 39 item 3).
type pods struct {
	*resource[*corev1.Pod, *corev1.PodList]
}

// Patch patches pod name, or its subresource. The pod it returns carries only the namespace and
// name: no caller reads the answer, which is discarded as it arrives.
func (p pods) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Pod, error) {
	body, err := p.client.Patch(pt).
		NamespaceIfScoped(p.namespace, p.namespace != "").
		Resource(p.resource.resource).
		Name(name).
		SubResource(subresources...).
		VersionedParams(&opts, ParameterCodec).
		SetHeader("Accept", metadataOnly).
		Body(data).
		Stream(ctx)
	if err != nil {
		return nil, err
	}
	if err := discard(body); err != nil {
		return nil, fmt.Errorf("reading the answer to the patch of pod %s/%s: %w", p.namespace, name, err)
	}
	return &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Namespace: p.namespace, Name: name}}, nil
}

// Delete deletes pod name; the answer (the pod, now terminating) is discarded as it arrives.
func (p pods) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	body, err := p.client.Delete().
		NamespaceIfScoped(p.namespace, p.namespace != "").
		Resource(p.resource.resource).
		Name(name).
		SetHeader("Accept", metadataOnly).
		Body(&opts).
		Stream(ctx)
	if err != nil {
		return err
	}
	if err := discard(body); err != nil {
		return fmt.Errorf("reading the answer to the deletion of pod %s/%s: %w", p.namespace, name, err)
	}
	return nil
}

// discard reads an answer to its end through a small buffer, so that the connection is reused,
// and closes it.
func discard(body io.ReadCloser) error {
	_, err := io.Copy(io.Discard, body)
	if cerr := body.Close(); err == nil {
		err = cerr
	}
	return err
}

// metadataListOnly is the Accept of a list of pods whose metadata alone is read.
const metadataListOnly = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

// ListPodMetadata lists the metadata of the pods in namespace ("" for all) that opts selects, as
// client-go's metadata client does (k8s.io/client-go/metadata, List): the API server sends no
// spec nor status, a tenant's env and args among them. A pod's metadata may still hold 256 KiB
// of annotations and its labels: page with opts.Limit. A field selector on status.phase keeps
// finished pods out (a field the API server indexes for pods: pods' GetAttrs).
func ListPodMetadata(ctx context.Context, c Interface, namespace string, opts metav1.ListOptions) (*metav1.PartialObjectMetadataList, error) {
	rc := c.CoreV1().RESTClient()
	// client-go's fake clientset (kubetest) returns a nil *rest.RESTClient: an error, not a panic.
	if r, ok := rc.(*rest.RESTClient); rc == nil || (ok && r == nil) {
		return nil, fmt.Errorf("listing the metadata of pods: the client has no REST client")
	}
	raw, err := rc.Get().
		NamespaceIfScoped(namespace, namespace != "").
		Resource("pods").
		VersionedParams(&opts, ParameterCodec).
		SetHeader("Accept", metadataListOnly).
		Do(ctx).
		Raw()
	if err != nil {
		return nil, err
	}
	list := &metav1.PartialObjectMetadataList{}
	if err := json.Unmarshal(raw, list); err != nil {
		return nil, fmt.Errorf("decoding the list of pods' metadata: %w", err)
	}
	return list, nil
}
