package main

import (
	"fmt"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	appsv1 "k8s.io/client-go/kubernetes/typed/apps/v1"
	authenticationv1 "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1 "k8s.io/client-go/kubernetes/typed/authorization/v1"
	batchv1 "k8s.io/client-go/kubernetes/typed/batch/v1"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	policyv1 "k8s.io/client-go/kubernetes/typed/policy/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// clientset is a kubernetes.Interface with only the API groups reprieve calls built: core (nodes,
// pods, pods/eviction, pods/status, events), policy (evictions and budgets), authentication and
// authorization (doctor's reviews), apps and batch (audit's owners) and discovery (doctor's
// server version). kubernetes.NewForConfig builds a client for each of the fifty-odd groups,
// whose generated code (a typed client per kind, instantiated from client-go's gentype) was
// 5 MB of the binary (docs/benchmarks.md). Every other group is the embedded nil interface:
// calling one panics, so a new call to a group not listed here must add it (TestClientsetGroups
// checks that every group the code calls is listed).
type clientset struct {
	kubernetes.Interface

	discovery        discovery.DiscoveryInterfaces
	coreV1           corev1.CoreV1Interface
	policyV1         policyv1.PolicyV1Interface
	authenticationV1 authenticationv1.AuthenticationV1Interface
	authorizationV1  authorizationv1.AuthorizationV1Interface
	appsV1           appsv1.AppsV1Interface
	batchV1          batchv1.BatchV1Interface
}

// Discovery is the discovery client.
func (c *clientset) Discovery() discovery.DiscoveryInterfaces { return c.discovery }

// CoreV1 is the core group's client.
func (c *clientset) CoreV1() corev1.CoreV1Interface { return c.coreV1 }

// PolicyV1 is policy/v1's client.
func (c *clientset) PolicyV1() policyv1.PolicyV1Interface { return c.policyV1 }

// AuthenticationV1 is authentication.k8s.io/v1's client.
func (c *clientset) AuthenticationV1() authenticationv1.AuthenticationV1Interface {
	return c.authenticationV1
}

// AuthorizationV1 is authorization.k8s.io/v1's client.
func (c *clientset) AuthorizationV1() authorizationv1.AuthorizationV1Interface {
	return c.authorizationV1
}

// AppsV1 is apps/v1's client.
func (c *clientset) AppsV1() appsv1.AppsV1Interface { return c.appsV1 }

// BatchV1 is batch/v1's client.
func (c *clientset) BatchV1() batchv1.BatchV1Interface { return c.batchV1 }

// clientsetGroups names the methods clientset builds (TestClientsetGroups).
var clientsetGroups = []string{"Discovery", "CoreV1", "PolicyV1", "AuthenticationV1", "AuthorizationV1", "AppsV1", "BatchV1"}

// newClientset builds the groups of clientset as kubernetes.NewForConfig does for all of them:
// over one HTTP client and one rate limiter (QPS and burst bound the groups together).
func newClientset(restCfg *rest.Config) (kubernetes.Interface, error) {
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
	c := &clientset{}
	for _, build := range []struct {
		group string
		new   func() error
	}{
		{"core/v1", func() (err error) { c.coreV1, err = corev1.NewForConfigAndClient(cfg, hc); return }},
		{"policy/v1", func() (err error) { c.policyV1, err = policyv1.NewForConfigAndClient(cfg, hc); return }},
		{"authentication.k8s.io/v1", func() (err error) {
			c.authenticationV1, err = authenticationv1.NewForConfigAndClient(cfg, hc)
			return
		}},
		{"authorization.k8s.io/v1", func() (err error) {
			c.authorizationV1, err = authorizationv1.NewForConfigAndClient(cfg, hc)
			return
		}},
		{"apps/v1", func() (err error) { c.appsV1, err = appsv1.NewForConfigAndClient(cfg, hc); return }},
		{"batch/v1", func() (err error) { c.batchV1, err = batchv1.NewForConfigAndClient(cfg, hc); return }},
		{"discovery", func() (err error) {
			c.discovery, err = discovery.NewDiscoveryClientForConfigAndClient(cfg, hc)
			return
		}},
	} {
		if err := build.new(); err != nil {
			return nil, fmt.Errorf("creating the %s client: %w", build.group, err)
		}
	}
	return c, nil
}

// useProtobuf makes every request of cfg's clients speak protobuf, as kube-controller-manager
// and the kubelet do for built-in types (their --kube-api-content-type default), with JSON still
// accepted. client-go's typed clients already prefer protobuf when the config names no content
// type (Request.UseProtobufAsDefaultIfPreferred); a request made on the REST client directly,
// such as agent/evict's eviction, would otherwise send and ask for JSON. Patches keep their own
// content types.
func useProtobuf(cfg *rest.Config) {
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
}
