package agent

import (
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The fixtures the plan package's tests use too (agent/plan/plan_test.go), for the agent's own.
var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func taint(key, value string, effect v1.TaintEffect, added time.Time) v1.Taint {
	t := v1.Taint{Key: key, Value: value, Effect: effect}
	if !added.IsZero() {
		t.TimeAdded = &metav1.Time{Time: added}
	}
	return t
}

func tol(key string, op v1.TolerationOperator, value string, effect v1.TaintEffect, secs *int64) v1.Toleration {
	return v1.Toleration{Key: key, Operator: op, Value: value, Effect: effect, TolerationSeconds: secs}
}

func secs(s int64) *int64 { return &s }

func pod(tolerations ...v1.Toleration) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-1"},
		Spec:       v1.PodSpec{Tolerations: tolerations},
		Status:     v1.PodStatus{Phase: v1.PodRunning},
	}
}

func withGrace(p *v1.Pod, s int64) *v1.Pod { p.Spec.TerminationGracePeriodSeconds = &s; return p }

func ptr[T any](v T) *T { return &v }
