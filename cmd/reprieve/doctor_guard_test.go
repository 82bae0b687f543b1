package main

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The messages are k8s.io/apiserver's: ErrCallingWebhook.Error() inside NewInternalError
// (admission/plugin/webhook/validating/dispatcher.go) for a guard that does not answer or whose
// certificate the caBundle does not verify.
func TestGuardUnreachable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{apierrors.NewInternalError(errors.New(`failed calling webhook "eviction-guard.reprieve.io": failed to call webhook: Post "https://reprieve-eviction-guard.kube-system.svc:443/validate-eviction?timeout=3s": dial tcp 10.0.0.1:443: connect: connection refused`)), true},
		{apierrors.NewInternalError(errors.New(`failed calling webhook "eviction-guard.reprieve.io": failed to call webhook: Post "https://127.0.0.1:1/validate-eviction": tls: failed to verify certificate: x509: certificate signed by unknown authority`)), true},
		// Another webhook, the guard's refusal (403), a budget (429): not the guard down.
		{apierrors.NewInternalError(errors.New(`failed calling webhook "other.example.com": connection refused`)), false},
		{apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New(`admission webhook "eviction-guard.reprieve.io" denied the request`)), false},
		{apierrors.NewTooManyRequests("budget", 1), false},
		{nil, false},
	} {
		if got := guardUnreachable(c.err); got != c.want {
			t.Errorf("guardUnreachable(%v) = %v; want %v", c.err, got, c.want)
		}
	}
}
