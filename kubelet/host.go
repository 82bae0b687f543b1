package kubelet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/shirou/gopsutil/v4/common"
	"github.com/shirou/gopsutil/v4/disk"
	"github.com/shirou/gopsutil/v4/mem"
)

// Defaults for HostSource's directories, as paths on the host.
const (
	DefaultKubeletRootDir = "/var/lib/kubelet"
	DefaultImageFsDir     = "/var/lib/containerd"
)

// maxProcFile bounds what is read from one /proc or /sys file; the largest, memory.stat, is a few KiB.
const maxProcFile = 1 << 20

// HostSource reads the host's files under Root, as the kubelet computes each signal.
type HostSource struct {
	Root           string // "/" on the host; "/host" in the DaemonSet (read-only mount)
	KubeletRootDir string // nodefs: default "/var/lib/kubelet" (joined under Root)
	ImageFsDir     string // imagefs: the runtime's image store, default "/var/lib/containerd" (under Root); when missing, imagefs = nodefs
	// MaxPID, when set, gives the node's PID limit in place of min(pid_max, threads-max) under
	// Root: since Linux 6.14, kernel.pid_max is a setting of each PID namespace, and a process
	// in a pod's namespace reads its own namespace's value (4194304 unless set) through any
	// mount of /proc/sys/kernel/pid_max, not the host's that the kubelet reads. ok false (no
	// value known) falls back to the files; MaxPID reports its own failures.
	MaxPID func(ctx context.Context) (limit int64, ok bool)
	// PodUsage reads each pod's memory working set and process count from the pods' cgroups
	// (podUsage), so that pods rank as the kubelet ranks them for memory and PIDs. Without it,
	// or without a pods cgroup, Sample.Pods is nil and ranking falls back to priority alone.
	PodUsage bool
}

var _ Source = (*HostSource)(nil)

// Read reads every signal. Each is read on its own: a failure drops that signal (or pair, for a
// filesystem) and is named in the joined error, and the rest are still returned.
func (h *HostSource) Read(ctx context.Context) (Sample, error) {
	obs := Observations{}
	var errs []error

	if o, err := h.memory(ctx); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", MemoryAvailable, err))
	} else {
		obs[MemoryAvailable] = o
	}

	if o, ok, err := h.allocatableMemory(); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", AllocatableMemoryAvailable, err))
	} else if ok {
		obs[AllocatableMemoryAvailable] = o
	}

	nodeDir := h.path(orDefault(h.KubeletRootDir, DefaultKubeletRootDir))
	nodeBytes, nodeInodes, nodeErr := statFs(ctx, nodeDir)
	if nodeErr != nil {
		errs = append(errs, fmt.Errorf("nodefs: %w", nodeErr))
	} else {
		obs[NodeFsAvailable], obs[NodeFsInodesFree] = nodeBytes, nodeInodes
	}

	// The kubelet's imagefs is the filesystem the runtime reports for its image store
	// (CRI ImageFsInfo); with no separate store it is the same filesystem as nodefs.
	imageDir := h.path(orDefault(h.ImageFsDir, DefaultImageFsDir))
	if _, err := os.Stat(imageDir); errors.Is(err, fs.ErrNotExist) {
		if nodeErr == nil {
			obs[ImageFsAvailable], obs[ImageFsInodesFree] = nodeBytes, nodeInodes
		}
	} else if b, i, err := statFs(ctx, imageDir); err != nil {
		errs = append(errs, fmt.Errorf("imagefs: %w", err))
	} else {
		obs[ImageFsAvailable], obs[ImageFsInodesFree] = b, i
	}

	o, err := h.pids(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", PIDAvailable, err))
	}
	if o != nil {
		obs[PIDAvailable] = *o
	}
	sample := Sample{Node: obs, DedicatedImageFs: dedicatedImageFs(obs)}
	if h.PodUsage {
		pods, ok, err := h.podUsage()
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			sample.Pods, sample.PodsMemoryAndPIDsOnly = pods, true
		}
	}
	return sample, errors.Join(errs...)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func (h *HostSource) path(p string) string {
	return filepath.Join(orDefault(h.Root, "/"), p)
}

// memory computes memory.available as the kubelet does: capacity (MemTotal, cadvisor's
// MachineInfo.MemoryCapacity) minus the root cgroup's working set. This is not gopsutil's
// Available (MemAvailable), which counts reclaimable memory the kubelet's working set does not
// subtract (active file pages, reclaimable slab), so it is usually lower than MemAvailable.
func (h *HostSource) memory(ctx context.Context) (Observation, error) {
	procDir := h.path("/proc")
	ctx = context.WithValue(ctx, common.EnvKey, common.EnvMap{
		common.HostProcEnvKey: procDir,
		common.HostSysEnvKey:  h.path("/sys"),
		common.HostRootEnvKey: orDefault(h.Root, "/"),
	})
	vm, err := mem.VirtualMemoryWithContext(ctx)
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		return Observation{}, pe // names the file already
	} else if err != nil {
		return Observation{}, fmt.Errorf("reading %s: %w", filepath.Join(procDir, "meminfo"), err)
	}
	if vm.Total == 0 || vm.Total > math.MaxInt64 {
		return Observation{}, fmt.Errorf("%s: MemTotal %d out of range", filepath.Join(procDir, "meminfo"), vm.Total)
	}
	ws, err := h.workingSet()
	if err != nil {
		return Observation{}, err
	}
	capacity := int64(vm.Total)
	return Observation{Available: capacity - ws, Capacity: capacity}, nil
}

// workingSet is the root cgroup's memory working set, as cadvisor computes it
// (container/libcontainer/handler.go, setMemoryStats): usage minus inactive file pages, never
// below zero.
//
// cgroup v2's root has no memory.current, so runc (libcontainer/cgroups/fs2, rootStatsFromMeminfo)
// takes usage = anon + file from the root memory.stat, and cadvisor subtracts inactive_file.
// cgroup v1 has memory.usage_in_bytes at the root, and cadvisor subtracts total_inactive_file.
func (h *HostSource) workingSet() (int64, error) {
	cgroupDir := h.path("/sys/fs/cgroup")
	var usage, inactive uint64
	if _, err := os.Stat(filepath.Join(cgroupDir, "cgroup.controllers")); err == nil {
		stat, err := readKeyed(filepath.Join(cgroupDir, "memory.stat"))
		if err != nil {
			return 0, err
		}
		anon, okA := stat["anon"]
		file, okF := stat["file"]
		if !okA || !okF {
			return 0, fmt.Errorf("%s: no anon or file field", filepath.Join(cgroupDir, "memory.stat"))
		}
		usage, inactive = anon+file, stat["inactive_file"]
	} else {
		memDir := filepath.Join(cgroupDir, "memory")
		u, err := readInt(filepath.Join(memDir, "memory.usage_in_bytes"))
		if err != nil {
			return 0, err
		}
		stat, err := readKeyed(filepath.Join(memDir, "memory.stat"))
		if err != nil {
			return 0, err
		}
		usage, inactive = uint64(u), stat["total_inactive_file"]
	}
	// As cadvisor: a missing inactive_file subtracts nothing, and the result is floored at zero.
	if inactive > usage {
		return 0, nil
	}
	ws := usage - inactive
	if ws > math.MaxInt64 {
		return 0, fmt.Errorf("%s: working set %d out of range", cgroupDir, ws)
	}
	return int64(ws), nil
}

// pids computes pid.available as the kubelet does (pkg/kubelet/stats/pidlimit, Stats):
// min(kernel.pid_max, kernel.threads-max) minus the total task count from /proc/loadavg. Like the
// kubelet, a limit file that cannot be read is skipped if the other one can be; the error still
// names it. The limit is MaxPID's when it has one (the kubelet's own, read in the host's PID
// namespace); the task count of /proc/loadavg is the kernel's total in every namespace.
func (h *HostSource) pids(ctx context.Context) (*Observation, error) {
	var errs []error
	limit := int64(-1)
	names := []string{"pid_max", "threads-max"}
	if h.MaxPID != nil {
		if v, ok := h.MaxPID(ctx); ok {
			limit, names = v, nil
		}
	}
	for _, name := range names {
		v, err := readInt(h.path("/proc/sys/kernel/" + name))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if limit < 0 || v < limit {
			limit = v
		}
	}
	tasks, err := readLoadavgTasks(h.path("/proc/loadavg"))
	if err != nil {
		errs = append(errs, err)
	}
	if limit < 0 || err != nil {
		return nil, errors.Join(errs...)
	}
	return &Observation{Available: limit - tasks, Capacity: limit}, errors.Join(errs...)
}

// readLoadavgTasks returns the total in the "running/total" field of /proc/loadavg, e.g.
// "1.36 3.49 4.53 2/3518 3715089".
func readLoadavgTasks(path string) (int64, error) {
	b, err := readSmall(path)
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(b))
	if len(fields) < 5 {
		return 0, fmt.Errorf("%s: want 5 fields, got %d", path, len(fields))
	}
	_, total, ok := strings.Cut(fields[3], "/")
	if !ok {
		return 0, fmt.Errorf("%s: fourth field %q is not running/total", path, fields[3])
	}
	n, err := strconv.ParseInt(total, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s: task count %q: not a count", path, total)
	}
	return n, nil
}

// statFs returns a filesystem's bytes and inodes observations, as cadvisor fills FsStats from
// statfs: available = blocks free to unprivileged users (Bavail*Bsize), capacity = Blocks*Bsize;
// inodesFree = Ffree out of Files.
func statFs(ctx context.Context, dir string) (bytes, inodes Observation, err error) {
	u, err := disk.UsageWithContext(ctx, dir)
	if err != nil {
		return Observation{}, Observation{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	if u.Total > math.MaxInt64 || u.Free > u.Total || u.InodesTotal > math.MaxInt64 || u.InodesFree > u.InodesTotal {
		return Observation{}, Observation{}, fmt.Errorf("statfs %s: implausible sizes (free %d of %d bytes, %d of %d inodes)",
			dir, u.Free, u.Total, u.InodesFree, u.InodesTotal)
	}
	return Observation{Available: int64(u.Free), Capacity: int64(u.Total)},
		Observation{Available: int64(u.InodesFree), Capacity: int64(u.InodesTotal)}, nil
}

func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err // *fs.PathError names the file
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxProcFile+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(b) > maxProcFile {
		return nil, fmt.Errorf("reading %s: larger than %d bytes", path, maxProcFile)
	}
	return b, nil
}

// readInt reads a file holding one non-negative integer, such as pid_max.
func readInt(path string) (int64, error) {
	b, err := readSmall(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%s: %q is not a non-negative integer", path, s)
	}
	return v, nil
}

// readKeyed reads a "key value" file such as memory.stat.
func readKeyed(path string) (map[string]uint64, error) {
	b, err := readSmall(path)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: field %s: %q is not a count", path, k, v)
		}
		out[k] = n
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return out, nil
}
