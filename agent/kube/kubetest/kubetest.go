// Package kubetest wraps a client-go clientset (the fake clientset of unit tests, or a real one)
// into kube.Interface. Only tests import it: it links k8s.io/client-go/kubernetes, whose scheme
// registers every API group, and the binary must not (agent/kube).
package kubetest

import (
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/watchlist"

	"github.com/reprieve-dev/reprieve/agent/kube"
)

// Wrap is c as kube.Interface: each group's typed client of c satisfies the narrow interface of
// the same name in agent/kube.
func Wrap(c kubernetes.Interface) kube.Interface { return clientset{c} }

type clientset struct{ c kubernetes.Interface }

// IsWatchListSemanticsUnSupported passes on what c says: the fake clientset cannot answer a
// streaming list, and the informers ask their client (cache.ToListWatcherWithWatchListSemantics).
func (w clientset) IsWatchListSemanticsUnSupported() bool {
	return watchlist.DoesClientNotSupportWatchListSemantics(w.c)
}

func (w clientset) CoreV1() kube.CoreV1Interface { return coreV1{w.c} }

func (w clientset) PolicyV1() kube.PolicyV1Interface { return policyV1{w.c} }

func (w clientset) AuthenticationV1() kube.AuthenticationV1Interface { return authenticationV1{w.c} }

func (w clientset) AuthorizationV1() kube.AuthorizationV1Interface { return authorizationV1{w.c} }

func (w clientset) AppsV1() kube.AppsV1Interface { return appsV1{w.c} }

func (w clientset) BatchV1() kube.BatchV1Interface { return batchV1{w.c} }

func (w clientset) StorageV1() kube.StorageV1Interface { return storageV1{w.c} }

func (w clientset) Discovery() kube.DiscoveryInterface { return w.c.Discovery() }

type coreV1 struct{ c kubernetes.Interface }

func (g coreV1) RESTClient() rest.Interface { return g.c.CoreV1().RESTClient() }

func (g coreV1) Nodes() kube.NodeInterface { return g.c.CoreV1().Nodes() }

func (g coreV1) Pods(namespace string) kube.PodInterface { return g.c.CoreV1().Pods(namespace) }

func (g coreV1) Events(namespace string) kube.EventInterface { return g.c.CoreV1().Events(namespace) }

func (g coreV1) PersistentVolumeClaims(namespace string) kube.PersistentVolumeClaimInterface {
	return g.c.CoreV1().PersistentVolumeClaims(namespace)
}

func (g coreV1) PersistentVolumes() kube.PersistentVolumeInterface {
	return g.c.CoreV1().PersistentVolumes()
}

type policyV1 struct{ c kubernetes.Interface }

func (g policyV1) PodDisruptionBudgets(namespace string) kube.PodDisruptionBudgetInterface {
	return g.c.PolicyV1().PodDisruptionBudgets(namespace)
}

func (g policyV1) Evictions(namespace string) kube.EvictionInterface {
	return g.c.PolicyV1().Evictions(namespace)
}

type authenticationV1 struct{ c kubernetes.Interface }

func (g authenticationV1) SelfSubjectReviews() kube.SelfSubjectReviewInterface {
	return g.c.AuthenticationV1().SelfSubjectReviews()
}

type authorizationV1 struct{ c kubernetes.Interface }

func (g authorizationV1) SelfSubjectAccessReviews() kube.SelfSubjectAccessReviewInterface {
	return g.c.AuthorizationV1().SelfSubjectAccessReviews()
}

type appsV1 struct{ c kubernetes.Interface }

func (g appsV1) ReplicaSets(namespace string) kube.ReplicaSetInterface {
	return g.c.AppsV1().ReplicaSets(namespace)
}

type batchV1 struct{ c kubernetes.Interface }

func (g batchV1) Jobs(namespace string) kube.JobInterface { return g.c.BatchV1().Jobs(namespace) }

type storageV1 struct{ c kubernetes.Interface }

func (g storageV1) CSIDrivers() kube.CSIDriverInterface { return g.c.StorageV1().CSIDrivers() }
