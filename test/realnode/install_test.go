package realnode

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/diff"
)

// Tolerances of the signal comparison: the agent reads every second, the test a moment after
// the scrape, and the machine's memory, disk and task count move in between. nodefs is the
// node's own filesystem, which only the node writes to (its pods' logs); imagefs is the
// machine's disk, which everything on the machine writes to.
const (
	memoryTolerance  = 64 << 20
	nodeFsTolerance  = 4 << 20
	inodeTolerance   = 100
	imageFsTolerance = 256 << 20
	pidTolerance     = 200
)

// Install as a user would: the chart rendered with the project's AWS values and applied to
// the API server; the DaemonSet controller and the scheduler place the pod on the real node,
// where the kubelet runs it from the imported image. It becomes Ready and serves its metrics.
// The securityContext the API server records is the chart's, and the kernel enforces it on the
// running process (uid, no capabilities, no_new_privs, seccomp, read-only root). Its pressure
// signals, read from its four /proc file mounts, the cgroup tree and the two filesystems,
// equal the host's own figures.
func TestInstallOnRealNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	begin := time.Now()
	ds, p := install(ctx, t)
	t.Logf("the reprieve pod %s ran and was ready %s after the apply", p.Name, time.Since(begin).Round(100*time.Millisecond))

	// The API server's record of the securityContext is what the chart asks for.
	want, got := ds.Spec.Template.Spec, p.Spec
	if want.SecurityContext == nil {
		// The API server defaults an absent pod securityContext to an empty one.
		want.SecurityContext = &v1.PodSecurityContext{}
	}
	if !apiequality.Semantic.DeepEqual(want.SecurityContext, got.SecurityContext) {
		t.Errorf("pod securityContext differs from the chart's:\n%s", diff.Diff(want.SecurityContext, got.SecurityContext))
	}
	if len(got.Containers) != len(want.Containers) {
		t.Fatalf("%d containers, the chart has %d", len(got.Containers), len(want.Containers))
	}
	for i := range want.Containers {
		if !apiequality.Semantic.DeepEqual(want.Containers[i].SecurityContext, got.Containers[i].SecurityContext) {
			t.Errorf("container %s securityContext differs from the chart's:\n%s", want.Containers[i].Name,
				diff.Diff(want.Containers[i].SecurityContext, got.Containers[i].SecurityContext))
		}
	}
	sc := got.Containers[0].SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Fatalf("the chart's securityContext lost runAsNonRoot or readOnlyRootFilesystem: %+v", sc)
	}

	// And the kernel's view of the running process.
	pid := agentProcess(t, string(p.UID))
	status := procStatus(t, pid)
	for field, wantValue := range map[string]string{
		"Uid":        "65532\t65532\t65532\t65532",
		"Gid":        "65532\t65532\t65532\t65532",
		"CapEff":     "0000000000000000",
		"CapPrm":     "0000000000000000",
		"CapBnd":     "0000000000000000",
		"NoNewPrivs": "1",
		"Seccomp":    "2", // filter mode: the runtime's default profile
	} {
		if status[field] != wantValue {
			t.Errorf("the agent's process %d: %s %q, want %q", pid, field, status[field], wantValue)
		}
	}
	if err := os.WriteFile(filepath.Join("/proc", strconv.Itoa(pid), "root", "probe"), nil, 0o644); err == nil {
		t.Errorf("the agent's root filesystem is writable")
	} else if !strings.Contains(err.Error(), "read-only") {
		t.Logf("writing into the agent's root: %v", err)
	}

	// Metrics, and the signals against the host's.
	port := 10271
	var text string
	var lastErr error
	waitFor(ctx, t, 20*time.Second, "the agent's pressure gauges", func() bool {
		text, lastErr = scrape(ctx, p, port)
		_, ok := metric(text, `reprieve_pressure_available_bytes{signal="memory.available"}`)
		return lastErr == nil && ok
	})
	if !strings.Contains(text, "reprieve_build_info{") {
		t.Errorf("no reprieve_build_info in /metrics")
	}
	compareSignals(ctx, t, port)
}

// compareSignals checks each of the agent's signals against the host's own figure, read by the
// test right after the scrape, within the tolerances above; a few scrapes may be needed when
// the machine is busy.
func compareSignals(ctx context.Context, t *testing.T, port int) {
	t.Helper()
	type check struct {
		sample    string
		host      func() (float64, error)
		tolerance float64
	}
	checks := []check{
		{`reprieve_pressure_available_bytes{signal="memory.available"}`, hostMemoryAvailable, memoryTolerance},
		{`reprieve_pressure_available_bytes{signal="nodefs.available"}`, func() (float64, error) { return statfsAvail(node.RootDir, false) }, nodeFsTolerance},
		{`reprieve_pressure_available_inodes{signal="nodefs.inodesFree"}`, func() (float64, error) { return statfsAvail(node.RootDir, true) }, inodeTolerance},
		{`reprieve_pressure_available_bytes{signal="imagefs.available"}`, func() (float64, error) { return statfsAvail(node.ContainerdRoot, false) }, imageFsTolerance},
	}
	// Linux 6.14 made kernel.pid_max a setting of each PID namespace: the agent, in its pod's
	// namespace, reads that namespace's value through its /proc/sys/kernel/pid_max mount, not
	// the host's that the kubelet (in the host's namespace) uses. It takes the kubelet's own
	// limit from the Summary API instead, so pid.available is the host's either way.
	hostMax, nsMax, err := pidMaxes()
	if err != nil {
		t.Fatal(err)
	}
	if hostMax != nsMax {
		t.Logf("this kernel (%s) gives a new PID namespace its own pid_max (%.0f; the host's is %.0f): the agent must take the kubelet's limit", kernelRelease(), nsMax, hostMax)
	}
	checks = append(checks, check{`reprieve_pressure_available_pids{signal="pid.available"}`, func() (float64, error) { return hostPIDAvailable(hostMax) }, pidTolerance})
	pod := agentPod(ctx, t)
	for _, c := range checks {
		var agent, host float64
		ok := false
		for range 5 {
			text, err := scrape(ctx, pod, port)
			if err != nil {
				t.Fatal(err)
			}
			v, found := metric(text, c.sample)
			if !found {
				t.Fatalf("%s not in /metrics", c.sample)
			}
			h, err := c.host()
			if err != nil {
				t.Fatal(err)
			}
			agent, host = v, h
			if math.Abs(agent-host) <= c.tolerance {
				ok = true
				break
			}
			time.Sleep(time.Second)
		}
		t.Logf("%s: agent %.0f, host %.0f, difference %.0f (tolerance %.0f)", c.sample, agent, host, agent-host, c.tolerance)
		if !ok {
			t.Errorf("%s: the agent reads %.0f, the host %.0f: more than %.0f apart", c.sample, agent, host, c.tolerance)
		}
	}
}

// hostMemoryAvailable is memory.available as the kubelet computes it on this host: MemTotal
// from /proc/meminfo less the root memory cgroup's working set (usage less inactive file).
func hostMemoryAvailable() (float64, error) {
	total, err := keyed("/proc/meminfo", "MemTotal:")
	if err != nil {
		return 0, err
	}
	total *= 1024 // kB
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		anon, err1 := keyed("/sys/fs/cgroup/memory.stat", "anon")
		file, err2 := keyed("/sys/fs/cgroup/memory.stat", "file")
		inactive, err3 := keyed("/sys/fs/cgroup/memory.stat", "inactive_file")
		if err1 != nil || err2 != nil || err3 != nil {
			return 0, fmt.Errorf("memory.stat: %v %v %v", err1, err2, err3)
		}
		return total - (anon + file - inactive), nil
	}
	b, err := os.ReadFile("/sys/fs/cgroup/memory/memory.usage_in_bytes")
	if err != nil {
		return 0, err
	}
	usage, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil {
		return 0, err
	}
	inactive, err := keyed("/sys/fs/cgroup/memory/memory.stat", "total_inactive_file")
	if err != nil {
		return 0, err
	}
	return total - (usage - inactive), nil
}

// hostPIDAvailable is pid.available as the kubelet computes it: min(pid_max, threads-max) less
// the task count of /proc/loadavg.
func hostPIDAvailable(pidMax float64) (float64, error) {
	b, err := os.ReadFile("/proc/sys/kernel/threads-max")
	if err != nil {
		return 0, err
	}
	threads, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil {
		return 0, err
	}
	limit := math.Min(pidMax, threads)
	b, err = os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(b))
	_, total, _ := strings.Cut(fields[3], "/")
	tasks, err := strconv.ParseFloat(total, 64)
	if err != nil {
		return 0, err
	}
	return limit - tasks, nil
}

func statfsAvail(dir string, inodes bool) (float64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	if inodes {
		return float64(st.Ffree), nil
	}
	return float64(st.Bavail) * float64(st.Bsize), nil
}

// keyed returns the number after key in a "key value" file.
func keyed(path, key string) (float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == key {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", path, key)
}

// agentProcess finds the host PID of the reprieve process of the pod with uid: a process whose
// command is /reprieve and whose cgroup path names the pod.
func agentProcess(t *testing.T, uid string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.HasPrefix(string(cmd), "/reprieve\x00") {
			continue
		}
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err == nil && (strings.Contains(string(cg), uid) || strings.Contains(string(cg), strings.ReplaceAll(uid, "-", "_"))) {
			return pid
		}
	}
	t.Fatalf("no /reprieve process in the cgroup of pod %s", uid)
	return 0
}

func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// pidMaxes returns kernel.pid_max as this process (in the host's PID namespace) reads it and as a
// process in a new PID namespace reads it.
func pidMaxes() (host, child float64, err error) {
	read := func(b []byte) (float64, error) { return strconv.ParseFloat(strings.TrimSpace(string(b)), 64) }
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		return 0, 0, err
	}
	if host, err = read(b); err != nil {
		return 0, 0, err
	}
	cmd := exec.Command("/bin/cat", "/proc/sys/kernel/pid_max")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	out, err := cmd.Output()
	if err != nil {
		return 0, 0, fmt.Errorf("reading pid_max in a new PID namespace: %w", err)
	}
	child, err = read(out)
	return host, child, err
}

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}
