package informer

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/agent/record"
)

// tenantBulkPod is the pod of issue 39 item 3, in phase: a tenant's 1.3 MiB of annotations,
// labels, environment and arguments, with every list the cache keeps some of made long
// (tolerations, volumes, containers, owner references, conditions).
func tenantBulkPod(phase v1.PodPhase) *v1.Pod {
	p := withGrace(pod(), 30)
	p.Status.Phase = phase
	p.Annotations = map[string]string{"tenant.example/blob": strings.Repeat("a", 250<<10),
		v1.MirrorPodAnnotationKey: strings.Repeat("m", 4<<10), "kubernetes.io/config.source": strings.Repeat("s", 4<<10),
		record.AnnotationEvictAt: strings.Repeat("e", 4<<10)}
	p.Labels = map[string]string{"app": strings.Repeat("l", 63)}
	for i := range 2000 {
		p.Labels[fmt.Sprintf("tenant.example/l%04d", i)] = strings.Repeat("l", 63)
	}
	for i := range 200 {
		p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: strings.Repeat("K", 2<<10), Name: fmt.Sprint(i), UID: "u"})
	}
	p.OwnerReferences[7].Controller = ptr(true)
	for i := range 500 {
		p.Spec.Tolerations = append(p.Spec.Tolerations, tol(fmt.Sprintf("k%d", i), v1.TolerationOpExists, "", v1.TaintEffectNoExecute, nil),
			tol(fmt.Sprintf("s%d", i), v1.TolerationOpExists, "", v1.TaintEffectNoSchedule, nil))
	}
	for i := range 1000 {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: fmt.Sprintf("v%d", i), VolumeSource: v1.VolumeSource{
			ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: strings.Repeat("c", 200)},
				Items: []v1.KeyToPath{{Key: strings.Repeat("k", 200), Path: "p"}}}}})
	}
	for i := range 200 {
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: fmt.Sprint(i), Image: "registry.example/tenant:1",
			Args: []string{strings.Repeat("g", 2<<10)}, Env: []v1.EnvVar{{Name: "E", Value: strings.Repeat("e", 2<<10)}},
			Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Mi"),
				v1.ResourceCPU: resource.MustParse("1m"), "example.com/widget": resource.MustParse("1")}}})
	}
	for i := range 50 {
		p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: record.PodConditionInterruption, Status: v1.ConditionTrue,
			Message: strings.Repeat("x", 4<<10)}, v1.PodCondition{Type: v1.PodConditionType(fmt.Sprint(i)), Message: strings.Repeat("y", 4<<10)})
	}
	p.Status.PodIPs = []v1.PodIP{{IP: "10.0.0.1"}, {IP: "fd00::1"}, {IP: "10.0.0.2"}}
	return p
}

// TestTrimBoundsTenantPods: whatever a tenant writes into a pod, the cache keeps a bounded part
// of it (issue 39 item 3): a running pod under 32 KiB however long its lists, a finished one
// under 1 KiB; every cut is counted; trimming again changes nothing (the informer may hand the
// transform an object it already trimmed).
func TestTrimBoundsTenantPods(t *testing.T) {
	for _, tc := range []struct {
		phase v1.PodPhase
		bound int
	}{{v1.PodRunning, 32 << 10}, {v1.PodPending, 32 << 10}, {v1.PodFailed, 1 << 10}, {v1.PodSucceeded, 1 << 10}} {
		p := tenantBulkPod(tc.phase)
		before := trimCuts.Load()
		got, err := Trim(p.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		trimmed := got.(*v1.Pod)
		if full, kept := p.Size(), trimmed.Size(); kept > tc.bound {
			t.Errorf("%s: a pod of %d KiB is kept as %d bytes; want at most %d", tc.phase, full>>10, kept, tc.bound)
		} else {
			t.Logf("%s: a pod of %d KiB is kept as %d bytes (protobuf)", tc.phase, full>>10, kept)
		}
		if tc.phase == v1.PodRunning || tc.phase == v1.PodPending {
			if cuts := trimCuts.Load() - before; cuts == 0 {
				t.Errorf("%s: nothing was counted as cut", tc.phase)
			}
			if n := len(trimmed.Spec.Tolerations); n != maxKeptTolerations {
				t.Errorf("%s: %d tolerations kept; want %d", tc.phase, n, maxKeptTolerations)
			}
			if n := len(trimmed.Spec.Volumes); n != maxKeptVolumes {
				t.Errorf("%s: %d volumes kept; want %d", tc.phase, n, maxKeptVolumes)
			}
			if len(trimmed.OwnerReferences) != 1 || trimmed.OwnerReferences[0].Name != "7" || len(trimmed.OwnerReferences[0].Kind) != maxKeptValue {
				t.Errorf("%s: owner references %d kept; want the controller alone, its kind cut", tc.phase, len(trimmed.OwnerReferences))
			}
			if q := trimmed.Spec.Containers[0].Resources.Requests[v1.ResourceMemory]; len(trimmed.Spec.Containers) != 1 || !q.Equal(resource.MustParse("200Mi")) {
				t.Errorf("%s: containers %d, memory requests %s; want one container requesting the 200Mi of the pod's 200", tc.phase, len(trimmed.Spec.Containers), q.String())
			}
		}
		again, _ := Trim(trimmed.DeepCopy())
		if !reflect.DeepEqual(again, trimmed) {
			t.Errorf("%s: trimming twice changed the pod:\n once %+v\ntwice %+v", tc.phase, trimmed, again)
		}
	}
}

// The agent's test fixtures (agent/helpers_test.go).
func tol(key string, op v1.TolerationOperator, value string, effect v1.TaintEffect, secs *int64) v1.Toleration {
	return v1.Toleration{Key: key, Operator: op, Value: value, Effect: effect, TolerationSeconds: secs}
}

func pod(tolerations ...v1.Toleration) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-1"},
		Spec:       v1.PodSpec{Tolerations: tolerations},
		Status:     v1.PodStatus{Phase: v1.PodRunning},
	}
}

func withGrace(p *v1.Pod, s int64) *v1.Pod { p.Spec.TerminationGracePeriodSeconds = &s; return p }

func ptr[T any](v T) *T { return &v }
