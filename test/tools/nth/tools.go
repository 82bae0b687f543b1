//go:build tools

// Package tools pins aws-node-termination-handler, which the pool benchmark runs beside
// reprieve (test/bench, nth.go). A module of its own: its k8s.io pins (v0.30) must not fight
// k8s.io/kubernetes' in test/tools/go.mod. test/tools/nth.sh builds it.
package tools

import _ "github.com/aws/aws-node-termination-handler/cmd"
