//go:build tools

// Package tools pins the real control-plane programs that reprieve's end-to-end tests run
// against, and kwok. It is a module of its own so that the agent's dependency graph stays small.
// Its shared dependencies (golang.org/x/*, protobuf, k8s.io/utils, ...) are held at the agent's
// versions (the root go.mod), so that a cold build compiles the client libraries once for both
// (test/tools/build.sh).
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
