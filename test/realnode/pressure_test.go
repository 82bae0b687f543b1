package realnode

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/kubelet"
	"github.com/reprieve-dev/reprieve/test/nodeenv"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// Memory figures of the pressure test, in MiB: the kubelet's hard threshold goes hardBelow under
// the machine's memory.available at the start, reprieve's own threshold ownAbove over the hard
// one, and the hog allocates 50 MiB a second up to 2000 MiB, which crosses both even when the
// rest of the machine gives back a gigabyte meanwhile (a shared machine's page cache moves by
// that much: with 1200 MiB a run once never reached reprieve's threshold).
var memoryCase = pressureCase{
	signal: "memory.available", resource: "memory", condition: v1.NodeMemoryPressure, defaultHard: "100Mi",
	available: hostMemoryAvailable, hostMemory: true,
	hardBelow: 900, ownAbove: 600,
	hog: func(ns, out string) *v1.Pod {
		return workloadPod(ns, "hog", out, []string{"alloc", "-out", "/out/hog", "-rate", "50", "-max", "2000"})
	},
}

// The disk figures, in MiB: the kubelet's hard nodefs.available goes hardBelow under the node's
// filesystem's free space at the start, reprieve's ownAbove over it, and the hog writes 25 MiB a
// second up to 640 MiB into an emptyDir, which is on nodefs (the kubelet's root directory); its
// writable layer is on imagefs, a filesystem of its own here.
var nodeFsCase = pressureCase{
	signal: "nodefs.available", resource: "disk", condition: v1.NodeDiskPressure, defaultHard: "1%",
	available: func() (float64, error) { return statfsAvail(node.RootDir, false) },
	hardBelow: 400, ownAbove: 250,
	hog: func(ns, out string) *v1.Pod {
		p := workloadPod(ns, "hog", out, []string{"write", "-out", "/out/hog", "-file", "/scratch/fill", "-rate", "25", "-max", "640"})
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}})
		p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, v1.VolumeMount{Name: "scratch", MountPath: "/scratch"})
		return p
	},
}

// The allocatable figures, in MiB (issue 37 case 1): the kubelet's kube-reserved is set so that
// the pods cgroup's limit (node allocatable) is hardBelow + 100 MiB above what the pods use at the
// start, while the machine's memory.available stays in gigabytes. The kubelet's hard
// allocatableMemory.available is its memory.available one copied (100Mi); reprieve's threshold
// is ownAbove over it. The hog allocates as in the memory case.
var allocatableCase = pressureCase{
	signal: "allocatableMemory.available", resource: "memory", condition: v1.NodeMemoryPressure,
	available: podsCgroupAvailable,
	hardBelow: 900, ownAbove: 600,
	hog:           memoryCase.hog,
	equalPriority: true,
	prefix:        "allocatable",
	configure: func(k *nodeenv.KubeletConfig, hardBelow int64) (int64, error) {
		total, ws, err := podsCgroupUsage()
		if err != nil {
			return 0, err
		}
		const hard = 100 // MiB: memory.available's default, which the kubelet copies
		limit := ws>>20 + hard + hardBelow
		k.EvictionHard["memory.available"] = fmt.Sprintf("%dMi", hard)
		k.KubeReserved = map[string]string{"memory": fmt.Sprintf("%dMi", total>>20-limit)}
		k.EnforceNodeAllocatable = []string{"pods"}
		return hard, nil
	},
	restore: func(k *nodeenv.KubeletConfig) { k.KubeReserved, k.EnforceNodeAllocatable = nil, nil },
}

// podsCgroupUsage is the machine's memory (MemTotal, the kubelet's capacity) and the pods
// cgroup's working set, in bytes, as kubelet.HostSource reads them.
func podsCgroupUsage() (total, workingSet int64, err error) {
	s, err := (&kubelet.HostSource{Root: "/"}).Read(context.Background())
	m, ok := s.Node[kubelet.MemoryAvailable]
	if !ok {
		return 0, 0, fmt.Errorf("memory.available: %v", err)
	}
	o, ok := s.Node[kubelet.AllocatableMemoryAvailable]
	if !ok {
		// No limit yet (the default: kube-reserved unset leaves the pods cgroup at capacity,
		// past the kubelet's unlimited bound only on v2): read the working set from its files.
		dir := "/sys/fs/cgroup/memory/kubepods"
		u, err1 := keyed(dir+"/memory.stat", "total_inactive_file")
		b, err2 := os.ReadFile(dir + "/memory.usage_in_bytes")
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("the pods cgroup: %v %v", err1, err2)
		}
		usage, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		if err != nil {
			return 0, 0, err
		}
		return m.Capacity, int64(usage - u), nil
	}
	return m.Capacity, o.Capacity - o.Available, nil
}

// podsCgroupAvailable is allocatableMemory.available as the kubelet computes it: the pods
// cgroup's limit minus its working set.
func podsCgroupAvailable() (float64, error) {
	s, err := (&kubelet.HostSource{Root: "/"}).Read(context.Background())
	o, ok := s.Node[kubelet.AllocatableMemoryAvailable]
	if !ok {
		return 0, fmt.Errorf("allocatableMemory.available not read (no limit on the pods cgroup?): %v", err)
	}
	return float64(o.Available), nil
}

// terminatingCase is the memory case with a hog already terminating with a 600 s grace.
var terminatingCase = func() pressureCase {
	c := memoryCase
	c.equalPriority, c.terminating, c.prefix = true, true, "terminating"
	return c
}()

// A hog already terminating (issue 37 case 6): deleted by a rollout with a 600 s grace, it goes
// on allocating. Without reprieve the kubelet evicts it at its hard threshold, cutting its grace;
// with reprieve its grace is cut by a DELETE before that, and the kubelet never reaches its
// threshold. The quiet pod, of the same priority, stays.
func TestTerminatingHogOnRealNode(t *testing.T) {
	testPressure(t, terminatingCase)
}

// Real allocatable memory pressure (issue 37 case 1): the pods cgroup reaches the kubelet's
// allocatableMemory.available threshold while memory.available shows gigabytes, as on a node whose
// kube-reserved is larger than what the system uses. With reprieve (its threshold
// allocatableMemory.available<700Mi): taint, then the hog evicted through the Eviction API with
// its 3 s grace, and the kubelet never evicts; without: the kubelet evicts it.
func TestAllocatablePressureOnRealNode(t *testing.T) {
	testPressure(t, allocatableCase)
}

// pressureCase is one signal of the pressure test.
type pressureCase struct {
	// signal is the kubelet's name, resource reprieve's (its taint is reprieve.io/<resource>-pressure),
	// condition the kubelet's node condition, defaultHard the node's usual hard threshold.
	signal, resource string
	condition        v1.NodeConditionType
	defaultHard      string
	// available reads the signal on the host as the kubelet computes it, in bytes.
	available func() (float64, error)
	// hardBelow and ownAbove place the thresholds, in MiB (above).
	hardBelow, ownAbove int64
	// hog is the pod that crosses both thresholds; it records under out/hog.
	hog func(ns, out string) *v1.Pod
	// configure, when set, places the kubelet's threshold itself (from hardBelow) and returns it
	// in MiB, in place of evictionHard[signal] = available - hardBelow; restore undoes what else
	// it changed.
	configure func(k *nodeenv.KubeletConfig, hardBelow int64) (int64, error)
	restore   func(k *nodeenv.KubeletConfig)
	// equalPriority leaves the quiet pod at the hog's priority: then only per-pod usage tells
	// them apart, which the host source reads from the pods' cgroups (issue 37, the host source's
	// ranking), as the kubelet does.
	equalPriority bool
	// prefix names the runs' namespaces (default: resource): each case needs its own, since no
	// namespace controller runs here to finish deleting the last one's.
	prefix string
	// terminating deletes the hog with a 600 s grace as soon as it starts (a rollout), and the
	// hog goes on allocating through it (issue 37 case 6): the kubelet still ranks it, and cuts
	// its grace when it evicts; reprieve must cut it (a DELETE with a shorter grace) before the
	// kubelet's threshold.
	terminating bool
	// daemonSet runs the hog as the pod of a real DaemonSet (issue 37 case 2), hogOutranks gives
	// it a priority above the quiet pod's: then priority alone would pick the quiet pod, and only
	// per-pod usage (the hog above its request, the quiet pod within it) picks the hog, as the
	// kubelet's rankMemoryPressure does.
	daemonSet, hogOutranks bool
	// hostMemory: the signal is the host's memory.available, which the rest of the machine
	// moves too (runQuietly).
	hostMemory bool
	// hogRequest is the hog's memory request (none when empty), hogGrace its grace (3 s when 0);
	// keepOnTerm makes it go on allocating after SIGTERM until it is killed, so that the time
	// from its SIGTERM to its end is the grace it was given.
	hogRequest string
	hogGrace   int64
	keepOnTerm bool
	// soft: the kubelet's threshold placed by configure is an evictionSoft one (issue 37 case 3):
	// it evicts once the threshold has held for its grace period, with
	// min(evictionMaxPodGracePeriod, the pod's grace) = softPodGrace; reprieve must do the same,
	// before it. window bounds each run's watch (60 s when 0).
	soft         bool
	softPodGrace int64
	window       time.Duration
	// figures names the run's files in REPRIEVE_REALNODE_FIGURES (default: the signal), title
	// the case in the chart when another case has its signal.
	figures, title string
}

func (c pressureCase) taintKey() string { return "reprieve.io/" + c.resource + "-pressure" }

// The moments of a run, in the order of the side-by-side table.
const (
	momentOwnCrossed = "reprieve's threshold crossed (the host's reading)"
	momentTaint      = "reprieve's taint on the node"
	momentSIGTERM    = "SIGTERM in the hog"
	momentGone       = "the hog's process gone"
	momentCondition  = "the kubelet's pressure condition"
	momentHard       = "the kubelet's hard threshold reached (lowest reading)"
	// momentCut is when the terminating hog's grace is seen cut below its 600 s (the API's
	// deletionGracePeriodSeconds): by reprieve's DELETE, or by the kubelet's eviction.
	momentCut = "the terminating hog's grace cut (the API)"
)

// pressureEvent is one moment of a pressure run, in seconds from the hog's start.
type pressureEvent struct {
	what string
	at   time.Duration
}

// Real memory pressure against the real kubelet, twice. The kubelet's evictionHard
// memory.available goes just under the machine's free memory; a pod allocating 50 MiB a second
// crosses it, beside a quiet pod within its request (the kubelet ranks the hog first: above its
// zero request).
//   - with reprieve (its threshold 600 MiB above the kubelet's: 12 s ahead at that rate, more
//     than the hog's 3 s grace and the 5 s margin): it taints the node first, then
//     evicts the hog through the Eviction API with its own 3 s grace before the hard threshold,
//     and the kubelet never evicts;
//   - without reprieve: the kubelet evicts the hog itself at its hard threshold.
//
// Both timelines are logged side by side.
func TestMemoryPressureOnRealNode(t *testing.T) {
	testPressure(t, memoryCase)
}

// The same for nodefs.available against the real kubelet: its evictionHard nodefs.available
// goes 400 MiB under the free space of the kubelet's root filesystem, and a pod writing 25 MiB
// a second into an emptyDir crosses it, beside the quiet pod (the kubelet ranks nodefs by local
// volumes and logs with a dedicated imagefs, as here: the writer first). reprieve's threshold
// is 250 MiB above the kubelet's, 10 s ahead at that rate. The kubelet has no kernel
// notification for disk: it sees the crossing at its next 10 s pass.
func TestNodeFsPressureOnRealNode(t *testing.T) {
	testPressure(t, nodeFsCase)
}

func testPressure(t *testing.T, c pressureCase) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	ensureInstalled(ctx, t)
	defer func() {
		// Back to the default thresholds and the default install for whatever runs next.
		_ = node.RestartKubelet(context.Background(), func(k *nodeenv.KubeletConfig) {
			if c.defaultHard != "" {
				k.EvictionHard[c.signal] = c.defaultHard
			}
			if c.restore != nil {
				c.restore(k)
			}
		})
	}()
	timeline := scenario.PressureSignal{Signal: c.signal, Case: c.title, OwnAboveMiB: float64(c.ownAbove)}
	if c.soft {
		timeline.Threshold = "soft"
	}
	with, runWith := runQuietly(ctx, t, c, "with-reprieve", true)
	without, runWithout := runQuietly(ctx, t, c, "without-reprieve", false)
	timeline.Runs = []scenario.PressureRun{runWith, runWithout}
	var rows []string
	rows = append(rows, "| moment | with reprieve | without reprieve |", "|---|---|---|")
	find := func(evs []pressureEvent, what string) string {
		for _, e := range evs {
			if e.what == what {
				return fmt.Sprintf("%.1f s", e.at.Seconds())
			}
		}
		return "never"
	}
	moments := []string{momentOwnCrossed, momentTaint, momentSIGTERM, momentGone, momentCondition, momentHard}
	if c.soft {
		moments = []string{momentOwnCrossed, momentTaint, momentHard, momentCondition, momentSIGTERM, momentGone}
	}
	if c.terminating {
		moments = []string{momentSIGTERM, momentOwnCrossed, momentTaint, momentCut, momentHard, momentCondition, momentGone}
	}
	for _, k := range moments {
		label := k
		if k == momentCondition {
			label = "the kubelet's " + string(c.condition) + " condition"
		}
		if k == momentHard && c.soft {
			label = "the kubelet's soft threshold crossed (the host's reading)"
		}
		rows = append(rows, fmt.Sprintf("| %s | %s | %s |", label, find(with, k), find(without, k)))
	}
	t.Logf("%s pressure, seconds from the hog's start:\n%s", c.signal, strings.Join(rows, "\n"))
	name := c.figures
	if name == "" {
		name = c.signal
	}
	writeFigures(t, name, strings.Join(rows, "\n"))
	writeTimeline(t, timeline, name)
}

// pressureRun is one run; attempt is 2 when runQuietly runs it again (in a namespace of its own,
// since the first one's is never finished deleting, and its pods' record files stay).
func pressureRun(ctx context.Context, t *verdict, c pressureCase, name string, withReprieve bool, attempt int) ([]pressureEvent, scenario.PressureRun) {
	t.Helper()
	t.from = time.Now() // the thresholds are placed from the signal as it is now
	var hard int64
	if c.configure == nil {
		avail, err := c.available()
		if err != nil {
			t.Fatal(err)
		}
		hard = int64(avail)>>20 - c.hardBelow
	}
	var confErr error
	if err := node.RestartKubelet(ctx, func(k *nodeenv.KubeletConfig) {
		if c.configure != nil {
			hard, confErr = c.configure(k, c.hardBelow)
			return
		}
		k.EvictionHard[c.signal] = fmt.Sprintf("%dMi", hard)
	}); err != nil || confErr != nil {
		t.Fatal(err, confErr)
	}
	waitNoPressure(ctx, t.T, c.condition)
	if withReprieve {
		install(ctx, t.T, "--set", fmt.Sprintf("pressure.thresholds=%s<%dMi", c.signal, hard+c.ownAbove))
	} else {
		uninstall(ctx, t.T)
	}
	clearPressureTaint(ctx, t.T, c.taintKey())
	prefix := c.prefix
	if prefix == "" {
		prefix = c.resource
	}
	ns := prefix + "-" + name
	if attempt > 1 {
		ns += fmt.Sprintf("-%d", attempt)
	}
	createNamespace(ctx, t.T, ns)
	out := filepath.Join(outDir, ns)
	// The hog's pod and the folder it records in (a DaemonSet's pod records under its own name).
	hogName, hogDir := "hog", filepath.Join(out, "hog")
	// Leave no pressure behind, whatever happens: the pods go (no namespace controller runs
	// here), with their emptyDirs, and the taint of an agent that is uninstalled next. A pod left
	// running would be a candidate of the next run.
	defer func() {
		ctx := context.Background()
		zero := int64(0)
		if withReprieve && len(t.failures) > 0 {
			// The next install replaces the agent's pod, and its log goes with it.
			keepAgentLogs(t.T)
		}
		if c.daemonSet {
			// First the DaemonSet, or its controller puts the pods back (no garbage collector
			// runs here to delete them with it).
			_ = env.Client.AppsV1().DaemonSets(ns).Delete(ctx, "hog", metav1.DeleteOptions{})
		}
		_ = env.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		clearPressureTaint(ctx, t.T, c.taintKey())
		waitFor(ctx, t.T, 60*time.Second, "the pods of "+ns+" gone", func() bool {
			list, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			return err == nil && len(list.Items) == 0
		})
		if c.terminating {
			// The API object goes at once, but a container the node is stopping with 600 s is
			// not cut short (see the assertions below): a restart of the kubelet kills it, and
			// the next run must not start while it still holds its memory.
			_ = node.RestartKubelet(ctx, func(*nodeenv.KubeletConfig) {})
			waitFor(ctx, t.T, 90*time.Second, "the terminating hog's process gone", func() bool {
				last, ok := readMillis(hogDir, "alive")
				return !ok || time.Since(last) > 2*time.Second
			})
		}
	}()
	// The quiet pod is within its memory request and uses nothing on nodefs, so the kubelet
	// picks the hog first on usage. The host source reads per-pod memory but no per-pod disk:
	// for nodefs it ranks by priority alone (equal priorities in the informer's order, a map's),
	// so in the memory and disk cases the quiet pod has the higher priority and the hog is the
	// first pick either way; with equalPriority, or hogOutranks (the hog's priority the higher),
	// only per-pod usage picks the hog.
	quiet := workloadPod(ns, "quiet", out, []string{"term", "-out", "/out/quiet"})
	quiet.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}
	if !c.equalPriority && !c.hogOutranks {
		quiet.Spec.PriorityClassName = quietPriority(ctx, t.T)
	}
	if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, quiet, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hog := c.hog(ns, out)
	hog.Spec.TerminationGracePeriodSeconds = ptrTo(cmp.Or(c.hogGrace, 3))
	if c.hogRequest != "" {
		hog.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse(c.hogRequest)}
	}
	if c.hogOutranks {
		hog.Spec.PriorityClassName = quietPriority(ctx, t.T)
	}
	if c.terminating {
		hog.Spec.TerminationGracePeriodSeconds = ptrTo[int64](600)
	}
	if c.terminating || c.keepOnTerm {
		hog.Spec.Containers[0].Args = append(hog.Spec.Containers[0].Args, "-keep-on-term")
	}
	// The waits for the hog go through the verdict: a machine whose other work takes memory
	// before the hog starts crosses reprieve's threshold with the quiet pod alone, and
	// reprieve's taint then keeps a DaemonSet from placing its pod (2026-12-06 10:14, a cold
	// build beside: reprieve put its taint back 30 ms after the test took it off, for a
	// minute). Such a run is one to run again, like one disturbed later.
	if c.daemonSet {
		if hogName = runDaemonSet(ctx, t, hog); hogName == "" {
			t.to = time.Now()
			return nil, scenario.PressureRun{}
		}
		hogDir = filepath.Join(out, hogName)
	} else if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, hog, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !t.waitFor(ctx, 60*time.Second, "the hog started", func() bool {
		_, ok := readMillis(hogDir, "started")
		return ok
	}) {
		t.to = time.Now()
		return nil, scenario.PressureRun{}
	}
	start, _ := readMillis(hogDir, "started")
	if c.terminating {
		// The rollout's delete, with the pod's whole grace.
		if err := env.Client.CoreV1().Pods(ns).Delete(ctx, hogName, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](600)}); err != nil {
			t.Fatal(err)
		}
	}
	cutTo, evictGrace := int64(600), int64(-1)
	run := scenario.PressureRun{Name: strings.ReplaceAll(name, "-", " "), HardMiB: float64(hard)}
	var evs []pressureEvent
	seen := map[string]bool{}
	once := func(what string, at time.Time) {
		if !seen[what] {
			seen[what] = true
			evs = append(evs, pressureEvent{what, at.Sub(start)})
			run.Moments = append(run.Moments, scenario.PressureMoment{What: what, At: round(at.Sub(start).Seconds(), 100)})
		}
	}
	hardBytes := float64(hard << 20)
	ownBytes := float64((hard + c.ownAbove) << 20)
	var evictedBy string
	var kubeletAt time.Time      // a terminating hog's control: when the kubelet's eviction was seen
	firstAt := time.Duration(-1) // the first reading's time
	deadline := time.Now().Add(cmp.Or(c.window, 60*time.Second))
	for time.Now().Before(deadline) {
		now := time.Now()
		if a, err := c.available(); err == nil {
			if firstAt < 0 {
				firstAt = now.Sub(start)
			}
			run.Samples = append(run.Samples, scenario.PressureSample{At: round(now.Sub(start).Seconds(), 100), AvailableMiB: round(a/(1<<20), 10)})
			if a < ownBytes {
				once(momentOwnCrossed, now)
			}
			if a < hardBytes {
				once(momentHard, now)
			}
		}
		if n, err := env.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); err == nil {
			for _, tt := range n.Spec.Taints {
				if tt.Key == c.taintKey() {
					once(momentTaint, now)
				}
			}
			for _, cond := range n.Status.Conditions {
				if cond.Type == c.condition && cond.Status == v1.ConditionTrue {
					once(momentCondition, now)
				}
			}
		}
		if p, err := env.Client.CoreV1().Pods(ns).Get(ctx, hogName, metav1.GetOptions{}); err == nil && p.DeletionGracePeriodSeconds != nil {
			cutTo = min(cutTo, *p.DeletionGracePeriodSeconds)
			if evictGrace < 0 {
				evictGrace = *p.DeletionGracePeriodSeconds // the first grace the API recorded
			}
			if cutTo < 600 && c.terminating {
				once(momentCut, now)
			}
		}
		if p, err := env.Client.CoreV1().Pods(ns).Get(ctx, hogName, metav1.GetOptions{}); err == nil && evictedBy == "" {
			if p.Status.Reason == "Evicted" {
				evictedBy = "the kubelet (" + p.Status.Message + ")"
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == v1.DisruptionTarget && cond.Status == v1.ConditionTrue {
					evictedBy = cond.Reason + ": " + cond.Message
				}
			}
		}
		if term, ok := readMillis(hogDir, "sigterm"); ok {
			once(momentSIGTERM, term)
		}
		if _, ok := readMillis(hogDir, "sigterm"); ok {
			if last, ok := readMillis(hogDir, "alive"); ok && time.Since(last) > time.Second {
				once(momentGone, last)
				break
			}
		}
		if c.terminating && !withReprieve && seen[momentHard] {
			// The control of a terminating hog: its process outlives the kubelet's eviction
			// (see the assertions below), so the run would last its whole window. It ends
			// terminatingStays after the kubelet's eviction, with its condition reported: a
			// process the eviction had killed would be gone within a second or two.
			if kubeletAt.IsZero() && (strings.Contains(evictedBy, "TerminationByKubelet") || kubeletEvictedEvent(ctx, ns, hogName) != "") {
				kubeletAt = now
			}
			if !kubeletAt.IsZero() && seen[momentCondition] && now.Sub(kubeletAt) >= terminatingStays {
				break
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.to = time.Now()
	if evictedBy == "" {
		// Gone before a poll saw its status: a DaemonSet's controller deletes its pod as soon
		// as the kubelet has failed it. The kubelet's Evicted event on the pod outlives it.
		if by := kubeletEvictedEvent(ctx, ns, hogName); by != "" {
			evictedBy = by + " (the kubelet's Evicted event)"
		}
	}
	run.EvictedBy = evictedBy
	t.Logf("%s, %s: kubelet hard threshold %d MiB, reprieve's %d MiB; the hog evicted by %s; its grace cut to %d s; events %v",
		c.signal, name, hard, hard+c.ownAbove, evictedBy, cutTo, evs)
	if !seen[momentSIGTERM] {
		t.Errorf("%s: the hog was never evicted", name)
		return evs, run
	}
	if c.terminating {
		// Its SIGTERM is the rollout's. What reprieve controls is the cut: a DELETE with a
		// shorter grace before the kubelet's threshold. Whether the node then kills the container
		// sooner is the kubelet's and the runtime's: on this node (the kubelet v1.37.2,
		// containerd 1.6.20) a StopContainer already running with 600 s is not cut short, by
		// reprieve's DELETE or by the kubelet's own eviction ("timeout waiting to kill pod"), so
		// gone is only logged (docs/benchmarks.md).
		if withReprieve {
			t.Logf("%s: the terminating hog gone within the run's %s: %v", name, cmp.Or(c.window, 60*time.Second), seen[momentGone])
		} else {
			t.Logf("%s: the terminating hog gone within %s of the kubelet's eviction: %v", name, terminatingStays, seen[momentGone])
		}
		if withReprieve {
			cut, hardAt := -1.0, -1.0
			for _, e := range evs {
				switch e.what {
				case momentCut:
					cut = e.at.Seconds()
				case momentHard:
					hardAt = e.at.Seconds()
				}
			}
			if cut < 0 {
				t.Errorf("with reprieve: the terminating hog's grace was never cut")
			} else if hardAt >= 0 && cut > hardAt {
				t.Errorf("with reprieve: the grace cut at %.1f s, after the kubelet's threshold at %.1f s", cut, hardAt)
			}
			if q, err := env.Client.CoreV1().Pods(ns).Get(ctx, "quiet", metav1.GetOptions{}); err == nil && q.DeletionTimestamp != nil {
				t.Errorf("with reprieve: the quiet pod was evicted; the kubelet would have taken the terminating hog")
			}
		}
		return evs, run
	}
	if c.soft {
		checkSoft(ctx, t, c, ns, name, withReprieve, evs, evictedBy, evictGrace, firstAt)
		return evs, run
	}
	if c.daemonSet {
		checkDaemonSet(ctx, t, c, ns, name, withReprieve, hogName, evictGrace, evs)
	}
	if withReprieve {
		if !seen[momentTaint] {
			t.Errorf("with reprieve: no %s taint", c.taintKey())
		}
		if seen[momentCondition] {
			t.Errorf("with reprieve: the kubelet reached its own hard threshold and reported %s", c.condition)
		}
		if !strings.Contains(evictedBy, "EvictionByEvictionAPI") {
			t.Errorf("with reprieve: the hog was evicted by %q, want the Eviction API (reprieve)", evictedBy)
		}
		// reprieve evicts in rank order until the pods' usage covers the shortfall to its
		// threshold plus the minimum reclaim: on a busy machine that can take the quiet pod too.
		if q, err := env.Client.CoreV1().Pods(ns).Get(ctx, "quiet", metav1.GetOptions{}); err == nil && q.DeletionTimestamp != nil {
			if c.equalPriority || c.hogOutranks {
				// Same priority, or the hog's higher: the host source's per-pod working sets rank
				// the hog first, and the kubelet's need (its hard threshold plus the minimum
				// reclaim) is the hog's.
				t.Errorf("with reprieve: the quiet pod was evicted; the kubelet would have taken the hog alone")
			} else {
				t.Logf("with reprieve: the quiet pod was evicted too (the shortfall was larger than the hog's usage)")
			}
		}
	} else if !strings.Contains(evictedBy, "TerminationByKubelet") {
		t.Errorf("without reprieve: the hog was evicted by %q, want the kubelet", evictedBy)
	}
	return evs, run
}

// terminatingStays is how long the control run of a terminating hog goes on after the kubelet's
// eviction, to see that its process stays.
const terminatingStays = 10 * time.Second

// quietPriority creates (once) a PriorityClass of 1000 and returns its name: above the default 0,
// for the quiet pod of the memory and disk cases, or for the hog where it outranks the quiet pod.
func quietPriority(ctx context.Context, t *testing.T) string {
	t.Helper()
	const name = "realnode-quiet"
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: 1000,
		Description: "the real node's pressure tests: a pod above the default priority"}
	if _, err := env.Client.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return name
}

// round rounds x to 1/per (per 100: hundredths), to keep the timelines' JSON short.
func round(x, per float64) float64 { return math.Round(x*per) / per }

// waitNoPressure waits until the kubelet does not report the condition.
func waitNoPressure(ctx context.Context, t *testing.T, condition v1.NodeConditionType) {
	t.Helper()
	waitFor(ctx, t, 60*time.Second, "no "+string(condition)+" on the node", func() bool {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range n.Status.Conditions {
			if c.Type == condition {
				return c.Status != v1.ConditionTrue
			}
		}
		return true
	})
}

// clearPressureTaint removes reprieve's pressure taint key, which an agent takes off only a
// transition period after the pressure ends, and an uninstalled one never.
func clearPressureTaint(ctx context.Context, t *testing.T, key string) {
	t.Helper()
	n, err := env.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var keep []v1.Taint
	for _, tt := range n.Spec.Taints {
		if tt.Key != key {
			keep = append(keep, tt)
		}
	}
	if len(keep) == len(n.Spec.Taints) {
		return
	}
	n.Spec.Taints = keep
	if _, err := env.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
