package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	"github.com/reprieve-dev/reprieve/test/fakes/gcpmeta"
)

// TestDoctorShowsGCPWindows: doctor says which maintenance notice and which preemption window
// apply, and where each came from (issue 21): an N1 VM whose node shows a GPU gets the hour, an
// ordinary one the minute; --gcp-preemption-notice makes the preemption window 150 s.
func TestDoctorShowsGCPWindows(t *testing.T) {
	srv := gcpmeta.New()
	if _, err := srv.Start(""); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srv.SetMachineType("n1-standard-8")
	for _, tc := range []struct {
		name     string
		capacity v1.ResourceList
		want     []string
	}{
		{"GPU on the node", v1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}, []string{
			"window: instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE without an upcoming-maintenance window: 1h0m0s (GPU VM: the node shows nvidia.com/gpu: 1 in status.capacity)",
			"window: instance/preempted TRUE to power-off: 2m30s (preemption notice 2m0s (--gcp-preemption-notice)",
		}},
		{"ordinary node", nil, []string{
			"window: instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE without an upcoming-maintenance window: 1m0s (ordinary VM: machine type n1-standard-8, no accelerator on the node)",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: v1.NodeStatus{Capacity: tc.capacity}}
			c := fake.NewClientset(node)
			c.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
				r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
				r.Status.Allowed = true
				return true, r, nil
			})
			var out, errOut bytes.Buffer
			runDoctor(context.Background(), []string{"--node=n1", "--provider=gcp", "--gcp-metadata-endpoint=" + srv.Addr(),
				"--gcp-preemption-notice=120s", "--host-root=" + t.TempDir()}, &out, &errOut,
				func(config.Config) (kube.Interface, error) { return kubetest.Wrap(c), nil })
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("no %q in\n%s", w, out.String())
				}
			}
		})
	}
}
