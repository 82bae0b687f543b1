package record

import (
	"errors"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestIsRefusal: every answer that says the write is not allowed counts, whatever its code (issue
// 22 item 7: a policy whose expression fails to evaluate answers 422, a webhook's denial without
// a code of its own 400); answers that say nothing about permission do not.
func TestIsRefusal(t *testing.T) {
	nodes := schema.GroupResource{Resource: "nodes"}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"RBAC or a policy: 403", apierrors.NewForbidden(nodes, "n1", errors.New("denied")), true},
		{"a policy that failed to evaluate: 422", apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, "n1", nil), true},
		{"a webhook's denial: 400", apierrors.NewBadRequest(`admission webhook "x" denied the request`), true},
		{"wrapped", fmt.Errorf("patching node n1: %w", apierrors.NewForbidden(nodes, "n1", errors.New("denied"))), true},
		{"not found", apierrors.NewNotFound(nodes, "n1"), false},
		{"conflict", apierrors.NewConflict(nodes, "n1", errors.New("stale")), false},
		{"throttled", apierrors.NewTooManyRequests("slow down", 1), false},
		{"timeout", apierrors.NewTimeoutError("slow", 1), false},
		{"server error", apierrors.NewInternalError(errors.New("boom")), false},
		{"not an API status", errors.New("connection refused"), false},
		{"nil", nil, false},
	} {
		if got := IsRefusal(tc.err); got != tc.want {
			t.Errorf("%s: IsRefusal = %v, want %v", tc.name, got, tc.want)
		}
	}
}
