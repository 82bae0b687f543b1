package kubelet

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// allocatableMemory.available and the per-pod figures from the pods cgroup, on the two layouts
// the kubelet creates: the systemd driver on cgroup v2 (kubepods.slice/kubepods-burstable.slice/
// kubepods-burstable-pod<uid>.slice, "-" escaped as "_") and cgroupfs on cgroup v1
// (kubepods/burstable/pod<uid>). The figures are cadvisor's: limit - working set, working set =
// usage - inactive file pages (v1: total_inactive_file).
func TestHostSourcePodsCgroup(t *testing.T) {
	tests := []struct {
		fixture     string
		allocatable Observation
		pods        map[types.UID]PodUsage
	}{
		{
			fixture: "cgroupv2",
			// memory.max 7 GiB, memory.current 4000000000 - inactive_file 500000000.
			allocatable: Observation{Available: 7516192768 - 3500000000, Capacity: 7516192768},
			pods: map[types.UID]PodUsage{
				// 600000000 - 100000000; three processes in its container's cgroup.
				"3f1c2a9e-5b7d-4c1e-9a0f-2d6e8b4c1a77": {UID: "3f1c2a9e-5b7d-4c1e-9a0f-2d6e8b4c1a77", MemoryWorkingSet: 500000000, Processes: 3},
				"a0d9e1c2-7f44-4b8e-b2a1-5c3d9e7f1b20": {UID: "a0d9e1c2-7f44-4b8e-b2a1-5c3d9e7f1b20", MemoryWorkingSet: 3000000000, Processes: 1},
				// Guaranteed, directly under kubepods.slice; inactive_file above usage: 0.
				"c4b3a291-0e1d-4f2c-8b7a-6d5e4f3c2b10": {UID: "c4b3a291-0e1d-4f2c-8b7a-6d5e4f3c2b10"},
			},
		},
		{
			fixture: "cgroupv1",
			// limit_in_bytes 3 GiB, usage_in_bytes 2000000000 - total_inactive_file 300000000
			// (not inactive_file).
			allocatable: Observation{Available: 3221225472 - 1700000000, Capacity: 3221225472},
			pods: map[types.UID]PodUsage{
				"3f1c2a9e-5b7d-4c1e-9a0f-2d6e8b4c1a77": {UID: "3f1c2a9e-5b7d-4c1e-9a0f-2d6e8b4c1a77", MemoryWorkingSet: 500000000, Processes: 2},
				"c4b3a291-0e1d-4f2c-8b7a-6d5e4f3c2b10": {UID: "c4b3a291-0e1d-4f2c-8b7a-6d5e4f3c2b10", MemoryWorkingSet: 100, Processes: 1},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			root := fixtureRoot(t, tt.fixture)
			s, err := (&HostSource{Root: root, PodUsage: true}).Read(context.Background())
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if got := s.Node[AllocatableMemoryAvailable]; got != tt.allocatable {
				t.Errorf("allocatableMemory.available = %+v, want %+v", got, tt.allocatable)
			}
			if !reflect.DeepEqual(s.Pods, tt.pods) {
				t.Errorf("Pods =\n%+v\nwant\n%+v", s.Pods, tt.pods)
			}
			if !s.PodsMemoryAndPIDsOnly {
				t.Error("the host source's per-pod figures are not marked memory and PIDs only")
			}
			// Without PodUsage: no per-pod figures, the signal still read.
			s, err = (&HostSource{Root: root}).Read(context.Background())
			if err != nil || s.Pods != nil || s.Node[AllocatableMemoryAvailable] != tt.allocatable {
				t.Errorf("without PodUsage: pods %v, allocatable %+v, err %v", s.Pods, s.Node[AllocatableMemoryAvailable], err)
			}
		})
	}
}

// A pods cgroup without a limit (enforceNodeAllocatable without "pods"), or none at all
// (cgroupsPerQOS off), gives no allocatableMemory.available, as the kubelet's Summary API then
// reports no availableBytes for the "pods" container; neither is an error.
func TestHostSourcePodsCgroupUnlimitedOrMissing(t *testing.T) {
	root := fixtureRoot(t, "cgroupv2")
	writeFile(t, filepath.Join(root, "sys/fs/cgroup/kubepods.slice/memory.max"), "max\n")
	s, err := (&HostSource{Root: root}).Read(context.Background())
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if o, ok := s.Node[AllocatableMemoryAvailable]; ok {
		t.Errorf("unlimited pods cgroup: allocatableMemory.available = %+v, want none", o)
	}
	if err := os.RemoveAll(filepath.Join(root, "sys/fs/cgroup/kubepods.slice")); err != nil {
		t.Fatal(err)
	}
	s, err = (&HostSource{Root: root, PodUsage: true}).Read(context.Background())
	if err != nil || s.Pods != nil {
		t.Fatalf("no pods cgroup: pods %v, err %v; want no figures and no error", s.Pods, err)
	}
	if o, ok := s.Node[AllocatableMemoryAvailable]; ok {
		t.Errorf("no pods cgroup: allocatableMemory.available = %+v, want none", o)
	}
}

// A pods cgroup whose files do not parse is an error naming the file; the other signals stay.
func TestHostSourcePodsCgroupBad(t *testing.T) {
	root := fixtureRoot(t, "cgroupv2")
	writeFile(t, filepath.Join(root, "sys/fs/cgroup/kubepods.slice/memory.max"), "lots\n")
	s, err := (&HostSource{Root: root}).Read(context.Background())
	if err == nil || !strings.Contains(err.Error(), "kubepods.slice/memory.max") {
		t.Fatalf("error %v, want one naming kubepods.slice/memory.max", err)
	}
	if _, ok := s.Node[AllocatableMemoryAvailable]; ok {
		t.Error("allocatableMemory.available read from a bad limit")
	}
	if _, ok := s.Node[MemoryAvailable]; !ok {
		t.Error("memory.available lost with the pods cgroup's bad limit")
	}
}

func TestPodUIDOf(t *testing.T) {
	for name, want := range map[string]types.UID{
		"kubepods-burstable-pod3f1c2a9e_5b7d_4c1e_9a0f_2d6e8b4c1a77.slice":  "3f1c2a9e-5b7d-4c1e-9a0f-2d6e8b4c1a77",
		"kubepods-besteffort-pod3f1c2a9e_5b7d_4c1e_9a0f_2d6e8b4c1a77.slice": "3f1c2a9e-5b7d-4c1e-9a0f-2d6e8b4c1a77",
		"kubepods-pod3f1c2a9e_5b7d_4c1e_9a0f_2d6e8b4c1a77.slice":            "3f1c2a9e-5b7d-4c1e-9a0f-2d6e8b4c1a77",
		"pod3f1c2a9e-5b7d-4c1e-9a0f-2d6e8b4c1a77":                           "3f1c2a9e-5b7d-4c1e-9a0f-2d6e8b4c1a77",
		"kubepods-burstable.slice":                                          "",
		"burstable":                                                         "",
		"podnotauid":                                                        "",
		"system-pod3f1c2a9e_5b7d_4c1e_9a0f_2d6e8b4c1a77.slice":              "",
	} {
		got, ok := podUIDOf(name)
		if ok != (want != "") || (ok && got != want) {
			t.Errorf("podUIDOf(%q) = %q, %v; want %q", name, got, ok, want)
		}
	}
}
