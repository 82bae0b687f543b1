//go:build tools

// Package tools pins kube-apiserver, kube-controller-manager and kube-scheduler v1.33.13, which the
// version matrix (make test-versions) runs the version-sensitive end-to-end tests against. It is
// a module of its own: each Kubernetes minor pins its own staging modules (the replace lines, one
// per ./staging/src/k8s.io/... line of k8s.io/kubernetes' go.mod at v1.33.13).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
