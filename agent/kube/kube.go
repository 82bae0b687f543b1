// Package kube is reprieve's Kubernetes client: the few resources and verbs the agent and its
// commands call, over rest.RESTClient and a scheme of only their groups (Scheme). Its interfaces
// have the shape and method signatures of client-go's typed clients, so that the code reads as
// it would with kubernetes.Interface and a typed client of client-go satisfies each of the
// narrow interfaces here; kubetest wraps client-go's fake clientset for unit tests. The binary
// does not import k8s.io/client-go/kubernetes: its scheme registers every API group, whose
// generated code was a third of the binary (docs/benchmarks.md, "Footprint").
package kube

import (
	"context"
	"fmt"
	"net/http"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Interface is the client of every group reprieve calls.
type Interface interface {
	CoreV1() CoreV1Interface
	PolicyV1() PolicyV1Interface
	AuthenticationV1() AuthenticationV1Interface
	AuthorizationV1() AuthorizationV1Interface
	AppsV1() AppsV1Interface
	BatchV1() BatchV1Interface
	StorageV1() StorageV1Interface
	Discovery() DiscoveryInterface
}

// CoreV1Interface is the core group's client: nodes, pods and events, and the claims and
// volumes of the pods whose volumes must be released in a window.
type CoreV1Interface interface {
	// RESTClient sends requests the typed clients do not make (agent/evict's eviction).
	RESTClient() rest.Interface
	Nodes() NodeInterface
	Pods(namespace string) PodInterface
	Events(namespace string) EventInterface
	PersistentVolumeClaims(namespace string) PersistentVolumeClaimInterface
	PersistentVolumes() PersistentVolumeInterface
}

// PersistentVolumeClaimInterface reads one claim (a pod's volumes, during a window).
type PersistentVolumeClaimInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.PersistentVolumeClaim, error)
}

// PersistentVolumeInterface reads one volume (a claim's, during a window).
type PersistentVolumeInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.PersistentVolume, error)
}

// NodeInterface reads, watches and patches nodes (the node record, the claim, doctor's dry run).
type NodeInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Node, error)
}

// PodInterface reads, watches, patches (the status's warning condition) and deletes pods.
// This package's Patch returns the pod's metadata only, and its Delete reads only that of the
// answer (pods.go): a tenant's pod may be 1.5 MiB.
type PodInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Pod, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// EventInterface writes core/v1 events: Create for one event, the rest for the event
// recorder's sink (EventSink), as client-go's EventExpansion.
type EventInterface interface {
	Create(ctx context.Context, event *corev1.Event, opts metav1.CreateOptions) (*corev1.Event, error)
	CreateWithEventNamespaceWithContext(ctx context.Context, event *corev1.Event) (*corev1.Event, error)
	UpdateWithEventNamespaceWithContext(ctx context.Context, event *corev1.Event) (*corev1.Event, error)
	PatchWithEventNamespaceWithContext(ctx context.Context, event *corev1.Event, data []byte) (*corev1.Event, error)
}

// PolicyV1Interface is policy/v1's client: budgets (audit, plan) and evictions (doctor).
type PolicyV1Interface interface {
	PodDisruptionBudgets(namespace string) PodDisruptionBudgetInterface
	Evictions(namespace string) EvictionInterface
}

// PodDisruptionBudgetInterface lists budgets.
type PodDisruptionBudgetInterface interface {
	List(ctx context.Context, opts metav1.ListOptions) (*policyv1.PodDisruptionBudgetList, error)
}

// EvictionInterface posts evictions, with client-go's retries of a 429 (agent/evict posts its
// own on the REST client, without them).
type EvictionInterface interface {
	Evict(ctx context.Context, eviction *policyv1.Eviction) error
}

// AuthenticationV1Interface creates SelfSubjectReviews (doctor: who the agent is).
type AuthenticationV1Interface interface {
	SelfSubjectReviews() SelfSubjectReviewInterface
}

// SelfSubjectReviewInterface creates a SelfSubjectReview.
type SelfSubjectReviewInterface interface {
	Create(ctx context.Context, review *authenticationv1.SelfSubjectReview, opts metav1.CreateOptions) (*authenticationv1.SelfSubjectReview, error)
}

// AuthorizationV1Interface creates SelfSubjectAccessReviews (doctor: what the agent may do).
type AuthorizationV1Interface interface {
	SelfSubjectAccessReviews() SelfSubjectAccessReviewInterface
}

// SelfSubjectAccessReviewInterface creates a SelfSubjectAccessReview.
type SelfSubjectAccessReviewInterface interface {
	Create(ctx context.Context, review *authorizationv1.SelfSubjectAccessReview, opts metav1.CreateOptions) (*authorizationv1.SelfSubjectAccessReview, error)
}

// AppsV1Interface lists ReplicaSets (audit: a pod's workload).
type AppsV1Interface interface {
	ReplicaSets(namespace string) ReplicaSetInterface
}

// ReplicaSetInterface lists ReplicaSets.
type ReplicaSetInterface interface {
	List(ctx context.Context, opts metav1.ListOptions) (*appsv1.ReplicaSetList, error)
}

// BatchV1Interface lists Jobs (audit: a pod's workload).
type BatchV1Interface interface {
	Jobs(namespace string) JobInterface
}

// JobInterface lists Jobs.
type JobInterface interface {
	List(ctx context.Context, opts metav1.ListOptions) (*batchv1.JobList, error)
}

// StorageV1Interface is storage.k8s.io/v1's client: CSIDrivers (whether a pod's volume attaches).
type StorageV1Interface interface {
	CSIDrivers() CSIDriverInterface
}

// CSIDriverInterface reads one CSIDriver.
type CSIDriverInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*storagev1.CSIDriver, error)
}

// DiscoveryInterface reads the server's version (doctor).
type DiscoveryInterface interface {
	ServerVersion() (*version.Info, error)
}

// Clientset is Interface over one REST client per group, sharing one HTTP client and one rate
// limiter as kubernetes.NewForConfig's clients do.
type Clientset struct {
	core, policy, authentication, authorization, apps, batch, storage *rest.RESTClient
}

// NewForConfig builds the clients of cfg: over one HTTP client and one rate limiter (cfg's QPS
// and burst bound the groups together), each group's client configured as client-go's
// setConfigDefaults does, with this package's Scheme.
func NewForConfig(restCfg *rest.Config) (*Clientset, error) {
	cfg := rest.CopyConfig(restCfg)
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if cfg.RateLimiter == nil && cfg.QPS > 0 {
		if cfg.Burst <= 0 {
			return nil, fmt.Errorf("creating the Kubernetes client: burst %d must be above 0 when QPS is set", cfg.Burst)
		}
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the HTTP client: %w", err)
	}
	c := &Clientset{}
	for _, g := range []struct {
		gv   schema.GroupVersion
		path string
		into **rest.RESTClient
	}{
		{corev1.SchemeGroupVersion, "/api", &c.core},
		{policyv1.SchemeGroupVersion, "/apis", &c.policy},
		{authenticationv1.SchemeGroupVersion, "/apis", &c.authentication},
		{authorizationv1.SchemeGroupVersion, "/apis", &c.authorization},
		{appsv1.SchemeGroupVersion, "/apis", &c.apps},
		{batchv1.SchemeGroupVersion, "/apis", &c.batch},
		{storagev1.SchemeGroupVersion, "/apis", &c.storage},
	} {
		if *g.into, err = newRESTClient(cfg, hc, g.gv, g.path); err != nil {
			return nil, fmt.Errorf("creating the %s client: %w", g.gv, err)
		}
	}
	return c, nil
}

// newRESTClient is the REST client of group version gv, as client-go's generated clients build
// theirs (setConfigDefaults in k8s.io/client-go/kubernetes/typed/core/v1/core_client.go).
func newRESTClient(cfg *rest.Config, hc *http.Client, gv schema.GroupVersion, path string) (*rest.RESTClient, error) {
	c := *cfg
	c.GroupVersion = &gv
	c.APIPath = path
	c.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(Scheme, Codecs).WithoutConversion()
	return rest.RESTClientForConfigAndClient(&c, hc)
}

// UseProtobuf makes every request of cfg's clients speak protobuf, as kube-controller-manager
// and the kubelet do for built-in types (their --kube-api-content-type default), with JSON still
// accepted: client-go's typed clients prefer protobuf on their own
// (Request.UseProtobufAsDefaultIfPreferred), this package's need the config to say so. Patches
// keep their own content types.
func UseProtobuf(cfg *rest.Config) {
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
}

// CoreV1 is the core group's client.
func (c *Clientset) CoreV1() CoreV1Interface { return coreV1{c.core} }

// PolicyV1 is policy/v1's client.
func (c *Clientset) PolicyV1() PolicyV1Interface { return policyV1{c.policy} }

// AuthenticationV1 is authentication.k8s.io/v1's client.
func (c *Clientset) AuthenticationV1() AuthenticationV1Interface {
	return authenticationV1{c.authentication}
}

// AuthorizationV1 is authorization.k8s.io/v1's client.
func (c *Clientset) AuthorizationV1() AuthorizationV1Interface {
	return authorizationV1{c.authorization}
}

// AppsV1 is apps/v1's client.
func (c *Clientset) AppsV1() AppsV1Interface { return appsV1{c.apps} }

// BatchV1 is batch/v1's client.
func (c *Clientset) BatchV1() BatchV1Interface { return batchV1{c.batch} }

// StorageV1 is storage.k8s.io/v1's client.
func (c *Clientset) StorageV1() StorageV1Interface { return storageV1{c.storage} }

// Discovery reads the server's version.
func (c *Clientset) Discovery() DiscoveryInterface { return discovery{c.core} }

type coreV1 struct{ c *rest.RESTClient }

func (g coreV1) RESTClient() rest.Interface { return g.c }

func (g coreV1) Nodes() NodeInterface {
	return &resource[*corev1.Node, *corev1.NodeList]{client: g.c, resource: "nodes",
		newObject: func() *corev1.Node { return &corev1.Node{} }, newList: func() *corev1.NodeList { return &corev1.NodeList{} }}
}

func (g coreV1) Pods(namespace string) PodInterface {
	return pods{&resource[*corev1.Pod, *corev1.PodList]{client: g.c, resource: "pods", namespace: namespace,
		newObject: func() *corev1.Pod { return &corev1.Pod{} }, newList: func() *corev1.PodList { return &corev1.PodList{} }}}
}

func (g coreV1) Events(namespace string) EventInterface {
	return events{&resource[*corev1.Event, *corev1.EventList]{client: g.c, resource: "events", namespace: namespace,
		newObject: func() *corev1.Event { return &corev1.Event{} }, newList: func() *corev1.EventList { return &corev1.EventList{} }}}
}

func (g coreV1) PersistentVolumeClaims(namespace string) PersistentVolumeClaimInterface {
	return &resource[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList]{client: g.c, resource: "persistentvolumeclaims", namespace: namespace,
		newObject: func() *corev1.PersistentVolumeClaim { return &corev1.PersistentVolumeClaim{} },
		newList:   func() *corev1.PersistentVolumeClaimList { return &corev1.PersistentVolumeClaimList{} }}
}

func (g coreV1) PersistentVolumes() PersistentVolumeInterface {
	return &resource[*corev1.PersistentVolume, *corev1.PersistentVolumeList]{client: g.c, resource: "persistentvolumes",
		newObject: func() *corev1.PersistentVolume { return &corev1.PersistentVolume{} },
		newList:   func() *corev1.PersistentVolumeList { return &corev1.PersistentVolumeList{} }}
}

type policyV1 struct{ c *rest.RESTClient }

func (g policyV1) PodDisruptionBudgets(namespace string) PodDisruptionBudgetInterface {
	return &resource[*policyv1.PodDisruptionBudget, *policyv1.PodDisruptionBudgetList]{client: g.c, resource: "poddisruptionbudgets", namespace: namespace,
		newObject: func() *policyv1.PodDisruptionBudget { return &policyv1.PodDisruptionBudget{} },
		newList:   func() *policyv1.PodDisruptionBudgetList { return &policyv1.PodDisruptionBudgetList{} }}
}

func (g policyV1) Evictions(namespace string) EvictionInterface { return evictions{g.c, namespace} }

type evictions struct {
	c         *rest.RESTClient
	namespace string
}

// Evict posts the eviction of a pod, as client-go's policy/v1 EvictionExpansion: the pod's
// subresource is in the core group's path.
func (e evictions) Evict(ctx context.Context, eviction *policyv1.Eviction) error {
	if e.namespace != "" && eviction.Namespace != e.namespace {
		return fmt.Errorf("evicting pod %s/%s: the client is for namespace %s", eviction.Namespace, eviction.Name, e.namespace)
	}
	return e.c.Post().
		AbsPath("/api/v1").
		Namespace(eviction.Namespace).
		Resource("pods").
		Name(eviction.Name).
		SubResource("eviction").
		Body(eviction).
		Do(ctx).
		Error()
}

type authenticationV1 struct{ c *rest.RESTClient }

func (g authenticationV1) SelfSubjectReviews() SelfSubjectReviewInterface {
	return &resource[*authenticationv1.SelfSubjectReview, *authenticationv1.SelfSubjectReview]{client: g.c, resource: "selfsubjectreviews",
		newObject: func() *authenticationv1.SelfSubjectReview { return &authenticationv1.SelfSubjectReview{} }}
}

type authorizationV1 struct{ c *rest.RESTClient }

func (g authorizationV1) SelfSubjectAccessReviews() SelfSubjectAccessReviewInterface {
	return &resource[*authorizationv1.SelfSubjectAccessReview, *authorizationv1.SelfSubjectAccessReview]{client: g.c, resource: "selfsubjectaccessreviews",
		newObject: func() *authorizationv1.SelfSubjectAccessReview { return &authorizationv1.SelfSubjectAccessReview{} }}
}

type appsV1 struct{ c *rest.RESTClient }

func (g appsV1) ReplicaSets(namespace string) ReplicaSetInterface {
	return &resource[*appsv1.ReplicaSet, *appsv1.ReplicaSetList]{client: g.c, resource: "replicasets", namespace: namespace,
		newObject: func() *appsv1.ReplicaSet { return &appsv1.ReplicaSet{} }, newList: func() *appsv1.ReplicaSetList { return &appsv1.ReplicaSetList{} }}
}

type batchV1 struct{ c *rest.RESTClient }

func (g batchV1) Jobs(namespace string) JobInterface {
	return &resource[*batchv1.Job, *batchv1.JobList]{client: g.c, resource: "jobs", namespace: namespace,
		newObject: func() *batchv1.Job { return &batchv1.Job{} }, newList: func() *batchv1.JobList { return &batchv1.JobList{} }}
}

type storageV1 struct{ c *rest.RESTClient }

func (g storageV1) CSIDrivers() CSIDriverInterface {
	return &resource[*storagev1.CSIDriver, *storagev1.CSIDriverList]{client: g.c, resource: "csidrivers",
		newObject: func() *storagev1.CSIDriver { return &storagev1.CSIDriver{} }, newList: func() *storagev1.CSIDriverList { return &storagev1.CSIDriverList{} }}
}
