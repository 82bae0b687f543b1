// Package profiles models the spot nodes of the platforms reprieve runs on, as each platform
// sets them up: the labels, taints and providerID on the Node, capacity and allocatable as the
// platform's kube-reserved and eviction settings leave them, and the kubelet's configuration
// files at the platform's paths under a host root, drop-ins included. The chart's install tests
// create kwok nodes from them; the doctor and agent tests read their host roots.
//
// Each fact carries a comment naming its source. Facts tagged [3RD-PARTY] were seen only in
// others' node dumps or write-ups, [UNCONFIRMED] ones in none: those are marked where used, and
// the values that are only this profile's choice (instance IDs, zones, disk sizes) say so.
package profiles

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// File is one file of the node's host filesystem.
type File struct {
	// Path is the host's absolute path.
	Path    string
	Mode    os.FileMode
	Content string
}

// Profile is one platform's spot (or Windows) node.
type Profile struct {
	Name string
	// Cloud is the chart's cloud value for the platform: aws, gcp or azure.
	Cloud string
	// OS is the node's kubernetes.io/os: linux or windows.
	OS string
	// Spot says whether the platform's spot label is on the node.
	Spot        bool
	Labels      map[string]string
	Annotations map[string]string
	ProviderID  string
	Taints      []v1.Taint
	// Capacity and Allocatable are the node's status: Allocatable is Capacity less the
	// platform's kube-reserved and system-reserved and the kubelet's hard eviction thresholds
	// for memory and nodefs (the kubelet's GetNodeAllocatableReservation).
	Capacity, Allocatable v1.ResourceList
	NodeInfo              v1.NodeSystemInfo
	// Files are the kubelet's configuration and flags files (Linux only).
	Files []File

	// What reading the kubelet's configuration gives (kubelet.FindConfig, reprieve doctor).
	// ConfigPath is the main file's host path; DropIns the drop-ins merged over it, in order.
	ConfigPath string
	DropIns    []string
	// Hard are the hard eviction thresholds as kubelet.Threshold.String writes them, in the
	// order of kubelet.Signals.
	Hard []string
	// ShutdownGracePeriod and ShutdownGracePeriodCriticalPods are the kubelet's graceful node
	// shutdown; zero means off.
	ShutdownGracePeriod, ShutdownGracePeriodCriticalPods time.Duration
}

// Linux says whether the node is a Linux node.
func (p Profile) Linux() bool { return p.OS == "linux" }

// Node is the Node object the platform's kubelet (and its cloud controller) registers, named
// name: kubernetes.io/hostname and the kwok annotation follow the name, the rest is the
// profile's. kwok's node stages keep the given capacity, allocatable and nodeInfo.
func (p Profile) Node(name string) *v1.Node {
	labels := maps.Clone(p.Labels)
	labels["kubernetes.io/hostname"] = name
	annotations := maps.Clone(p.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	// test/testenv: kwok manages the nodes that carry its annotation.
	annotations["kwok.x-k8s.io/node"] = "fake"
	annotations["node.alpha.kubernetes.io/ttl"] = "0"
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Spec:       v1.NodeSpec{ProviderID: p.ProviderID, Taints: slices.Clone(p.Taints)},
		Status: v1.NodeStatus{
			Capacity:    p.Capacity.DeepCopy(),
			Allocatable: p.Allocatable.DeepCopy(),
			NodeInfo:    p.NodeInfo,
		},
	}
}

// WriteHostRoot writes the profile's files under dir, as the host's / would hold them.
func (p Profile) WriteHostRoot(dir string) error {
	if !p.Linux() {
		return fmt.Errorf("profile %s: a %s node has no Linux host root", p.Name, p.OS)
	}
	for _, f := range p.Files {
		path := filepath.Join(dir, f.Path)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(f.Content), f.Mode); err != nil {
			return err
		}
	}
	return nil
}

// All are the profiles, Linux spot nodes first.
func All() []Profile {
	return []Profile{EKSManagedNodeGroup(), KarpenterAL2023(), GKESpot(), AKSSpot(), WindowsKarpenter(), WindowsAKS()}
}

// Variants are profiles of other setups of the same platforms, kept out of All: the chart's
// install tests and doctor's tests run on All, and read each profile's node through the
// platform's config file location (they remove ConfigPath and expect it among the paths
// searched, which a flags file is not).
func Variants() []Profile {
	return []Profile{AKSSpotFlags()}
}

// ByName returns the profile named name, of All or Variants.
func ByName(name string) (Profile, error) {
	for _, p := range append(All(), Variants()...) {
		if p.Name == name {
			return p, nil
		}
	}
	return Profile{}, errors.New("no profile " + name)
}

const (
	mi = int64(1) << 20
	gi = int64(1) << 30
)

// eksCPUMillicoresToReserve is nodeadm's kube-reserved CPU: 6% of the first core, 1% of the
// second, 0.5% of the third and fourth, 0.25% of each core above four.
// awslabs/amazon-eks-ami nodeadm/internal/kubelet/config.go getCPUMillicoresToReserve
// (ranges [0,1000,2000,4000,total] millicores, basis points [600,100,50,25]).
func eksCPUMillicoresToReserve(millicores int64) int64 {
	ranges := []int64{0, 1000, 2000, 4000, millicores}
	bps := []int64{600, 100, 50, 25}
	var reserved int64
	for i, bp := range bps {
		lo, hi := ranges[i], min(ranges[i+1], millicores)
		if hi > lo {
			reserved += (hi - lo) * bp / 10000
		}
	}
	return reserved
}

// eksMemoryMebibytesToReserve is nodeadm's kube-reserved memory: 11 MiB per pod plus 255 MiB.
// awslabs/amazon-eks-ami nodeadm/internal/kubelet/config.go getMemoryMebibytesToReserve.
func eksMemoryMebibytesToReserve(maxPods int64) int64 { return 11*maxPods + 255 }

// gkeMemoryReserved is GKE's memory reservation: 25% of the first 4 GiB, 20% of the next 4 GiB,
// 10% of the next 8 GiB, 6% of the next 112 GiB, 2% above 128 GiB. [3RD-PARTY]
// hatemosphere/gke-node-allocatable-memory-calculator, citing
// https://cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes#memory_and_cpu_reservations
func gkeMemoryReserved(capacity int64) int64 {
	tiers := []struct{ upTo, percent int64 }{{4 * gi, 25}, {8 * gi, 20}, {16 * gi, 10}, {128 * gi, 6}, {capacity, 2}}
	var reserved, lo int64
	for _, t := range tiers {
		hi := min(t.upTo, capacity)
		if hi > lo {
			reserved += (hi - lo) * t.percent / 100
			lo = hi
		}
	}
	return reserved
}

// aksMemoryReserved is AKS's kube-reserved memory from 1.29: min(20 MB per pod + 50 MB, 25% of
// the memory), taken here in MiB as AgentBaker writes kube-reserved (e.g. memory=1638Mi).
// https://learn.microsoft.com/azure/aks/node-resource-reservations
func aksMemoryReserved(maxPods, capacity int64) int64 {
	return min((20*maxPods+50)*mi, capacity/4)
}

// aksCPUReserved is AKS's kube-reserved CPU by core count (1: 60m, 2: 100m, 4: 140m, 8: 180m,
// 16: 260m, 32: 420m, 64: 740m). https://learn.microsoft.com/azure/aks/node-resource-reservations
func aksCPUReserved(cores int64) int64 {
	return map[int64]int64{1: 60, 2: 100, 4: 140, 8: 180, 16: 260, 32: 420, 64: 740}[cores]
}

// resources is a ResourceList of CPU in millicores, memory and ephemeral storage in bytes, and
// pods.
func resources(cpuMilli, memory, ephemeral, pods int64) v1.ResourceList {
	return v1.ResourceList{
		v1.ResourceCPU:              *resource.NewMilliQuantity(cpuMilli, resource.DecimalSI),
		v1.ResourceMemory:           *resource.NewQuantity(memory, resource.BinarySI),
		v1.ResourceEphemeralStorage: *resource.NewQuantity(ephemeral, resource.BinarySI),
		v1.ResourcePods:             *resource.NewQuantity(pods, resource.DecimalSI),
	}
}

// allocatable is the kubelet's allocatable: capacity less the reservations and the hard
// eviction thresholds of memory.available and nodefs.available (kubernetes/kubernetes
// pkg/kubelet/cm/node_container_manager_linux.go GetNodeAllocatableReservation and
// hardEvictionReservation). nodefsPercent is nodefs.available's threshold in percent.
func allocatable(capacity v1.ResourceList, cpuReserved, memReserved, ephReserved, memEviction, nodefsPercent int64) v1.ResourceList {
	eph := capacity.StorageEphemeral().Value()
	return resources(
		capacity.Cpu().MilliValue()-cpuReserved,
		capacity.Memory().Value()-memReserved-memEviction,
		eph-ephReserved-eph*nodefsPercent/100,
		capacity.Pods().Value(),
	)
}

// kubeletDefaultHard is the kubelet's own evictionHard default on Linux
// (kubernetes/kubernetes pkg/kubelet/eviction/defaults_linux.go).
var kubeletDefaultHard = []string{"memory.available<100Mi", "nodefs.available<10%", "nodefs.inodesFree<5%", "imagefs.available<15%", "imagefs.inodesFree<5%"}

// Host paths of the kubelet's configuration, per platform.
const (
	// awslabs/amazon-eks-ami nodeadm/internal/kubelet/config.go kubeletConfigRoot,
	// kubeletConfigFile, kubeletConfigDir; the drop-in path.Join(dirPath, "40-nodeadm.conf").
	NodeadmConfig = "/etc/kubernetes/kubelet/config.json"
	NodeadmDropIn = "/etc/kubernetes/kubelet/config.json.d/40-nodeadm.conf"
	// awslabs/amazon-eks-ami nodeadm/internal/kubelet/environment.go (NODEADM_KUBELET_ARGS) and
	// templates/al2023/runtime/rootfs/etc/systemd/system/kubelet.service (EnvironmentFile).
	NodeadmEnvironment = "/etc/eks/kubelet/environment"
	// kubernetes/kubernetes cluster/gce/gci/configure.sh (download-kubelet-config
	// "${KUBE_HOME}/kubelet-config.yaml", KUBE_HOME=/home/kubernetes) and configure-helper.sh
	// (KUBELET_CONFIG_FILE_ARG="--config ${KUBE_HOME}/kubelet-config.yaml").
	GKEConfig = "/home/kubernetes/kubelet-config.yaml"
	// [3RD-PARTY] a GKE node's /etc/default/kubelet (KUBELET_OPTS), in a stored write-up.
	GKEFlags = "/etc/default/kubelet"
	// Azure/AgentBaker parts/linux/cloud-init/artifacts/cse_config.sh: the config file (mode
	// 0600, when KUBELET_CONFIG_FILE_ENABLED=true), the flags file KUBELET_DEFAULT_FILE, and the
	// systemd drop-in that passes --config.
	AKSConfig        = "/etc/default/kubeletconfig.json"
	AKSFlags         = "/etc/default/kubelet"
	AKSConfigDropIn  = "/etc/systemd/system/kubelet.service.d/10-componentconfig.conf"
	kubeletConfigAPI = `"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration"`
)

// EKSManagedNodeGroup is a spot node of an EKS managed node group on AL2023 (nodeadm) whose
// launch template's NodeConfig sets the kubelet's eviction thresholds as flags
// (spec.kubelet.flags: --eviction-hard=memory.available<200Mi,...) and no kubelet config: the
// main file, no drop-in directory, no --config-dir, and the user's flags last in nodeadm's
// environment file, where the kubelet applies them over the file.
func EKSManagedNodeGroup() Profile {
	const (
		// This profile's choices: an m5.large (2 vCPU, 8 GiB: EC2's instance type) with a 20 GiB
		// root volume, kubelet 1.34.
		cores, memory, disk = 2, 8 * gi, 20 * gi
		// awslabs/amazon-eks-ami nodeadm/internal/kubelet/eni-max-pods.txt: "m5.large 29".
		maxPods = 29
		zone    = "us-west-2a"
		// The instance ID is this profile's.
		instanceID = "i-0e1a2b3c4d5e6f701"
	)
	cpuReserved := eksCPUMillicoresToReserve(cores * 1000)   // 70m
	memReserved := eksMemoryMebibytesToReserve(maxPods) * mi // 574Mi
	capacity := resources(cores*1000, memory, disk, maxPods)
	// kube-reserved ephemeral-storage 1Gi and no systemReserved (only systemReservedCgroup):
	// awslabs/amazon-eks-ami nodeadm/internal/kubelet/config.go withDefaultReservedResources.
	// The hard eviction threshold of memory is the user's flag's 200Mi, not the file's 100Mi.
	alloc := allocatable(capacity, cpuReserved, memReserved, 1*gi, 200*mi, 10)
	// awslabs/amazon-eks-ami nodeadm/internal/kubelet/config.go getProviderId:
	// aws:///<az>/<instance-id>.
	providerID := "aws:///" + zone + "/" + instanceID
	mainFile := fmt.Sprintf(`{
    %s,
    "address": "0.0.0.0",
    "cgroupDriver": "systemd",
    "cgroupRoot": "/",
    "clusterDNS": ["10.100.0.10"],
    "clusterDomain": "cluster.local",
    "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
    "evictionHard": {"memory.available": "100Mi", "nodefs.available": "10%%", "nodefs.inodesFree": "5%%"},
    "featureGates": {"DynamicResourceAllocation": true, "RotateKubeletServerCertificate": true},
    "hairpinMode": "hairpin-veth",
    "kubeReserved": {"cpu": "%dm", "ephemeral-storage": "1Gi", "memory": "%dMi"},
    "kubeReservedCgroup": "/runtime",
    "logging": {"verbosity": 2},
    "maxPods": %d,
    "protectKernelDefaults": true,
    "providerID": %q,
    "readOnlyPort": 0,
    "serializeImagePulls": false,
    "serverTLSBootstrap": true,
    "shutdownGracePeriod": "150s",
    "shutdownGracePeriodCriticalPods": "30s",
    "systemReservedCgroup": "/system"
}
`, kubeletConfigAPI, cpuReserved, memReserved/mi, maxPods, providerID)
	return Profile{
		Name: "eks-mng-al2023", Cloud: "aws", OS: "linux", Spot: true,
		Labels: map[string]string{
			"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"node.kubernetes.io/instance-type": "m5.large",
			"topology.kubernetes.io/region":    "us-west-2", "topology.kubernetes.io/zone": zone,
			// [3RD-PARTY] real EKS node label dumps (eks-workshop and others); the EKS service
			// sets them through user data, not amazon-eks-ami. The value is upper-case.
			"eks.amazonaws.com/capacityType":    "SPOT",
			"eks.amazonaws.com/nodegroup":       "spot-ng",
			"eks.amazonaws.com/nodegroup-image": "ami-0123456789abcdef0",
		},
		ProviderID: providerID,
		Capacity:   capacity, Allocatable: alloc,
		NodeInfo: v1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "amd64", OSImage: "Amazon Linux 2023", KubeletVersion: "v1.34.0-eks"},
		Files: []File{
			{Path: NodeadmConfig, Mode: 0o644, Content: mainFile},
			// awslabs/amazon-eks-ami nodeadm/internal/kubelet/environment.go: the flags, --config
			// always, --config-dir only with the user's spec.kubelet.config (none here), plus
			// --cloud-provider=external, --hostname-override (the private DNS name), --node-ip
			// (config.go withCloudProvider, withNodeIp), then the NodeConfig's spec.kubelet.flags
			// ("append user-provided flags at the end to give them precedence"). Written
			// unquoted, fmt.Sprintf("%s=%s"), 0644 (kubeletConfigPerm).
			{Path: NodeadmEnvironment, Mode: 0o644, Content: `NODEADM_KUBELET_ARGS=--cloud-provider=external --config=/etc/kubernetes/kubelet/config.json --hostname-override=ip-192-168-10-21.us-west-2.compute.internal --kubeconfig=/var/lib/kubelet/kubeconfig --node-ip=192.168.10.21 --node-labels=eks.amazonaws.com/capacityType=SPOT,eks.amazonaws.com/nodegroup=spot-ng --runtime-cgroups=/runtime.slice/containerd.service --eviction-hard=memory.available<200Mi,nodefs.available<10%,nodefs.inodesFree<5%` + "\n"},
		},
		ConfigPath: NodeadmConfig,
		// The user's --eviction-hard over the file's evictionHard (the kubelet's
		// kubeletConfigFlagPrecedence).
		Hard: []string{"memory.available<200Mi", "nodefs.available<10%", "nodefs.inodesFree<5%"},
		// awslabs/amazon-eks-ami nodeadm/internal/kubelet/config.go withVersionToggles: 150s
		// and 30s for critical pods from kubelet 1.34.
		ShutdownGracePeriod: 150 * time.Second, ShutdownGracePeriodCriticalPods: 30 * time.Second,
	}
}

// KarpenterAL2023 is a Karpenter spot node on AL2023: nodeadm's main file and Karpenter's
// drop-in 40-nodeadm.conf, which always carries maxPods and clusterDNS, here also the
// EC2NodeClass's kubelet.maxPods 110 and evictionHard memory.available 500Mi. Kubelet 1.33:
// nodeadm sets no graceful node shutdown below 1.34.
func KarpenterAL2023() Profile {
	const (
		// This profile's choices: an m5.xlarge (4 vCPU, 16 GiB: EC2's instance type) with a
		// 20 GiB root volume, kubelet 1.33, the EC2NodeClass's maxPods 110.
		cores, memory, disk = 4, 16 * gi, 20 * gi
		// awslabs/amazon-eks-ami nodeadm/internal/kubelet/eni-max-pods.txt: "m5.xlarge 58",
		// what nodeadm writes in the main file and reserves memory for.
		eniMaxPods = 58
		maxPods    = 110
		zone       = "us-west-2b"
		instanceID = "i-0f1e2d3c4b5a69702"
	)
	cpuReserved := eksCPUMillicoresToReserve(cores * 1000) // 80m
	// nodeadm computes kube-reserved from its own maxPods (GenerateKubeletConfig:
	// withDefaultReservedResources(GetClassicMaxPods(...))), not the drop-in's; Karpenter adds
	// kubeReserved to the drop-in only when the EC2NodeClass sets it (not here).
	memReserved := eksMemoryMebibytesToReserve(eniMaxPods) * mi // 893Mi
	capacity := resources(cores*1000, memory, disk, maxPods)
	alloc := allocatable(capacity, cpuReserved, memReserved, 1*gi, 500*mi, 10)
	providerID := "aws:///" + zone + "/" + instanceID
	mainFile := fmt.Sprintf(`{
    %s,
    "cgroupDriver": "systemd",
    "clusterDNS": ["10.100.0.10"],
    "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
    "evictionHard": {"memory.available": "100Mi", "nodefs.available": "10%%", "nodefs.inodesFree": "5%%"},
    "kubeReserved": {"cpu": "%dm", "ephemeral-storage": "1Gi", "memory": "%dMi"},
    "kubeReservedCgroup": "/runtime",
    "maxPods": %d,
    "providerID": %q,
    "systemReservedCgroup": "/system"
}
`, kubeletConfigAPI, cpuReserved, memReserved/mi, eniMaxPods, providerID)
	// aws/karpenter-provider-aws pkg/providers/amifamily/bootstrap/nodeadm.go
	// generateInlineKubeletConfiguration: the NodeConfig's spec.kubelet.config; nodeadm writes it
	// verbatim with kind and apiVersion merged in (nodeadm config.go writeKubeletConfigToDir).
	dropIn := `{
    "apiVersion": "kubelet.config.k8s.io/v1beta1",
    "clusterDNS": ["10.100.0.10"],
    "evictionHard": {"memory.available": "500Mi"},
    "kind": "KubeletConfiguration",
    "maxPods": 110
}
`
	return Profile{
		Name: "karpenter-al2023", Cloud: "aws", OS: "linux", Spot: true,
		Labels: map[string]string{
			"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"node.kubernetes.io/instance-type": "m5.xlarge",
			"topology.kubernetes.io/region":    "us-west-2", "topology.kubernetes.io/zone": zone,
			// kubernetes-sigs/karpenter pkg/apis/v1/labels.go: lower-case capacity type.
			"karpenter.sh/capacity-type": "spot", "karpenter.sh/nodepool": "default",
			"karpenter.sh/registered": "true", "karpenter.sh/initialized": "true",
			// aws/karpenter-provider-aws pkg/apis/v1/labels.go.
			"karpenter.k8s.aws/ec2nodeclass": "default", "karpenter.k8s.aws/instance-family": "m5",
			"karpenter.k8s.aws/instance-size": "xlarge", "karpenter.k8s.aws/instance-cpu": "4",
			"karpenter.k8s.aws/instance-memory": "16384",
		},
		// kubernetes-sigs/karpenter pkg/apis/v1/labels.go: karpenter.sh/nodepool-hash.
		// Karpenter's finalizer karpenter.sh/termination is left out: nothing here would remove it.
		Annotations: map[string]string{"karpenter.sh/nodepool-hash": "4012513481623584108", "karpenter.k8s.aws/ec2nodeclass-hash": "15535182697325354914"},
		// registerWithTaints karpenter.sh/unregistered:NoExecute is removed once Karpenter has
		// registered the node (kubernetes-sigs/karpenter pkg/apis/v1/taints.go): none left.
		ProviderID: providerID,
		Capacity:   capacity, Allocatable: alloc,
		NodeInfo: v1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "amd64", OSImage: "Amazon Linux 2023", KubeletVersion: "v1.33.0-eks"},
		Files: []File{
			{Path: NodeadmConfig, Mode: 0o644, Content: mainFile},
			{Path: NodeadmDropIn, Mode: 0o644, Content: dropIn},
			// With spec.kubelet.config, nodeadm adds --config-dir (config.go
			// writeKubeletConfigToDir); Karpenter's node labels travel in spec.kubelet.flags
			// (aws/karpenter-provider-aws bootstrap/nodeadm.go), appended last.
			{Path: NodeadmEnvironment, Mode: 0o644, Content: `NODEADM_KUBELET_ARGS="--cloud-provider=external --config=/etc/kubernetes/kubelet/config.json --config-dir=/etc/kubernetes/kubelet/config.json.d --hostname-override=ip-192-168-20-34.us-west-2.compute.internal --node-ip=192.168.20.34 --node-labels=karpenter.sh/capacity-type=spot,karpenter.sh/nodepool=default --register-with-taints=karpenter.sh/unregistered:NoExecute"` + "\n"},
		},
		ConfigPath: NodeadmConfig,
		DropIns:    []string{NodeadmDropIn},
		// The drop-in's memory.available over the main file's, the others kept: the kubelet
		// merges drop-ins as JSON merge patches (kubernetes/kubernetes cmd/kubelet/app/server.go
		// mergeKubeletConfigurations).
		Hard: []string{"memory.available<500Mi", "nodefs.available<10%", "nodefs.inodesFree<5%"},
	}
}

// GKESpot is a GKE Spot node on COS. GKE's kubelet-config.yaml is generated by its control plane
// and is not public: this one sets only what GKE documents, the graceful node shutdown of Spot
// and preemptible nodes, so the kubelet's own evictionHard defaults apply, whose
// memory.available 100Mi is the eviction reservation GKE documents.
func GKESpot() Profile {
	const (
		// This profile's choices: an e2-standard-4 (4 vCPU, 16 GB: Compute Engine's machine
		// type) with a 100 GB boot disk.
		cores, memory, disk = 4, 16 * gi, 100 * gi
		// The kubelet's default maxPods (k8s.io/kubelet/config/v1beta1, 110), as the file sets none.
		maxPods = 110
		zone    = "us-central1-a"
		// kubernetes/cloud-provider-gcp providers/gce/gce_util.go providerIDRE
		// ^gce://([^/]+)/([^/]+)/([^/]+)$: project, zone, instance (this profile's names).
		providerID = "gce://example-project/" + zone + "/gke-cluster-1-spot-pool-8f2a4c1e-x7k2"
	)
	capacity := resources(cores*1000, memory, disk, maxPods)
	// Memory: GKE's tiers [3RD-PARTY] and 100 MiB for eviction. CPU: GKE's reservation is not
	// confirmed (platform facts 1c), so none is taken here; ephemeral storage only the kubelet's
	// default nodefs.available 10%.
	alloc := allocatable(capacity, 0, gkeMemoryReserved(memory), 0, 100*mi, 10)
	return Profile{
		Name: "gke-spot", Cloud: "gcp", OS: "linux", Spot: true,
		Labels: map[string]string{
			"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"node.kubernetes.io/instance-type": "e2-standard-4",
			"topology.kubernetes.io/region":    "us-central1", "topology.kubernetes.io/zone": zone,
			// [3RD-PARTY] widely used as the Spot node selector; GKE's spot-vms docs.
			"cloud.google.com/gke-spot": "true",
			// [3RD-PARTY] a real GKE node's --node-labels (stored write-up).
			"cloud.google.com/gke-nodepool": "spot-pool", "cloud.google.com/gke-os-distribution": "cos",
		},
		// No taint: GKE's default taint on Spot pools is [UNCONFIRMED]; the label selects them.
		ProviderID: providerID,
		Capacity:   capacity, Allocatable: alloc,
		NodeInfo: v1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "amd64", OSImage: "Container-Optimized OS from Google", KubeletVersion: "v1.33.5-gke.1000"},
		Files: []File{
			// https://cloud.google.com/kubernetes-engine/docs/how-to/preemptible-vms: above
			// 1.22.8-gke.200, 15 s for ordinary pods and 15 s more for system-critical ones.
			{Path: GKEConfig, Mode: 0o644, Content: "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" +
				"cgroupRoot: /\nclusterDNS:\n- 10.0.0.10\nclusterDomain: cluster.local\n" +
				"shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 15s\n"},
			// [3RD-PARTY] a GKE node's flags file and kubelet unit (ExecStart=/home/kubernetes/bin/kubelet $KUBELET_OPTS).
			{Path: GKEFlags, Mode: 0o644, Content: `KUBELET_OPTS="--v=2 --cloud-provider=external --kubeconfig=/var/lib/kubelet/kubeconfig --config /home/kubernetes/kubelet-config.yaml --node-labels=cloud.google.com/gke-nodepool=spot-pool,cloud.google.com/gke-os-distribution=cos,cloud.google.com/gke-spot=true"` + "\n"},
		},
		ConfigPath: GKEConfig,
		Hard:       kubeletDefaultHard,
		// https://cloud.google.com/kubernetes-engine/docs/how-to/preemptible-vms (30 s in all,
		// 15 s of it for critical pods).
		ShutdownGracePeriod: 30 * time.Second, ShutdownGracePeriodCriticalPods: 15 * time.Second,
	}
}

// AKSSpot is an AKS spot node on Ubuntu, Kubernetes 1.29 or later, with the kubelet config file
// enabled: the flags AgentBaker translates (eviction, reservations, maxPods) are in
// /etc/default/kubeletconfig.json and out of /etc/default/kubelet.
func AKSSpot() Profile {
	const (
		// This profile's choices: a Standard_D4s_v5 (4 vCPU, 16 GiB: Azure's VM size) with a
		// 128 GiB OS disk.
		cores, memory, disk = 4, 16 * gi, 128 * gi
		// Azure/AgentBaker e2e/node_config.go fixture: --max-pods=110.
		maxPods = 110
		// cloud-provider-azure scaleSetNameRE; the subscription, group and scale set are this
		// profile's (the group usually MC_*).
		providerID = "azure:///subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/MC_rg_cluster_eastus/providers/Microsoft.Compute/virtualMachineScaleSets/aks-spotpool-12345678-vmss/virtualMachines/0"
	)
	cpuReserved := aksCPUReserved(cores)              // 140m
	memReserved := aksMemoryReserved(maxPods, memory) // 2250Mi
	capacity := resources(cores*1000, memory, disk, maxPods)
	alloc := allocatable(capacity, cpuReserved, memReserved, 0, 100*mi, 10)
	// Azure/AgentBaker pkg/agent/utils.go GetKubeletConfigFileContent; the values: memory.available
	// 100Mi from 1.29 (https://learn.microsoft.com/azure/aks/node-resource-reservations), nodefs
	// ones as AgentBaker's default ("memory.available<750Mi,nodefs.available<10%,nodefs.inodesFree<5%"
	// before 1.29, utils.go), --node-status-update-frequency=10s and
	// --enforce-node-allocatable=pods from its e2e/node_config.go fixture.
	config := fmt.Sprintf(`{
    %s,
    "staticPodPath": "/etc/kubernetes/manifests",
    "address": "0.0.0.0",
    "clusterDomain": "cluster.local",
    "clusterDNS": ["10.0.0.10"],
    "evictionHard": {"memory.available": "100Mi", "nodefs.available": "10%%", "nodefs.inodesFree": "5%%"},
    "kubeReserved": {"cpu": "%dm", "memory": "%dMi"},
    "enforceNodeAllocatable": ["pods"],
    "maxPods": %d,
    "nodeStatusUpdateFrequency": "10s"
}
`, kubeletConfigAPI, cpuReserved, memReserved/mi, maxPods)
	return Profile{
		Name: "aks-spot", Cloud: "azure", OS: "linux", Spot: true,
		Labels: map[string]string{
			"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"node.kubernetes.io/instance-type": "Standard_D4s_v5",
			"topology.kubernetes.io/region":    "eastus", "topology.kubernetes.io/zone": "eastus-1",
			// Azure/AgentBaker pkg/agent/datamodel/types.go GetKubernetesLabels: always both.
			"agentpool": "spotpool", "kubernetes.azure.com/agentpool": "spotpool",
			// AgentBaker e2e fixtures.
			"kubernetes.azure.com/mode": "user",
			// https://learn.microsoft.com/azure/aks/node-auto-drain (the spot node's
			// "kubernetes.azure.com/scalesetpriority: spot"); the RP sets it.
			"kubernetes.azure.com/scalesetpriority": "spot",
		},
		Taints:     []v1.Taint{{Key: "kubernetes.azure.com/scalesetpriority", Value: "spot", Effect: v1.TaintEffectNoSchedule}},
		ProviderID: providerID,
		Capacity:   capacity, Allocatable: alloc,
		NodeInfo: v1.NodeSystemInfo{OperatingSystem: "linux", Architecture: "amd64", OSImage: "Ubuntu 22.04.5 LTS", KubeletVersion: "v1.31.5"},
		Files: []File{
			// Mode 0600: cse_config.sh.
			{Path: AKSConfig, Mode: 0o600, Content: config},
			// cse_config.sh writes KUBELET_FLAGS (the untranslated flags), KUBELET_NODE_LABELS
			// and KUBELET_REGISTER_SCHEDULABLE; utils.go removes the translated ones. Mode 0600:
			// ensureKubelet's chmod 0600 "${KUBELET_DEFAULT_FILE}".
			{Path: AKSFlags, Mode: 0o600, Content: "KUBELET_FLAGS=--cloud-provider=external --kubeconfig=/var/lib/kubelet/kubeconfig --pod-infra-container-image=mcr.microsoft.com/oss/kubernetes/pause:3.6\n" +
				"KUBELET_REGISTER_SCHEDULABLE=true\n" +
				"KUBELET_NODE_LABELS=agentpool=spotpool,kubernetes.azure.com/agentpool=spotpool,kubernetes.azure.com/mode=user,kubernetes.azure.com/scalesetpriority=spot\n"},
			{Path: AKSConfigDropIn, Mode: 0o644, Content: "[Service]\nEnvironment=\"KUBELET_CONFIG_FILE_FLAGS=--config /etc/default/kubeletconfig.json\"\n"},
		},
		ConfigPath: AKSConfig,
		Hard:       []string{"memory.available<100Mi", "nodefs.available<10%", "nodefs.inodesFree<5%"},
		// AgentBaker sets no shutdownGracePeriod ([UNCONFIRMED] whether the RP does): off.
	}
}

// AKSSpotFlags is an AKS spot node of a pool without a kubelet config file
// (KUBELET_CONFIG_FILE_ENABLED false: no CustomKubeletConfig or CustomLinuxOSConfig, and the
// RP's toggle off): the eviction settings, reservations and maxPods stay flags in
// /etc/default/kubelet, and there is no kubeletconfig.json and no 10-componentconfig.conf. The
// sizes and values are those of AgentBaker's e2e/node_config.go fixture, a Standard_DS2_v2 on
// the reservations AKS used before 1.29 (eviction memory.available 750Mi; kube-reserved memory
// 25% of the first 4 GiB and 20% of the next 3, 1638Mi).
func AKSSpotFlags() Profile {
	const (
		// Azure's VM size: Standard_DS2_v2, 2 vCPU, 7 GiB; the OS disk is this profile's.
		cores, memory, disk = 2, 7 * gi, 128 * gi
		maxPods             = 110
		providerID          = "azure:///subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/MC_rg_cluster_eastus/providers/Microsoft.Compute/virtualMachineScaleSets/aks-flagpool-87654321-vmss/virtualMachines/0"
	)
	// Azure/AgentBaker e2e/node_config.go fixture: --kube-reserved=cpu=100m,memory=1638Mi,
	// --eviction-hard=memory.available<750Mi,nodefs.available<10%,nodefs.inodesFree<5%.
	const cpuReserved, memReserved = 100, 1638 * mi
	capacity := resources(cores*1000, memory, disk, maxPods)
	alloc := allocatable(capacity, cpuReserved, memReserved, 0, 750*mi, 10)
	// Azure/AgentBaker pkg/agent/utils.go GetOrderedKubeletConfigFlagString: the flags sorted,
	// each "key=value " (a trailing space), none translated away as the config file is off; the
	// values of the e2e/node_config.go fixture (--cloud-provider=external from 1.29's external
	// cloud provider). cse_config.sh (ensureKubelet) writes KUBELET_FLAGS unquoted, then the
	// other variables, and chmods the file 0600.
	flags := []string{
		"--address=0.0.0.0", "--anonymous-auth=false", "--authentication-token-webhook=true",
		"--authorization-mode=Webhook", "--cgroups-per-qos=true", "--client-ca-file=/etc/kubernetes/certs/ca.crt",
		"--cloud-config=/etc/kubernetes/azure.json", "--cloud-provider=external", "--cluster-dns=10.0.0.10",
		"--cluster-domain=cluster.local", "--enforce-node-allocatable=pods", "--event-qps=0",
		"--eviction-hard=memory.available<750Mi,nodefs.available<10%,nodefs.inodesFree<5%",
		"--feature-gates=RotateKubeletServerCertificate=true", "--image-gc-high-threshold=85", "--image-gc-low-threshold=80",
		"--kube-reserved=cpu=100m,memory=1638Mi", "--kubeconfig=/var/lib/kubelet/kubeconfig", "--max-pods=110",
		"--node-status-update-frequency=10s", "--pod-infra-container-image=mcr.microsoft.com/oss/kubernetes/pause:3.6",
		"--pod-manifest-path=/etc/kubernetes/manifests", "--pod-max-pids=-1", "--protect-kernel-defaults=true",
		"--read-only-port=0", "--resolv-conf=/run/systemd/resolve/resolv.conf", "--rotate-certificates=true",
		"--streaming-connection-idle-timeout=4h", "--tls-cert-file=/etc/kubernetes/certs/kubeletserver.crt",
		"--tls-private-key-file=/etc/kubernetes/certs/kubeletserver.key",
	}
	slices.Sort(flags)
	p := AKSSpot()
	p.Name = "aks-spot-flags"
	p.Labels = maps.Clone(p.Labels)
	p.Labels["node.kubernetes.io/instance-type"] = "Standard_DS2_v2"
	p.Labels["agentpool"], p.Labels["kubernetes.azure.com/agentpool"] = "flagpool", "flagpool"
	p.ProviderID = providerID
	p.Capacity, p.Allocatable = capacity, alloc
	p.NodeInfo.KubeletVersion = "v1.28.15"
	p.Files = []File{
		{Path: AKSFlags, Mode: 0o600, Content: "KUBELET_FLAGS=" + strings.Join(flags, " ") + " \n" +
			"KUBELET_REGISTER_SCHEDULABLE=true\n" +
			"NETWORK_POLICY=\n" +
			"KUBELET_IMAGE=\n" +
			"KUBELET_NODE_LABELS=agentpool=flagpool,kubernetes.azure.com/agentpool=flagpool,kubernetes.azure.com/mode=user,kubernetes.azure.com/scalesetpriority=spot\n"},
	}
	// kubelet.FindConfig reads the flags alone: Path is the flags file.
	p.ConfigPath = AKSFlags
	p.Hard = []string{"memory.available<750Mi", "nodefs.available<10%", "nodefs.inodesFree<5%"}
	return p
}

// WindowsKarpenter is a Karpenter Windows spot node (karpenter-provider-aws has Windows 2019,
// 2022 and 2025 AMI families). The agent's image is Linux-only: no agent belongs here.
func WindowsKarpenter() Profile {
	const (
		cores, memory, disk = 4, 16 * gi, 50 * gi
		maxPods             = 58 // eni-max-pods.txt, "m5.xlarge 58"
		zone                = "us-west-2c"
	)
	capacity := resources(cores*1000, memory, disk, maxPods)
	// [UNCONFIRMED] the reservations of EKS's Windows AMIs; nodeadm's formula is taken here so
	// that allocatable is below capacity as on every platform.
	alloc := allocatable(capacity, eksCPUMillicoresToReserve(cores*1000), eksMemoryMebibytesToReserve(maxPods)*mi, 1*gi, 100*mi, 10)
	return Profile{
		Name: "windows-karpenter", Cloud: "aws", OS: "windows", Spot: true,
		Labels: map[string]string{
			// The kubelet sets kubernetes.io/os on every OS, and node.kubernetes.io/windows-build on
			// Windows ([UNCONFIRMED] here: upstream kubelet behaviour, not re-read).
			"kubernetes.io/os": "windows", "kubernetes.io/arch": "amd64",
			"node.kubernetes.io/windows-build": "10.0.20348",
			"node.kubernetes.io/instance-type": "m5.xlarge",
			"topology.kubernetes.io/region":    "us-west-2", "topology.kubernetes.io/zone": zone,
			"karpenter.sh/capacity-type": "spot", "karpenter.sh/nodepool": "windows",
			"karpenter.sh/registered": "true", "karpenter.sh/initialized": "true",
			"karpenter.k8s.aws/ec2nodeclass": "windows2022",
		},
		ProviderID: "aws:///" + zone + "/i-0a9b8c7d6e5f40703",
		Capacity:   capacity, Allocatable: alloc,
		NodeInfo: v1.NodeSystemInfo{OperatingSystem: "windows", Architecture: "amd64", OSImage: "Windows Server 2022 Datacenter", KubeletVersion: "v1.33.0-eks"},
		// Its kubelet config is C:\ProgramData\kubernetes\kubelet-config.json
		// ([3RD-PARTY] Start-EKSBootstrap.ps1): no Linux host root.
	}
}

// WindowsAKS is an AKS Windows spot node: the spot label and taint, and no kubelet config file
// (flags from c:\k\kubeclusterconfig.json, assembled by kubeletstart.ps1).
func WindowsAKS() Profile {
	const (
		cores, memory, disk = 4, 16 * gi, 128 * gi
		maxPods             = 30 // this profile's choice
	)
	capacity := resources(cores*1000, memory, disk, maxPods)
	// Azure/AgentBaker e2e/node_config.go fixture: --kube-reserved=cpu=100m,memory=3891Mi and
	// --eviction-hard="" (no hard eviction on AKS Windows; staging/cse/windows/provisioningscripts/kubeletstart.ps1).
	alloc := allocatable(capacity, 100, 3891*mi, 0, 0, 0)
	return Profile{
		Name: "windows-aks", Cloud: "azure", OS: "windows", Spot: true,
		Labels: map[string]string{
			"kubernetes.io/os": "windows", "kubernetes.io/arch": "amd64",
			"node.kubernetes.io/windows-build": "10.0.20348",
			"node.kubernetes.io/instance-type": "Standard_D4s_v5",
			"topology.kubernetes.io/region":    "eastus", "topology.kubernetes.io/zone": "eastus-2",
			"agentpool": "npwin", "kubernetes.azure.com/agentpool": "npwin",
			"kubernetes.azure.com/mode":             "user",
			"kubernetes.azure.com/scalesetpriority": "spot",
		},
		Taints:     []v1.Taint{{Key: "kubernetes.azure.com/scalesetpriority", Value: "spot", Effect: v1.TaintEffectNoSchedule}},
		ProviderID: "azure:///subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/MC_rg_cluster_eastus/providers/Microsoft.Compute/virtualMachineScaleSets/aksnpwin/virtualMachines/0",
		Capacity:   capacity, Allocatable: alloc,
		NodeInfo: v1.NodeSystemInfo{OperatingSystem: "windows", Architecture: "amd64", OSImage: "Windows Server 2022 Datacenter", KubeletVersion: "v1.31.5"},
	}
}

// String names the profile.
func (p Profile) String() string {
	return p.Name + " (" + strings.Join([]string{p.Cloud, p.OS}, ", ") + ")"
}
