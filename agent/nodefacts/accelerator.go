package nodefacts

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
)

// LabelGKEAccelerator is the label GKE puts on the nodes of a node pool with GPUs attached
// (GKE "Run GPUs in Standard node pools": cloud.google.com/gke-accelerator=nvidia-tesla-t4).
const LabelGKEAccelerator = "cloud.google.com/gke-accelerator"

// acceleratorDomains are the domains of the device plugins that advertise accelerators in a
// node's status.capacity (nvidia.com/gpu, amd.com/gpu, gpu.intel.com/i915, google.com/tpu,
// habana.ai/gaudi, aws.amazon.com/neuron). Not every extended resource is one: the device
// plugins for /dev/fuse or /dev/kvm advertise resources too, and counting them would give an
// ordinary VM a GPU VM's hour of maintenance notice when it has a minute. A resource outside
// these domains counts when its name says gpu or tpu.
var acceleratorDomains = []string{"nvidia.com", "amd.com", "gpu.intel.com", "google.com", "habana.ai", "aws.amazon.com", "xilinx.com"}

// Accelerator says whether node shows an accelerator, and what it saw: the GKE accelerator
// label, or an accelerator's device-plugin resource with a non-zero capacity.
func Accelerator(node *v1.Node) (bool, string) {
	if v := node.Labels[LabelGKEAccelerator]; v != "" {
		return true, fmt.Sprintf("label %s=%s", LabelGKEAccelerator, v)
	}
	var found []string
	for name, q := range node.Status.Capacity {
		domain, res, ok := strings.Cut(string(name), "/")
		if !ok || q.IsZero() || strings.HasSuffix(domain, "kubernetes.io") {
			continue
		}
		if slices.Contains(acceleratorDomains, domain) || strings.Contains(res, "gpu") || strings.Contains(res, "tpu") {
			found = append(found, fmt.Sprintf("%s: %s", name, q.String()))
		}
	}
	if len(found) == 0 {
		return false, ""
	}
	slices.Sort(found)
	return true, strings.Join(found, ", ") + " in status.capacity"
}

// AcceleratorHolder keeps what the node showed when it was last read, for the GCP provider's
// maintenance notice. The provider must not wait for the API server at start (issue 20): it
// asks get whenever it computes a deadline, and gets "not known" until the node was read.
type AcceleratorHolder struct {
	mu         sync.Mutex
	known, gpu bool
	why        string
}

// Set records what node shows.
func (h *AcceleratorHolder) Set(node *v1.Node) {
	gpu, why := Accelerator(node)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.known, h.gpu, h.why = true, gpu, why
}

// Get is gcp.Options.NodeAccelerator.
func (h *AcceleratorHolder) Get() (gpu bool, why string, known bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gpu, h.why, h.known
}
