package kube

import (
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
)

// Scheme registers only the API groups reprieve calls: core/v1 (nodes, pods, events),
// policy/v1 (evictions, budgets), authentication.k8s.io/v1 and authorization.k8s.io/v1
// (doctor's reviews), apps/v1 and batch/v1 (audit's owners), and the meta types every request
// carries (the options, Status, WatchEvent). client-go's kubernetes/scheme registers every group
// at init, so that importing it (any typed client of kubernetes/typed/... does) links the
// generated code of all of them (docs/benchmarks.md, "Footprint").
var Scheme = runtime.NewScheme()

// Codecs are Scheme's serializers: JSON, YAML, protobuf and CBOR, as client-go's scheme.Codecs.
var Codecs = serializer.NewCodecFactory(Scheme)

// ParameterCodec encodes the options of a request (ListOptions, PatchOptions...) as its query.
var ParameterCodec = runtime.NewParameterCodec(Scheme)

var schemeBuilder = runtime.SchemeBuilder{
	corev1.AddToScheme,
	policyv1.AddToScheme,
	authenticationv1.AddToScheme,
	authorizationv1.AddToScheme,
	appsv1.AddToScheme,
	batchv1.AddToScheme,
	storagev1.AddToScheme,
}

// AddToScheme registers reprieve's groups in a scheme.
var AddToScheme = schemeBuilder.AddToScheme

// Mirrors k8s.io/client-go/kubernetes/scheme/register.go: the unversioned meta types under
// "v1" first, then the groups.
func init() {
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	utilruntime.Must(AddToScheme(Scheme))
}
