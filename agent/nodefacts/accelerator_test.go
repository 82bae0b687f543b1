package nodefacts

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNodeAccelerator(t *testing.T) {
	node := func(labels map[string]string, capacity map[string]string) *v1.Node {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels}, Status: v1.NodeStatus{Capacity: v1.ResourceList{}}}
		for k, v := range capacity {
			n.Status.Capacity[v1.ResourceName(k)] = resource.MustParse(v)
		}
		return n
	}
	plain := map[string]string{"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi", "hugepages-2Mi": "0"}
	tests := []struct {
		name string
		node *v1.Node
		gpu  bool
		why  string
	}{
		{"ordinary node", node(nil, plain), false, ""},
		{"GKE accelerator label", node(map[string]string{LabelGKEAccelerator: "nvidia-l4"}, plain), true, "label cloud.google.com/gke-accelerator=nvidia-l4"},
		{"NVIDIA device plugin", node(nil, map[string]string{"cpu": "8", "nvidia.com/gpu": "1"}), true, "nvidia.com/gpu: 1 in status.capacity"},
		{"TPU", node(nil, map[string]string{"google.com/tpu": "4"}), true, "google.com/tpu: 4"},
		{"another vendor's gpu", node(nil, map[string]string{"example.org/gpu-a": "2"}), true, "example.org/gpu-a: 2"},
		{"GPU plugin not ready yet (0)", node(nil, map[string]string{"nvidia.com/gpu": "0"}), false, ""},
		// A fuse or kvm device plugin is no accelerator: counting it would give an ordinary
		// VM the hour when it has a minute.
		{"fuse device plugin", node(nil, map[string]string{"smarter-devices/fuse": "20", "devices.kubevirt.io/kvm": "1k"}), false, ""},
		{"kubernetes.io resources", node(nil, map[string]string{"attachable-volumes-gce-pd": "127", "example.kubernetes.io/gpu": "1"}), false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gpu, why := Accelerator(tc.node)
			if gpu != tc.gpu || !strings.Contains(why, tc.why) {
				t.Errorf("Accelerator = %v %q, want %v %q", gpu, why, tc.gpu, tc.why)
			}
			var h AcceleratorHolder
			if _, _, known := h.Get(); known {
				t.Error("known before the node was read")
			}
			h.Set(tc.node)
			if g, _, known := h.Get(); !known || g != tc.gpu {
				t.Errorf("holder = %v known %v, want %v known", g, known, tc.gpu)
			}
		})
	}
}
