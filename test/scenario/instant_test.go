package scenario

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
)

// InstantAll sets every general stage's delay and jitter to zero and still runs the pod's own
// Edit, after it (an Edit that sets annotations of its own keeps them).
func TestInstantAllKeepsTheOwnEdit(t *testing.T) {
	pods := InstantAll([]Pod{
		{Name: "a", Edit: func(p *v1.Pod) { p.Annotations["own"] = "yes" }},
		{Name: "b"},
	})
	for _, sp := range pods {
		obj := &v1.Pod{}
		sp.Edit(obj)
		for _, s := range []string{"pod-create", "pod-ready"} {
			for _, k := range []string{".stage.kwok.x-k8s.io/delay", ".stage.kwok.x-k8s.io/jitter-delay"} {
				if got := obj.Annotations[s+k]; got != "0s" {
					t.Errorf("%s: %s%s = %q, want 0s", sp.Name, s, k, got)
				}
			}
		}
		if want := sp.Name == "a"; (obj.Annotations["own"] == "yes") != want {
			t.Errorf("%s: own annotation %q, want it only where the pod's own Edit sets it", sp.Name, obj.Annotations["own"])
		}
	}
}

// InstantDaemonSets marks a DaemonSet's pod template and leaves other objects alone.
func TestInstantDaemonSetsEditsTheTemplate(t *testing.T) {
	ds := &appsv1.DaemonSet{}
	InstantDaemonSets(ds)
	if got := ds.Spec.Template.Annotations["pod-ready.stage.kwok.x-k8s.io/delay"]; got != "0s" {
		t.Errorf("the template's pod-ready delay %q, want 0s", got)
	}
	sa := &v1.ServiceAccount{}
	InstantDaemonSets(sa)
	if len(sa.Annotations) != 0 {
		t.Errorf("a ServiceAccount got annotations %v", sa.Annotations)
	}
}
