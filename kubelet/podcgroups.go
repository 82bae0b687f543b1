package kubelet

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// The pods cgroup, as the kubelet's container manager names it under the cgroup root "/" (its
// default --cgroup-root): "kubepods", which the systemd driver turns into "kubepods.slice"
// (cm.NewCgroupName, cgroupManagerImpl.Name). The QoS classes are children of it
// (qos_container_manager_linux.go) and every pod a child of its class, or of the pods cgroup
// itself when Guaranteed (pod_container_manager_linux.go, GetPodContainerName):
//
//	systemd:  kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice
//	          kubepods.slice/kubepods-pod<uid with _>.slice (Guaranteed)
//	cgroupfs: kubepods/burstable/pod<uid>, kubepods/pod<uid> (Guaranteed)
var podsCgroupNames = []string{"kubepods.slice", "kubepods"}

// maxMemorySize is the kubelet's isMemoryUnlimited bound (pkg/kubelet/stats/helper.go): a limit
// above it is no limit (cgroup v1 reads a page-aligned MaxInt64 there, v2 "max").
const maxMemorySize = uint64(1 << 62)

// podsCgroup finds the pods cgroup's directory for the memory controller: under the unified
// hierarchy (v2) or memory/ (v1). ok is false when there is none (a kubelet with
// cgroupsPerQOS off, or another --cgroup-root).
func (h *HostSource) podsCgroup() (dir string, v2, ok bool) {
	cgroupDir := h.path("/sys/fs/cgroup")
	_, err := os.Stat(filepath.Join(cgroupDir, "cgroup.controllers"))
	v2 = err == nil
	base := cgroupDir
	if !v2 {
		base = filepath.Join(cgroupDir, "memory")
	}
	for _, name := range podsCgroupNames {
		d := filepath.Join(base, name)
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			return d, v2, true
		}
	}
	return "", v2, false
}

// cgroupMemory is one cgroup's memory as cadvisor reads it for the kubelet: the limit (0 when
// unlimited) and the working set, usage minus inactive file pages, never below zero
// (container/libcontainer/handler.go, setMemoryStats: memory.current and inactive_file on v2,
// memory.usage_in_bytes and total_inactive_file on v1).
func cgroupMemory(dir string, v2 bool) (limit, workingSet uint64, err error) {
	usageFile, limitFile, inactiveKey := "memory.current", "memory.max", "inactive_file"
	if !v2 {
		usageFile, limitFile, inactiveKey = "memory.usage_in_bytes", "memory.limit_in_bytes", "total_inactive_file"
	}
	u, err := readInt(filepath.Join(dir, usageFile))
	if err != nil {
		return 0, 0, err
	}
	stat, err := readKeyed(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return 0, 0, err
	}
	usage := uint64(u)
	if inactive := stat[inactiveKey]; inactive < usage {
		workingSet = usage - inactive
	}
	b, err := readSmall(filepath.Join(dir, limitFile))
	if err != nil {
		return 0, 0, err
	}
	switch s := strings.TrimSpace(string(b)); s {
	case "max":
	default:
		var l uint64
		if _, err := fmt.Sscan(s, &l); err != nil {
			return 0, 0, fmt.Errorf("%s: %q is not a limit", filepath.Join(dir, limitFile), s)
		}
		if l <= maxMemorySize {
			limit = l
		}
	}
	return limit, workingSet, nil
}

// allocatableMemory computes allocatableMemory.available as the kubelet does from the Summary
// API's "pods" system container: the pods cgroup's limit minus its working set, with capacity
// the limit (availableBytes + workingSetBytes). ok is false when there is no pods cgroup or it
// has no limit: the kubelet then reports no availableBytes and has no such signal.
func (h *HostSource) allocatableMemory() (o Observation, ok bool, err error) {
	dir, v2, found := h.podsCgroup()
	if !found {
		return Observation{}, false, nil
	}
	limit, ws, err := cgroupMemory(dir, v2)
	if err != nil {
		return Observation{}, false, err
	}
	if limit == 0 {
		return Observation{}, false, nil
	}
	if limit > math.MaxInt64 {
		return Observation{}, false, fmt.Errorf("%s: limit %d out of range", dir, limit)
	}
	// cadvisor's limit - workingSet is unsigned; the kernel keeps the working set within the
	// limit, so a larger one is a racy read: nothing available.
	avail := int64(0)
	if ws < limit {
		avail = int64(limit - ws)
	}
	return Observation{Available: avail, Capacity: int64(limit)}, true, nil
}

// podUsage reads each pod's memory working set and process count from its cgroup under the pods
// cgroup, read-only: the per-pod figures the kubelet ranks memory and PID pressure by (the
// Summary API's pods[].memory.workingSetBytes, from cadvisor on the pod's cgroup, and
// process_stats.process_count, which the kubelet counts from the pod's cgroup too). ok is false
// when there is no pods cgroup. A pod whose files cannot be read is left out (ranked first, as
// the kubelet ranks a pod without stats); the first such failure is returned.
func (h *HostSource) podUsage() (map[types.UID]PodUsage, bool, error) {
	dir, v2, found := h.podsCgroup()
	if !found {
		return nil, false, nil
	}
	out := map[types.UID]PodUsage{}
	var errs []error
	visit := func(d string) {
		entries, err := os.ReadDir(d)
		if err != nil {
			errs = append(errs, err)
			return
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			uid, ok := podUIDOf(e.Name())
			if !ok {
				continue
			}
			pd := filepath.Join(d, e.Name())
			_, ws, err := cgroupMemory(pd, v2)
			if err != nil {
				if !errors.Is(err, fs.ErrNotExist) || len(errs) == 0 {
					errs = append(errs, err)
				}
				continue
			}
			u := PodUsage{UID: uid, MemoryWorkingSet: clampInt64(ws)}
			if n, err := h.podProcesses(pd, v2); err == nil {
				u.Processes = n
			}
			out[uid] = u
		}
	}
	visit(dir)
	for _, qos := range []string{"burstable", "besteffort"} {
		name := qos
		if strings.HasSuffix(dir, ".slice") {
			name = "kubepods-" + qos + ".slice"
		}
		if d := filepath.Join(dir, name); isDir(d) {
			visit(d)
		}
	}
	var err error
	if len(errs) > 0 {
		err = fmt.Errorf("per-pod usage under %s: %w", dir, errs[0])
	}
	return out, true, err
}

// podProcesses is the pod's process count: the processes (not threads) in cgroup.procs of its
// cgroup and every cgroup below it (its containers'), as cadvisor counts a cgroup's processes for
// the kubelet's process_stats. The same file exists on v1 and v2.
func (h *HostSource) podProcesses(podDir string, _ bool) (int64, error) {
	var n int64
	err := filepath.WalkDir(podDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, err := readSmall(p)
		if err != nil {
			return err
		}
		n += int64(strings.Count(string(b), "\n"))
		return nil
	})
	return n, err
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// podUIDOf reads a pod's UID from its cgroup's name: "pod<uid>" (cgroupfs) or
// "kubepods[-<qos>]-pod<uid with _ for ->.slice" (systemd, which escapes "-" as "_":
// GetPodContainerName and cm.NewCgroupName's systemd conversion).
func podUIDOf(name string) (types.UID, bool) {
	if s, ok := strings.CutSuffix(name, ".slice"); ok {
		i := strings.LastIndex(s, "-pod")
		if i < 0 || !strings.HasPrefix(s, "kubepods") {
			return "", false
		}
		uid := strings.ReplaceAll(s[i+len("-pod"):], "_", "-")
		return types.UID(uid), validUID(uid)
	}
	uid, ok := strings.CutPrefix(name, "pod")
	return types.UID(uid), ok && validUID(uid)
}

// validUID accepts the 36-character UUID form the API server gives pods.
func validUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		default:
			return false
		}
	}
	return true
}
