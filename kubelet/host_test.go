package kubelet

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// fixtureRoot copies a testdata tree into a temporary root and creates the kubelet's root dir in
// it, so that nodefs is the temporary directory's filesystem.
func fixtureRoot(t *testing.T, name string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS(filepath.Join("testdata", name))); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "var/lib/kubelet"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestHostSourceFixtures(t *testing.T) {
	const gi = 1 << 30
	tests := []struct {
		fixture string
		memory  Observation
		pid     Observation
	}{
		{
			// MemTotal 8388608 kB = 8 GiB. Working set = anon + file - inactive_file
			// = 1500000000 + 2600000000 - 900000000 = 3200000000.
			fixture: "cgroupv2",
			memory:  Observation{Available: 8*gi - 3200000000, Capacity: 8 * gi},
			// min(pid_max 4194304, threads-max 63452) - 1234 tasks.
			pid: Observation{Available: 63452 - 1234, Capacity: 63452},
		},
		{
			// MemTotal 4028416 kB = 4125097984 bytes. Working set = usage_in_bytes -
			// total_inactive_file = 3000000000 - 800000000 (not inactive_file, 111).
			fixture: "cgroupv1",
			memory:  Observation{Available: 4028416*1024 - 2200000000, Capacity: 4028416 * 1024},
			// min(pid_max 32768, threads-max 127000) - 900 tasks.
			pid: Observation{Available: 32768 - 900, Capacity: 32768},
		},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			root := fixtureRoot(t, tt.fixture)
			h := &HostSource{Root: root}
			s, err := h.Read(context.Background())
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if s.Pods != nil {
				t.Errorf("Pods = %v, want nil from the host source", s.Pods)
			}
			if got := s.Node[MemoryAvailable]; got != tt.memory {
				t.Errorf("memory.available = %+v, want %+v", got, tt.memory)
			}
			if got := s.Node[PIDAvailable]; got != tt.pid {
				t.Errorf("pid.available = %+v, want %+v", got, tt.pid)
			}
			checkFs(t, s.Node)
			// No image store in the fixture: imagefs is nodefs.
			if s.Node[ImageFsAvailable].Capacity != s.Node[NodeFsAvailable].Capacity ||
				s.Node[ImageFsInodesFree].Capacity != s.Node[NodeFsInodesFree].Capacity {
				t.Errorf("imagefs %+v/%+v, want nodefs %+v/%+v", s.Node[ImageFsAvailable], s.Node[ImageFsInodesFree],
					s.Node[NodeFsAvailable], s.Node[NodeFsInodesFree])
			}
			if len(s.Node) != len(Signals) {
				t.Errorf("got %d signals, want all %d: %v", len(s.Node), len(Signals), s.Node)
			}
		})
	}
}

func checkFs(t *testing.T, obs Observations) {
	t.Helper()
	for _, sig := range []Signal{NodeFsAvailable, NodeFsInodesFree, ImageFsAvailable, ImageFsInodesFree} {
		o, ok := obs[sig]
		if !ok {
			t.Errorf("%s missing", sig)
			continue
		}
		if o.Available < 0 || o.Available > o.Capacity {
			t.Errorf("%s = %+v, want 0 <= available <= capacity", sig, o)
		}
	}
	if obs[NodeFsAvailable].Capacity <= 0 {
		t.Errorf("nodefs capacity %d, want > 0", obs[NodeFsAvailable].Capacity)
	}
}

func TestHostSourceImageFsDir(t *testing.T) {
	root := fixtureRoot(t, "cgroupv2")
	if err := os.MkdirAll(filepath.Join(root, "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	h := &HostSource{Root: root, KubeletRootDir: "/var/lib/kubelet", ImageFsDir: "/images"}
	s, err := h.Read(context.Background())
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	checkFs(t, s.Node)
}

func TestHostSourceWorkingSetFloor(t *testing.T) {
	root := fixtureRoot(t, "cgroupv2")
	// inactive_file above anon + file: the working set is floored at 0, as cadvisor does.
	writeFile(t, filepath.Join(root, "sys/fs/cgroup/memory.stat"), "anon 10\nfile 20\ninactive_file 50\n")
	s, err := (&HostSource{Root: root}).Read(context.Background())
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if got, want := s.Node[MemoryAvailable], (Observation{Available: 8 << 30, Capacity: 8 << 30}); got != want {
		t.Errorf("memory.available = %+v, want %+v", got, want)
	}
}

func TestHostSourcePartial(t *testing.T) {
	tests := []struct {
		name     string
		breakIt  func(t *testing.T, root string)
		errHas   string
		missing  []Signal
		pidAfter *Observation
	}{
		{
			name:    "no meminfo",
			breakIt: func(t *testing.T, root string) { os.Remove(filepath.Join(root, "proc/meminfo")) },
			errHas:  "proc/meminfo",
			missing: []Signal{MemoryAvailable},
		},
		{
			name: "no anon in v2 memory.stat",
			breakIt: func(t *testing.T, root string) {
				writeFile(t, filepath.Join(root, "sys/fs/cgroup/memory.stat"), "file 20\ninactive_file 5\n")
			},
			errHas:  "sys/fs/cgroup/memory.stat",
			missing: []Signal{MemoryAvailable},
		},
		{
			name: "garbage in memory.stat",
			breakIt: func(t *testing.T, root string) {
				writeFile(t, filepath.Join(root, "sys/fs/cgroup/memory.stat"), "anon lots\n")
			},
			errHas:  "sys/fs/cgroup/memory.stat",
			missing: []Signal{MemoryAvailable},
		},
		{
			name: "no threads-max: pid_max alone, as the kubelet",
			breakIt: func(t *testing.T, root string) {
				os.Remove(filepath.Join(root, "proc/sys/kernel/threads-max"))
			},
			errHas:   "proc/sys/kernel/threads-max",
			pidAfter: &Observation{Available: 4194304 - 1234, Capacity: 4194304},
		},
		{
			name: "bad loadavg",
			breakIt: func(t *testing.T, root string) {
				writeFile(t, filepath.Join(root, "proc/loadavg"), "0.1 0.2 0.3 1234 5\n")
			},
			errHas:  "proc/loadavg",
			missing: []Signal{PIDAvailable},
		},
		{
			name:    "no kubelet root dir",
			breakIt: func(t *testing.T, root string) { os.Remove(filepath.Join(root, "var/lib/kubelet")) },
			errHas:  "var/lib/kubelet",
			missing: []Signal{NodeFsAvailable, NodeFsInodesFree, ImageFsAvailable, ImageFsInodesFree},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := fixtureRoot(t, "cgroupv2")
			tt.breakIt(t, root)
			s, err := (&HostSource{Root: root}).Read(context.Background())
			if err == nil || !strings.Contains(err.Error(), tt.errHas) {
				t.Fatalf("error %v, want one naming %s", err, tt.errHas)
			}
			for _, sig := range tt.missing {
				if o, ok := s.Node[sig]; ok {
					t.Errorf("%s = %+v, want it left out", sig, o)
				}
			}
			if want := len(Signals) - len(tt.missing); len(s.Node) != want {
				t.Errorf("got %d signals (%v), want the other %d", len(s.Node), s.Node, want)
			}
			if tt.pidAfter != nil && s.Node[PIDAvailable] != *tt.pidAfter {
				t.Errorf("pid.available = %+v, want %+v", s.Node[PIDAvailable], *tt.pidAfter)
			}
		})
	}
}

// TestHostSourceThisMachine reads this machine's /proc, /sys and root filesystem.
//
// memory.available is usually below MemAvailable: the kubelet's working set counts active file
// pages as used, where MemAvailable counts most of the page cache as available. It is not a strict
// bound, though: the root cgroup's usage (anon + file, or v1's usage_in_bytes) leaves out kernel
// memory (unreclaimable slab, stacks, page tables) and the huge page pool, which MemAvailable
// subtracts. So the check allows for those, plus 1% of MemTotal for memory moving between reads.
func TestHostSourceThisMachine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skipf("reads /proc and /sys, which %s does not have", runtime.GOOS)
	}
	s, err := (&HostSource{Root: "/", KubeletRootDir: "/"}).Read(context.Background())
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	mi := readMeminfo(t)

	mem, ok := s.Node[MemoryAvailable]
	if !ok {
		t.Fatal("memory.available missing")
	}
	if mem.Capacity != mi["MemTotal"] {
		t.Errorf("memory capacity %d, want MemTotal %d", mem.Capacity, mi["MemTotal"])
	}
	if mem.Available <= 0 || mem.Available > mem.Capacity {
		t.Errorf("memory.available %d, want in (0, %d]", mem.Available, mem.Capacity)
	}
	kernel := mi["SUnreclaim"] + mi["KernelStack"] + mi["PageTables"] + mi["Hugetlb"] + mi["MemTotal"]/100
	if mem.Available > mi["MemAvailable"]+kernel {
		t.Errorf("memory.available %d above MemAvailable %d + kernel memory and slack %d", mem.Available, mi["MemAvailable"], kernel)
	}
	t.Logf("memory.available %d, MemAvailable %d (difference %d)", mem.Available, mi["MemAvailable"], mi["MemAvailable"]-mem.Available)

	limit := min(readIntT(t, "/proc/sys/kernel/pid_max"), readIntT(t, "/proc/sys/kernel/threads-max"))
	pid := s.Node[PIDAvailable]
	if pid.Capacity != limit || pid.Available <= 0 || pid.Available >= limit {
		t.Errorf("pid.available %+v, want capacity %d and 0 < available < capacity", pid, limit)
	}
	checkFs(t, s.Node)
}

func readMeminfo(t *testing.T) map[string]int64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 1 && fields[1] == "kB" {
			n *= 1024
		}
		out[k] = n
	}
	return out
}

func readIntT(t *testing.T, path string) int64 {
	t.Helper()
	v, err := readInt(path)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
