//go:build tools

// Package tools pins helm, which renders deploy/chart/reprieve into the plain manifests and
// lints it in the tests. It is a module of its own: helm pins its own k8s.io versions, which
// need not agree with k8s.io/kubernetes' in ../go.mod.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
