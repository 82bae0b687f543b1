package pressure

import (
	"fmt"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// summaryJSON is a Summary API answer with two pods: "layer" wrote 10 GiB (and 100000 inodes)
// into its containers' writable layer, "scratch" 5 GiB (5000 inodes) into an emptyDir and 2000
// files into a Secret volume (tmpfs). imageFs is the capacity of the image store: equal to fs's
// when the images share nodefs, different when they have a filesystem of their own.
func summaryJSON(imageFsCapacity int64) []byte {
	return fmt.Appendf(nil, `{
  "node": {
    "fs": {"availableBytes": 1073741824, "capacityBytes": 107374182400, "inodesFree": 100, "inodes": 6553600},
    "runtime": {"imageFs": {"availableBytes": 1073741824, "capacityBytes": %d, "inodesFree": 100, "inodes": 6553600}}
  },
  "pods": [
    {"podRef": {"name": "layer", "namespace": "ns", "uid": "layer"},
     "containers": [{"name": "c", "rootfs": {"usedBytes": 10737418240, "inodesUsed": 100000}, "logs": {"usedBytes": 4096, "inodesUsed": 1}}],
     "ephemeral-storage": {"usedBytes": 10737422336, "inodesUsed": 100001}},
    {"podRef": {"name": "scratch", "namespace": "ns", "uid": "scratch"},
     "containers": [{"name": "c", "rootfs": {"usedBytes": 8192, "inodesUsed": 2}, "logs": {"usedBytes": 4096, "inodesUsed": 1}}],
     "volume": [{"name": "scratch", "usedBytes": 5368709120, "inodesUsed": 5000},
                {"name": "token", "usedBytes": 8192, "inodesUsed": 20000}],
     "ephemeral-storage": {"usedBytes": 5368729600, "inodesUsed": 25003}}
  ]
}`, imageFsCapacity)
}

func diskPods() []*v1.Pod {
	layer, scratch := pod("layer", 0, "", 30), pod("scratch", 0, "", 30)
	scratch.Spec.Volumes = []v1.Volume{
		{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		{Name: "token", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "t"}}},
	}
	return []*v1.Pod{layer, scratch}
}

// With a dedicated imagefs the kubelet ranks nodefs by logs and local volumes only
// (buildSignalToRankFunc withImageFs: fsStatsLogs, fsStatsLocalVolumeSource): the writable
// layer is on imagefs, and evicting its pod frees nothing on nodefs. Sharing one filesystem,
// the writable layer counts too. A Secret volume (tmpfs) is no local volume
// (localVolumeNames: hostPath, gitRepo, emptyDir on disk, configMap) and never counts.
func TestRankNodeFsAsTheKubelet(t *testing.T) {
	const gi = 1 << 30
	tests := []struct {
		name      string
		imageFs   int64
		signal    kubelet.Signal
		want      []string
		wantUsage []int64
	}{
		{"dedicated imagefs, bytes", 53687091200, kubelet.NodeFsAvailable, []string{"scratch", "layer"}, []int64{5*gi + 4096, 4096}},
		{"dedicated imagefs, inodes", 53687091200, kubelet.NodeFsInodesFree, []string{"scratch", "layer"}, []int64{5001, 1}},
		{"shared filesystem, bytes", 107374182400, kubelet.NodeFsAvailable, []string{"layer", "scratch"}, []int64{10*gi + 4096, 5*gi + 8192 + 4096}},
		{"shared filesystem, inodes", 107374182400, kubelet.NodeFsInodesFree, []string{"layer", "scratch"}, []int64{100001, 5003}},
		// imagefs signals rank by the writable layer alone when it is a filesystem of its own.
		{"dedicated imagefs, imagefs bytes", 53687091200, kubelet.ImageFsAvailable, []string{"layer", "scratch"}, []int64{10 * gi, 8192}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sample, err := kubelet.ParseSummary(summaryJSON(tt.imageFs))
			if err != nil {
				t.Fatalf("ParseSummary: %v", err)
			}
			cs := Candidates(tt.signal, diskPods(), sample.Pods, grace)
			var usage []int64
			for _, c := range cs {
				usage = append(usage, c.Usage)
			}
			if got := names(cs); !slices.Equal(got, tt.want) || !slices.Equal(usage, tt.wantUsage) {
				t.Fatalf("%s order %v with usage %v, want %v with %v", tt.signal, got, usage, tt.want, tt.wantUsage)
			}
		})
	}
}

// The kubelet adds a pod's overhead to its memory request only when the request total is
// non-zero (GetResourceRequestQuantity): a Kata or gVisor pod without a memory request is
// above its (zero) request from its first byte, and with its larger use above request it goes
// before a pod that exceeds a request of its own.
func TestRankMemoryOverheadOnlyOnARequest(t *testing.T) {
	sandboxed := pod("sandboxed", 0, "", 30)
	sandboxed.Spec.Overhead = v1.ResourceList{v1.ResourceMemory: resource.MustParse("250Mi")}
	over := pod("over", 0, "100Mi", 30)
	// With a request, the overhead counts: 300Mi of 100Mi + 250Mi is within it.
	within := pod("within", 0, "100Mi", 30)
	within.Spec.Overhead = v1.ResourceList{v1.ResourceMemory: resource.MustParse("250Mi")}
	usage := map[string]int64{"sandboxed": 200 * mi, "over": 150 * mi, "within": 300 * mi}
	pods := []*v1.Pod{within, over, sandboxed}
	got := names(Candidates(kubelet.MemoryAvailable, pods, usageOf(usage), grace))
	if want := []string{"sandboxed", "over", "within"}; !slices.Equal(got, want) {
		t.Fatalf("memory order %v, want %v", got, want)
	}
}

// With pod-level resources the kubelet ignores the containers' requests altogether
// (GetResourceRequestQuantity: SkipContainerLevelResources when IsPodLevelResourcesSet, the
// PodLevelResources gate on by default from 1.34): a pod-level memory request hides the
// containers' ephemeral-storage requests.
func TestRankPodLevelResourcesHideContainerRequests(t *testing.T) {
	podLevel := pod("pod-level", 0, "", 30)
	podLevel.Spec.Resources = &v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Gi")}}
	podLevel.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse("10Gi")}
	plain := pod("plain", 0, "", 30)
	plain.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse("10Gi")}
	sample, err := kubelet.ParseSummary(summaryJSON(107374182400))
	if err != nil {
		t.Fatal(err)
	}
	u := sample.Pods
	u["pod-level"], u["plain"] = u["scratch"], u["layer"]
	// pod-level's 5 GiB is above its (zero) ephemeral-storage request; plain's 10 GiB is within 10Gi.
	if got, want := names(Candidates(kubelet.NodeFsAvailable, []*v1.Pod{plain, podLevel}, u, grace)), []string{"pod-level", "plain"}; !slices.Equal(got, want) {
		t.Fatalf("nodefs order %v, want %v", got, want)
	}
}

// For inodes the kubelet's disk() subtracts the pod's ephemeral-storage request (in bytes)
// from its inode count, while exceedDiskRequests compares with an inode request that never
// exists: a pod with a large ephemeral-storage request goes after one that uses fewer inodes.
func TestRankInodesSubtractEphemeralStorageRequest(t *testing.T) {
	sample, err := kubelet.ParseSummary(summaryJSON(107374182400))
	if err != nil {
		t.Fatal(err)
	}
	pods := diskPods()
	pods[0].Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceEphemeralStorage: resource.MustParse("1Mi")}
	// layer: 100001 inodes - 1048576 < scratch: 5003 - 0.
	if got, want := names(Candidates(kubelet.NodeFsInodesFree, pods, sample.Pods, grace)), []string{"scratch", "layer"}; !slices.Equal(got, want) {
		t.Fatalf("inode order %v, want %v", got, want)
	}
}

func usageOf(memory map[string]int64) map[types.UID]kubelet.PodUsage {
	out := map[types.UID]kubelet.PodUsage{}
	for name, m := range memory {
		out[types.UID(name)] = kubelet.PodUsage{MemoryWorkingSet: m}
	}
	return out
}
