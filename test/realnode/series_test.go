package realnode

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/reprieve-dev/reprieve/agent/pressure/replay"
	"github.com/reprieve-dev/reprieve/kubelet"
	"github.com/reprieve-dev/reprieve/test/nodeenv"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// seriesCase is one run of the real node recorded as a series of agent/pressure/replay
// (issue 47): the kubelet configured for it, its pods, and what the source read every second,
// with no reprieve on the node, so that the series' label is what the kubelet itself did.
type seriesCase struct {
	name, desc string
	// configure places the kubelet's thresholds from the machine's memory.available (MiB) when
	// the run starts and returns reprieve's --pressure-thresholds for the replay ("" derives
	// them, as the chart does); restore undoes it.
	configure func(k *nodeenv.KubeletConfig, availMiB int64) (thresholds string, err error)
	restore   func(k *nodeenv.KubeletConfig)
	// pods are the pods (and DaemonSets) the run creates in ns, recording under out.
	pods func(ctx context.Context, t *testing.T, ns, out string) []seriesPod
	// length bounds the recording; it ends 20 s after the kubelet's last eviction of a falling
	// run (falling: the run is meant to end in the kubelet's eviction).
	length  time.Duration
	falling bool
	// summary reads the Summary API (per-pod disk, imageFs.usedBytes) instead of the host.
	summary bool
	// prepare runs before the kubelet restarts for the run (images pulled before: the kubelet
	// detects them at its start); during runs beside the recording (image pulls), until ctx ends.
	prepare func(ctx context.Context, t *testing.T)
	during  func(ctx context.Context, t *testing.T)
	// diskSignal is the run's disk signal, which the kubelet's eviction message does not name
	// ("ephemeral-storage").
	diskSignal kubelet.Signal
	// soft is the kubelet's soft eviction grace when the run's threshold is a soft one.
	soft int64
}

// seriesPod is one of a run's pods as the replay knows it.
type seriesPod struct {
	pod       *v1.Pod
	daemonSet bool
}

// healthyKubelet places memory.available's hard threshold belowMiB under the machine's at the
// start, so that the workload comes within reprieve's derived threshold (the kubelet's plus 5%
// of the machine's 24 GiB, 1229 MiB) and stays 700 MiB or more above the kubelet's; reprieve's
// thresholds are derived, as the chart runs it.
func healthyKubelet(belowMiB int64) func(*nodeenv.KubeletConfig, int64) (string, error) {
	return func(k *nodeenv.KubeletConfig, avail int64) (string, error) {
		k.EvictionHard["memory.available"] = fmt.Sprintf("%dMi", avail-belowMiB)
		return "", nil
	}
}

func restoreMemory(k *nodeenv.KubeletConfig) { k.EvictionHard["memory.available"] = "100Mi" }

// onePod is a run of the quiet pod and one workload pod named name with args.
func onePod(name string, grace int64, args ...string) func(context.Context, *testing.T, string, string) []seriesPod {
	return func(_ context.Context, _ *testing.T, ns, out string) []seriesPod {
		quiet := workloadPod(ns, "quiet", out, []string{"term", "-out", "/out/quiet"})
		quiet.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}
		p := workloadPod(ns, name, out, append([]string{args[0], "-out", "/out/" + name}, args[1:]...))
		p.Spec.TerminationGracePeriodSeconds = ptrTo(grace)
		return []seriesPod{{pod: quiet}, {pod: p}}
	}
}

// withScratch gives a pod an emptyDir on disk at /scratch (on nodefs).
func withScratch(p *v1.Pod) *v1.Pod {
	p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}})
	p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, v1.VolumeMount{Name: "scratch", MountPath: "/scratch"})
	return p
}

// fromPressureCase is one of the pressure tests' cases, recorded without reprieve: the kubelet
// configured as that test configures it, its quiet pod and hog, and reprieve's threshold as that
// test installs it.
func fromPressureCase(name, desc string, c pressureCase) seriesCase {
	return seriesCase{name: name, desc: desc, falling: true, length: cmp.Or(c.window, 60*time.Second) + 30*time.Second,
		configure: func(k *nodeenv.KubeletConfig, avail int64) (string, error) {
			var hard int64
			if c.configure != nil {
				var err error
				if hard, err = c.configure(k, c.hardBelow); err != nil {
					return "", err
				}
			} else {
				a, err := c.available()
				if err != nil {
					return "", err
				}
				hard = int64(a)>>20 - c.hardBelow
				k.EvictionHard[c.signal] = fmt.Sprintf("%dMi", hard)
			}
			return fmt.Sprintf("%s<%dMi", c.signal, hard+c.ownAbove), nil
		},
		restore: func(k *nodeenv.KubeletConfig) {
			if c.defaultHard != "" {
				k.EvictionHard[c.signal] = c.defaultHard
			}
			if c.restore != nil {
				c.restore(k)
			}
		},
		soft: map[bool]int64{true: c.softPodGrace}[c.soft],
		pods: func(ctx context.Context, t *testing.T, ns, out string) []seriesPod {
			quiet := workloadPod(ns, "quiet", out, []string{"term", "-out", "/out/quiet"})
			quiet.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse("64Mi")}
			if !c.equalPriority && !c.hogOutranks {
				quiet.Spec.PriorityClassName = quietPriority(ctx, t)
			}
			hog := c.hog(ns, out)
			hog.Spec.TerminationGracePeriodSeconds = ptrTo(cmp.Or(c.hogGrace, 3))
			if c.hogRequest != "" {
				hog.Spec.Containers[0].Resources.Requests = v1.ResourceList{v1.ResourceMemory: resource.MustParse(c.hogRequest)}
			}
			if c.hogOutranks {
				hog.Spec.PriorityClassName = quietPriority(ctx, t)
			}
			if c.keepOnTerm {
				hog.Spec.Containers[0].Args = append(hog.Spec.Containers[0].Args, "-keep-on-term")
			}
			return []seriesPod{{pod: quiet}, {pod: hog, daemonSet: c.daemonSet}}
		}}
}

// seriesCases are the runs of the corpus: healthy ones (the kubelet evicts nobody) and falling
// ones (it evicts).
var seriesCases = []seriesCase{
	{name: "realnode-step-kept", desc: "a pod takes 800 MiB at once and keeps it, 1.1 GiB above the kubelet's memory.available",
		configure: healthyKubelet(1900), restore: restoreMemory, length: 3 * time.Minute,
		pods: func(ctx context.Context, t *testing.T, ns, out string) []seriesPod {
			ps := onePod("jvm", 30, "term")(ctx, t, ns, out)
			// The step: the whole 800 MiB within a second, 30 s in.
			step := workloadPod(ns, "model", out, []string{"alloc", "-out", "/out/model", "-rate", "8000", "-max", "800", "-start-after", "30s"})
			step.Spec.TerminationGracePeriodSeconds = ptrTo[int64](30)
			return append(ps, seriesPod{pod: step})
		}},
	{name: "realnode-gc-sawtooth", desc: "a pod's heap grows 50 MiB/s to 1000 MiB and is freed at once, again and again",
		configure: healthyKubelet(1700), restore: restoreMemory, length: 4 * time.Minute,
		pods: onePod("jvm", 30, "sawtooth", "-rate", "50", "-max", "1000", "-hold", "2s")},
	{name: "realnode-page-cache", desc: "a pod writes a 1500 MiB file into an emptyDir and reads it twice (active page cache), holds it a minute, deletes it; every three minutes",
		configure: healthyKubelet(2200), restore: restoreMemory, length: 5 * time.Minute,
		pods: func(ctx context.Context, t *testing.T, ns, out string) []seriesPod {
			ps := onePod("reader", 30, "pagecache", "-file", "/scratch/big", "-size", "1500", "-hold", "60s", "-every", "3m")(ctx, t, ns, out)
			withScratch(ps[1].pod)
			return ps
		}},
	{name: "realnode-jitter", desc: "a pod holds 1200 MiB and takes or gives back up to 60 MiB every 250 ms",
		configure: healthyKubelet(2300), restore: restoreMemory, length: 4 * time.Minute,
		pods: onePod("cache", 30, "jitter", "-base", "1200", "-amp", "60")},
	{name: "realnode-image-gc", desc: "a 3 GiB imagefs of its own holds 2.2 GiB of unused images when the kubelet starts; a pull of 100 MiB every 20 s takes it past 85%, where the kubelet's reclaim at imagefs.available<15% and its image GC (85%/80%) delete the older ones",
		summary: true, length: 8 * time.Minute, diskSignal: kubelet.ImageFsAvailable,
		configure: func(k *nodeenv.KubeletConfig, _ int64) (string, error) {
			imageGCKubelet(k)
			return "", nil
		},
		restore: restoreImageGC,
		pods:    onePod("web", 30, "term"),
		prepare: prefillImages,
		during:  func(ctx context.Context, t *testing.T) { pullImages(ctx, t, 100, 20*time.Second) }},
	fromPressureCase("realnode-leak", "a pod allocating 50 MiB/s to 2000 MiB beside a quiet pod (TestMemoryPressureOnRealNode)", memoryCase),
	fromPressureCase("realnode-daemonset-leak", "a DaemonSet's pod leaking past its request, of a higher priority than the web pod (TestDaemonSetLeakOnRealNode)", daemonSetCase),
	fromPressureCase("realnode-soft", "a soft threshold held 15 s, evictionMaxPodGracePeriod 4 (TestSoftThresholdOnRealNode)", softCase),
	fromPressureCase("realnode-allocatable", "the pods cgroup reaching allocatableMemory.available (TestAllocatablePressureOnRealNode)", allocatableCase),
	{name: "realnode-step-then-leak", desc: "a pod takes 800 MiB at once, then 20 s later leaks 50 MiB/s", falling: true,
		configure: func(k *nodeenv.KubeletConfig, avail int64) (string, error) {
			hard := avail - 1700
			k.EvictionHard["memory.available"] = fmt.Sprintf("%dMi", hard)
			return fmt.Sprintf("memory.available<%dMi", hard+600), nil
		},
		restore: restoreMemory, length: 2 * time.Minute,
		pods: onePod("hog", 3, "alloc", "-rate", "50", "-max", "3000", "-step", "800", "-start-after", "20s")},
	// The kubelet's threshold 2900 MiB under the machine's: big takes 700 MiB at once, leak
	// grows 50 MiB/s from 15 s and meets the threshold at about 2200 MiB, three times big's; 36 s
	// before (where a 30 s pod is due) it used 400 MiB, under big's 700. reprieve's threshold
	// 2000 MiB above the kubelet's, 40 s ahead at that pace.
	{name: "realnode-two-pods", desc: "one pod leaking 50 MiB/s beside one holding 700 MiB, both of 30 s: where the kubelet's threshold is met the leaking one uses three times more; 36 s before, less", falling: true,
		configure: func(k *nodeenv.KubeletConfig, avail int64) (string, error) {
			hard := avail - 2900
			k.EvictionHard["memory.available"] = fmt.Sprintf("%dMi", hard)
			return fmt.Sprintf("memory.available<%dMi", hard+2000), nil
		},
		restore: restoreMemory, length: 2 * time.Minute,
		pods: func(ctx context.Context, t *testing.T, ns, out string) []seriesPod {
			big := workloadPod(ns, "big", out, []string{"alloc", "-out", "/out/big", "-rate", "700", "-max", "700"})
			leak := workloadPod(ns, "leak", out, []string{"alloc", "-out", "/out/leak", "-rate", "50", "-max", "4000", "-start-after", "15s"})
			big.Spec.TerminationGracePeriodSeconds, leak.Spec.TerminationGracePeriodSeconds = ptrTo[int64](30), ptrTo[int64](30)
			return []seriesPod{{pod: big}, {pod: leak}}
		}},
}

// imageGCKubelet is the kubelet of the image GC runs: its defaults for the disk (nodefs 10%,
// imagefs 15%, image GC from 85% down to 80%), an image old enough to collect 10 s after the
// kubelet first saw it. The kubelet sees an image at its start, at its image GC every 5
// minutes, and when it reclaims (detectImages, pkg/kubelet/images): one pulled since is new
// there, not collected, and a pull of several that fills the disk between two of those makes
// it evict pods (the first recording of this run did: imagefs filled by 200 MiB every 10 s).
func imageGCKubelet(k *nodeenv.KubeletConfig) {
	k.EvictionHard["nodefs.available"] = "10%"
	k.EvictionHard["imagefs.available"] = "15%"
	k.ImageGCHighThresholdPercent, k.ImageGCLowThresholdPercent = ptrTo[int32](85), ptrTo[int32](80)
	k.ImageMinimumGCAge = metav1.Duration{Duration: 10 * time.Second}
}

// prefillImages pulls unused images until the image filesystem is 73% used, before the kubelet
// starts (it sees them then): a node that ran other pods' images before.
func prefillImages(ctx context.Context, t *testing.T) {
	for i := 0; ctx.Err() == nil; i++ {
		free, err1 := statfsAvail(node.ContainerdRoot, false)
		size, err2 := statfsSize(node.ContainerdRoot)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if 1-free/size >= 0.73 {
			return
		}
		if err := node.ImportFiller(ctx, fmt.Sprintf("reprieve.test/old-%d:1", i), 200); err != nil {
			t.Fatal(err)
		}
	}
}

func restoreImageGC(k *nodeenv.KubeletConfig) {
	k.EvictionHard["nodefs.available"], k.EvictionHard["imagefs.available"] = "1%", "1%"
	k.ImageGCHighThresholdPercent, k.ImageGCLowThresholdPercent = ptrTo[int32](100), ptrTo[int32](99)
	k.ImageMinimumGCAge = metav1.Duration{}
}

// pullImages imports an image of sizeMiB every interval (a node pulling its pods' images) until
// ctx ends, as long as the image filesystem has room for it; the kubelet's garbage collection is
// left to free them.
func pullImages(ctx context.Context, t *testing.T, sizeMiB int, every time.Duration) {
	for i := 0; ctx.Err() == nil; i++ {
		avail, err := statfsAvail(node.ContainerdRoot, false)
		if err == nil && avail > float64(2*sizeMiB)*(1<<20) {
			if err := node.ImportFiller(ctx, fmt.Sprintf("reprieve.test/filler-%d:1", i), sizeMiB); err != nil && ctx.Err() == nil {
				t.Logf("pulling filler %d: %v", i, err)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(every):
		}
	}
}

// TestRecordPressureSeries records the corpus's real series (seriesCases) without reprieve, into
// $REPRIEVE_RECORD_SERIES (the corpus itself with "testdata": agent/pressure/replay/testdata),
// those whose name matches $REPRIEVE_RECORD_ONLY (all when empty). Not in make test: each run is
// minutes long (make record-series; docs/benchmarks.md). It needs the image filesystem of its own
// that REPRIEVE_RECORD_SERIES gives the node (TestMain).
func TestRecordPressureSeries(t *testing.T) {
	dir := os.Getenv("REPRIEVE_RECORD_SERIES")
	if dir == "" {
		t.Skip("set REPRIEVE_RECORD_SERIES to the folder to record the pressure series into (testdata: the corpus's own)")
	}
	if dir == "testdata" {
		root, err := testenv.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, replay.TestdataDir)
	}
	only := regexp.MustCompile(os.Getenv("REPRIEVE_RECORD_ONLY"))
	for _, c := range seriesCases {
		if !only.MatchString(c.name) {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			s := recordSeries(t, c, false)
			if err := s.Save(filepath.Join(dir, s.Name+".json.gz")); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d readings over %s, the kubelet evicted %+v", s.Name, len(s.Readings), s.Duration(), s.KubeletEvictions)
			if c.falling != (len(s.KubeletEvictions) > 0) {
				t.Errorf("%s: the kubelet evicted %+v, want a falling run: %v (the machine's other work moves its memory: run it again)", c.name, s.KubeletEvictions, c.falling)
			}
		})
	}
}

// recordSeries runs c on the real node and returns its series; with reprieve (the soak) it
// keeps the agent installed as it is.
func recordSeries(t *testing.T, c seriesCase, withReprieve bool) *replay.Series {
	ctx, cancel := context.WithTimeout(context.Background(), c.length+4*time.Minute)
	defer cancel()
	if !withReprieve {
		uninstall(ctx, t)
	}
	avail, err := hostMemoryAvailable()
	if err != nil {
		t.Fatal(err)
	}
	if c.prepare != nil || c.during != nil {
		// The images pulled go with the run: the next one's kubelet counts the image filesystem
		// too (its imagefs.available<1%).
		defer func() {
			if err := node.RemoveImages(context.Background(), "reprieve.test/"); err != nil {
				t.Log(err)
			}
			// The kubelet's collection deletes every image no container uses, the test images
			// between two pods too: they are imported again for the runs after this one.
			if err := importImages(context.Background()); err != nil {
				t.Error(err)
			}
		}()
	}
	if c.prepare != nil {
		c.prepare(ctx, t)
	}
	var thresholds string
	var confErr error
	if err := node.RestartKubelet(ctx, func(k *nodeenv.KubeletConfig) {
		thresholds, confErr = c.configure(k, int64(avail)>>20)
	}); err != nil || confErr != nil {
		t.Fatal(err, confErr)
	}
	defer func() { _ = node.RestartKubelet(context.Background(), c.restore) }()
	waitNoPressure(ctx, t, v1.NodeMemoryPressure)
	cfg := node.Config()
	ns := strings.TrimPrefix(c.name, "realnode-") + "-" + map[bool]string{true: "soak", false: "rec"}[withReprieve]
	createNamespace(ctx, t, ns)
	out := filepath.Join(outDir, ns)
	pods := c.pods(ctx, t, ns, out)
	defer func() {
		zero := int64(0)
		for _, p := range pods {
			if p.daemonSet {
				_ = env.Client.AppsV1().DaemonSets(ns).Delete(context.Background(), p.pod.Name, metav1.DeleteOptions{})
			}
		}
		_ = env.Client.CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	}()
	s := &replay.Series{Name: c.name, Origin: "real node " + time.Now().UTC().Format("2006-01-02") + ", kubelet " + kubeletVersion(), Description: c.desc,
		Kubelet: evictionYAML(cfg), Thresholds: thresholds, Source: map[bool]string{true: "summary", false: "host"}[c.summary], IntervalMs: 1000,
		DedicatedImageFs: true}
	// The pods, by name; their UIDs once they run.
	names := map[types.UID]string{}
	recDir := map[string]string{} // pod name -> its record folder
	for _, p := range pods {
		name := p.pod.Name
		if p.daemonSet {
			v := &verdict{T: t}
			if name = runDaemonSet(ctx, v, p.pod); name == "" {
				t.Fatal(strings.Join(v.failures, "; "))
			}
		} else if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, p.pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		recDir[name] = filepath.Join(out, name)
	}
	for name, d := range recDir {
		waitFor(ctx, t, 90*time.Second, name+" started", func() bool {
			_, ok := readMillis(d, "started")
			return ok
		})
		pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		names[pod.UID] = name
		sp := replay.Pod{Name: name, Grace: *pod.Spec.TerminationGracePeriodSeconds, MemoryRequest: memoryRequest(pod)}
		if pod.Spec.Priority != nil {
			sp.Priority = *pod.Spec.Priority
		}
		sp.DaemonSet = metav1.GetControllerOf(pod) != nil && metav1.GetControllerOf(pod).Kind == "DaemonSet"
		sp.EmptyDir = len(pod.Spec.Volumes) > 1
		s.Pods = append(s.Pods, sp)
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if c.during != nil {
		wg.Go(func() { c.during(rctx, t) })
	}
	rec := newSeriesRecorder(c.summary)
	start := time.Now()
	var lastEviction time.Time
	evicted := map[string]bool{}
	for time.Since(start) < c.length && (lastEviction.IsZero() || time.Since(lastEviction) < 20*time.Second) {
		tick := time.Now()
		rec.read(ctx, t, start, names, s)
		for uid, name := range names {
			if evicted[name] {
				continue
			}
			pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			by := ""
			switch {
			case err == nil && pod.UID == uid:
				by = evictedBy(pod)
			case err == nil || apierrors.IsNotFound(err):
				// Gone, or replaced: a DaemonSet's controller deletes its pod as soon as the
				// kubelet has failed it. The kubelet's Evicted event outlives it.
				by = kubeletEvictedEvent(ctx, ns, name)
				pod = &v1.Pod{Spec: v1.PodSpec{TerminationGracePeriodSeconds: ptrTo[int64](1)}}
				for _, p := range s.Pods {
					if p.Name == name {
						pod.Spec.TerminationGracePeriodSeconds = ptrTo(p.Grace)
					}
				}
			}
			if by == "" {
				continue
			}
			evicted[name], lastEviction = true, time.Now()
			at := time.Now()
			if term, ok := readMillis(recDir[name], "sigterm"); ok {
				at = term
			}
			e := replay.KubeletEviction{Pod: name, AtMs: at.Sub(start).Milliseconds(), Signal: kubelet.Signal(evictedSignal(pod, c)), Grace: 1}
			if c.soft > 0 {
				e.Soft, e.Grace = true, min(c.soft, *pod.Spec.TerminationGracePeriodSeconds)
			}
			if !strings.Contains(by, "TerminationByKubelet") {
				t.Errorf("%s evicted by %q, not the kubelet: is reprieve still installed?", name, by)
			}
			s.KubeletEvictions = append(s.KubeletEvictions, e)
		}
		time.Sleep(max(time.Second-time.Since(tick), 0))
	}
	stop()
	wg.Wait()
	return s
}

// kubeletEvictedEvent is the message of the kubelet's Evicted event on pod name in ns, marked
// as the kubelet's, or "".
func kubeletEvictedEvent(ctx context.Context, ns, name string) string {
	list, err := env.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return ""
	}
	for _, e := range list.Items {
		if e.Reason == "Evicted" && e.Source.Component == "kubelet" {
			return "TerminationByKubelet: " + e.Message
		}
	}
	return ""
}

// evictedBy says who evicted pod: the kubelet's DisruptionTarget reason, the Eviction API's, or
// "" when it was not.
func evictedBy(pod *v1.Pod) string {
	for _, cond := range pod.Status.Conditions {
		if cond.Type == v1.DisruptionTarget && cond.Status == v1.ConditionTrue {
			return cond.Reason + ": " + cond.Message
		}
	}
	if pod.Status.Reason == "Evicted" {
		return "TerminationByKubelet: " + pod.Status.Message
	}
	return ""
}

// evictedSignal is the signal the kubelet evicted pod for, from its message ("The node was low
// on resource: memory. Threshold quantity: ..."), the run's own otherwise.
func evictedSignal(pod *v1.Pod, c seriesCase) string {
	msg := pod.Status.Message
	for _, cond := range pod.Status.Conditions {
		if cond.Type == v1.DisruptionTarget {
			msg += cond.Message
		}
	}
	switch {
	case strings.Contains(msg, "ephemeral-storage") && c.diskSignal != "":
		return string(c.diskSignal)
	case strings.Contains(msg, "ephemeral-storage"):
		return string(kubelet.NodeFsAvailable)
	case strings.Contains(msg, "pids"):
		return string(kubelet.PIDAvailable)
	}
	if strings.Contains(c.name, "allocatable") {
		return string(kubelet.AllocatableMemoryAvailable)
	}
	return string(kubelet.MemoryAvailable)
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

func memoryRequest(p *v1.Pod) string {
	if q, ok := p.Spec.Containers[0].Resources.Requests[v1.ResourceMemory]; ok {
		return q.String()
	}
	return ""
}

// kubeletVersion is the real node's kubelet version, from the tools folder.
func kubeletVersion() string {
	bin, err := testenv.ToolsBin()
	if err != nil {
		return "unknown"
	}
	b, err := os.ReadFile(filepath.Join(bin, nodeenv.KubeletBin+".version"))
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// evictionYAML is the eviction part of the kubelet's configuration, as the replay reads it.
func evictionYAML(k nodeenv.KubeletConfig) string {
	var b strings.Builder
	writeMap := func(name string, m map[string]string) {
		if len(m) == 0 {
			return
		}
		fmt.Fprintf(&b, "%s:\n", name)
		for _, key := range sortedKeys(m) {
			fmt.Fprintf(&b, "  %s: %q\n", key, m[key])
		}
	}
	writeMap("evictionHard", k.EvictionHard)
	writeMap("evictionSoft", k.EvictionSoft)
	writeMap("evictionSoftGracePeriod", k.EvictionSoftGracePeriod)
	writeMap("evictionMinimumReclaim", k.EvictionMinimumReclaim)
	if k.EvictionMaxPodGracePeriod != 0 {
		fmt.Fprintf(&b, "evictionMaxPodGracePeriod: %d\n", k.EvictionMaxPodGracePeriod)
	}
	if k.ImageGCHighThresholdPercent != nil && k.ImageGCLowThresholdPercent != nil {
		fmt.Fprintf(&b, "imageGCHighThresholdPercent: %d\nimageGCLowThresholdPercent: %d\n", *k.ImageGCHighThresholdPercent, *k.ImageGCLowThresholdPercent)
	}
	if len(k.EnforceNodeAllocatable) > 0 {
		fmt.Fprintf(&b, "enforceNodeAllocatable: [%s]\n", strings.Join(k.EnforceNodeAllocatable, ", "))
	}
	return b.String()
}

// seriesRecorder reads what the pressure source reads: the host (as the chart's agent reads it,
// memory and processes per pod from their cgroups) or the kubelet's Summary API.
type seriesRecorder struct {
	host    *kubelet.HostSource
	summary *kubelet.SummarySource
}

func newSeriesRecorder(summary bool) *seriesRecorder {
	r := &seriesRecorder{host: &kubelet.HostSource{Root: "/", KubeletRootDir: node.RootDir, ImageFsDir: node.ContainerdRoot, PodUsage: true}}
	if summary {
		var err error
		if r.summary, err = kubelet.NewSummarySource(node.SummaryURL(), "", "", true); err != nil {
			panic(err) // insecure without a CA: cannot fail
		}
	}
	return r
}

// read takes one reading into s, the pods named by UID.
func (r *seriesRecorder) read(ctx context.Context, t *testing.T, start time.Time, names map[types.UID]string, s *replay.Series) {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	at := time.Since(start).Milliseconds()
	var sample kubelet.Sample
	var err error
	if r.summary != nil {
		sample, err = r.summary.Read(rctx)
	} else {
		sample, err = r.host.Read(rctx)
	}
	if err != nil && len(sample.Node) == 0 {
		t.Logf("reading at %d ms: %v", at, err)
		return
	}
	if n := len(s.Readings); n > 0 && at <= s.Readings[n-1].AtMs {
		return
	}
	if len(s.Readings) == 0 {
		at = 0
	}
	rd := replay.Reading{AtMs: at, Node: map[kubelet.Signal][2]int64{}, Pods: map[string]replay.Usage{}, ImageFsUsed: sample.ImageFsUsed}
	for sig, o := range sample.Node {
		rd.Node[sig] = [2]int64{o.Available, o.Capacity}
		if sig == kubelet.MemoryAvailable && !o.Time.IsZero() {
			ms := o.Time.Sub(start).Milliseconds()
			rd.MeasuredMs = &ms
		}
	}
	for uid, u := range sample.Pods {
		name, ok := names[uid]
		if !ok {
			continue
		}
		local := u.Logs.Bytes
		for _, v := range u.Volumes {
			local += v.Bytes
		}
		rd.Pods[name] = replay.Usage{Memory: u.MemoryWorkingSet, Processes: u.Processes, Rootfs: u.Rootfs.Bytes, Local: local}
	}
	s.DedicatedImageFs = sample.DedicatedImageFs
	s.Readings = append(s.Readings, rd)
}
