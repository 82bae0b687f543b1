package realnode

import (
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	"github.com/reprieve-dev/reprieve/agent/volumes"
	"github.com/reprieve-dev/reprieve/test/nodeenv"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// The CSI driver of the volume test: csi-test's mock driver (test/tools/csi.sh), which needs
// attaching (it advertises PUBLISH_UNPUBLISH_VOLUME). Its node ID is its name, whatever the
// node (mock/service.New sets nodeID to the driver's name), so the replacement's node object
// carries a CSINode with that ID for the attacher's ControllerPublishVolume to accept.
const (
	csiDriver       = "mock.csi.reprieve.test"
	csiStorageClass = "reprieve-csi-mock"
	replacementNode = "csi-replacement-1"
)

// csiControllers are what the volume test adds to the package's kube-controller-manager: the
// attach/detach controller (VolumeAttachments, the detach gated on status.volumesInUse, the
// Multi-Attach event) and the persistent-volume binder (which hands a claim to the external
// provisioner and binds what it made).
var csiControllers = []string{"persistentvolume-attach-detach-controller", "persistentvolume-binder-controller"}

// startCSI runs the CSI driver and kubernetes-csi's sidecars as host processes, so that they
// outlive the kubelet as a cloud's controller-side attacher outlives a reclaimed machine:
// the mock driver (controller and node service on one socket), our registrar in the kubelet's
// plugins_registry (what node-driver-registrar does), the external attacher and the external
// provisioner. It restarts kube-controller-manager with csiControllers, creates the
// CSIDriver, the StorageClass and the replacement's node (a kwok node with the attach/detach
// controller's annotation and a CSINode), and undoes all of it when the test ends.
func startCSI(ctx context.Context, t *testing.T) {
	t.Helper()
	bin, err := testenv.ToolsBin()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"csi-mock-driver", "csi-attacher", "csi-provisioner", "csi-registrar"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Fatalf("%s is missing from %s (make tools builds it: test/tools/csi.sh): %v", b, bin, err)
		}
	}
	dir := filepath.Join(node.Dir, "csi")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "csi.sock")
	logs := filepath.Join(logDir, "csi")
	start := func(name string, args []string, envs ...string) {
		p, err := testenv.StartProcess(ctx, name, filepath.Join(logs, name+".log"), filepath.Join(bin, name), args, envs)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Stop() })
	}
	start("csi-mock-driver", []string{"-name=" + csiDriver, "-attach-limit=10", "-v=4"}, "CSI_ENDPOINT=unix://"+sock)
	waitFor(ctx, t, 20*time.Second, "the mock CSI driver's socket", func() bool {
		_, err := os.Stat(sock)
		return err == nil
	})
	start("csi-registrar", []string{"-driver=" + csiDriver, "-csi-endpoint=" + sock,
		"-registration-dir=" + filepath.Join(node.RootDir, "plugins_registry")})
	common := []string{"--csi-address=" + sock, "--kubeconfig=" + env.Kubeconfig, "--v=4"}
	start("csi-attacher", append(common, "--timeout=15s", "--retry-interval-max=5s"))
	start("csi-provisioner", append(common, "--retry-interval-max=5s"))

	env.StopControllerManager()
	if err := env.StartControllerManager(ctx, append(append([]string{}, controllers...), csiControllers...)...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		env.StopControllerManager()
		if err := env.StartControllerManager(context.Background(), controllers...); err != nil {
			t.Errorf("restarting kube-controller-manager as the package runs it: %v", err)
		}
	})

	// The kubelet found the registrar, called the driver's NodeGetInfo and wrote the CSINode.
	waitFor(ctx, t, 30*time.Second, "the kubelet's CSINode entry for "+csiDriver, func() bool {
		return csiNodeHas(ctx, nodeName)
	})

	attach := true
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: csiStorageClass}, Provisioner: csiDriver,
		ReclaimPolicy: ptrTo(v1.PersistentVolumeReclaimDelete), VolumeBindingMode: ptrTo(storagev1.VolumeBindingImmediate)}
	drv := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: csiDriver},
		Spec: storagev1.CSIDriverSpec{AttachRequired: &attach, PodInfoOnMount: ptrTo(false)}}
	if _, err := env.Client.StorageV1().CSIDrivers().Create(ctx, drv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := env.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = env.Client.StorageV1().StorageClasses().Delete(bg, csiStorageClass, metav1.DeleteOptions{})
		_ = env.Client.StorageV1().CSIDrivers().Delete(bg, csiDriver, metav1.DeleteOptions{})
	})

	// The replacement's node: kwok runs its pods; the annotation the kubelet sets on its own node
	// tells the attach/detach controller that it attaches for this one, and the CSINode gives the
	// attacher the driver's node ID.
	if _, err := env.CreateNode(ctx, replacementNode, map[string]string{"type": "kwok"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Nodes().Delete(context.Background(), replacementNode, metav1.DeleteOptions{})
		_ = env.Client.StorageV1().CSINodes().Delete(context.Background(), replacementNode, metav1.DeleteOptions{})
	})
	patch := []byte(`{"metadata":{"annotations":{"volumes.kubernetes.io/controller-managed-attach-detach":"true"}}}`)
	if _, err := env.Client.CoreV1().Nodes().Patch(ctx, replacementNode, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	csiNode := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: replacementNode},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: csiDriver, NodeID: csiDriver}}}}
	if _, err := env.Client.StorageV1().CSINodes().Create(ctx, csiNode, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func csiNodeHas(ctx context.Context, name string) bool {
	cn, err := env.Client.StorageV1().CSINodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	for _, d := range cn.Spec.Drivers {
		if d.Name == csiDriver {
			return true
		}
	}
	return false
}

// volumeRecorder follows, from watches, what the volume test measures: when the real node's
// status.volumesInUse gained and lost the volume, the VolumeAttachments of the volume per node
// (created, attached, deleted), and the attach/detach controller's events on the pods.
type volumeRecorder struct {
	pv     string // the PersistentVolume's name
	handle string // its CSI volume handle, in volumesInUse as kubernetes.io/csi/<driver>^<handle>

	mu sync.Mutex
	volumeState
}

// volumeState is what a volumeRecorder saw so far.
type volumeState struct {
	inUse     bool
	inUseAt   time.Time // first seen in volumesInUse
	outAt     time.Time // last left volumesInUse
	attached  map[string]time.Time
	vaGone    map[string]time.Time
	multiAt   time.Time // the first Multi-Attach event on the replacement
	multiText string
}

func (r *volumeRecorder) inUseNow() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inUse
}

func (r *volumeRecorder) snapshot() volumeState {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.volumeState
	c.attached, c.vaGone = maps.Clone(r.attached), maps.Clone(r.vaGone)
	return c
}

// record starts the watches; they end with ctx.
func (r *volumeRecorder) record(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	r.attached, r.vaGone = map[string]time.Time{}, map[string]time.Time{}
	nw, err := env.Client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + nodeName})
	if err != nil {
		t.Fatal(err)
	}
	vw, err := env.Client.StorageV1().VolumeAttachments().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ew, err := env.Client.CoreV1().Events(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer nw.Stop()
		for ev := range nw.ResultChan() {
			n, ok := ev.Object.(*v1.Node)
			if !ok {
				continue
			}
			now := time.Now()
			in := false
			for _, u := range n.Status.VolumesInUse {
				if string(u) == "kubernetes.io/csi/"+csiDriver+"^"+r.handle {
					in = true
				}
			}
			r.mu.Lock()
			if in && !r.inUse && r.inUseAt.IsZero() {
				r.inUseAt = now
			}
			if !in && r.inUse {
				r.outAt = now
			}
			r.inUse = in
			r.mu.Unlock()
		}
	}()
	go func() {
		defer vw.Stop()
		for ev := range vw.ResultChan() {
			va, ok := ev.Object.(*storagev1.VolumeAttachment)
			if !ok || va.Spec.Source.PersistentVolumeName == nil || *va.Spec.Source.PersistentVolumeName != r.pv {
				continue
			}
			now := time.Now()
			r.mu.Lock()
			if ev.Type == watch.Deleted {
				r.vaGone[va.Spec.NodeName] = now
			} else if va.Status.Attached && r.attached[va.Spec.NodeName].IsZero() {
				r.attached[va.Spec.NodeName] = now
			}
			r.mu.Unlock()
		}
	}()
	go func() {
		defer ew.Stop()
		for ev := range ew.ResultChan() {
			e, ok := ev.Object.(*v1.Event)
			// The Multi-Attach event: "Multi-Attach error for volume ..." before Kubernetes
			// 1.3x; in v1.37 (reportMultiAttachError in the attach/detach controller's
			// reconciler.go) "Waiting for detach for volume ... Volume is already exclusively
			// attached to one node, waiting on detach before it can be attached to another node"
			// once the old pod is deleted. Its reason is FailedAttachVolume in both.
			if !ok || e.Reason != "FailedAttachVolume" || !(strings.Contains(e.Message, "Multi-Attach") || strings.Contains(e.Message, "exclusively attached")) {
				continue
			}
			r.mu.Lock()
			if r.multiAt.IsZero() {
				r.multiAt, r.multiText = time.Now(), e.Message
			}
			r.mu.Unlock()
		}
	}()
}

// volumeRun is one spot window of the volume test and what it measured.
type volumeRun struct {
	rule                             bool
	trigger, deadline, inUseAt       time.Time
	sigterm, exited, podGone, outAt  time.Time
	unstaged                         time.Time // the kubelet's UnmountDevice (NodeUnstageVolume) done, from its log
	inUseAtDeadline                  bool
	node1Detached, replacementAttach time.Time
	multiAt                          time.Time
	multiText                        string
	afterRestart                     time.Time          // the replacement attached once the kubelet was back (without the rule)
	podSummary                       string             // what the agent's window summary says of db-0's volume (with the rule)
	summary                          string             // the whole summary (with the rule)
	metrics                          map[string]float64 // reprieve_window_volumes_total by result, after the window
}

// Volumes released before the reclaim (issue 40) on the real node, with a real CSI driver that
// needs attaching (csi-test's mock driver), kubernetes-csi's external attacher and provisioner as
// host processes, and kube-controller-manager's attach/detach controller. A StatefulSet-like pod
// "db-0" with a claim of the driver's StorageClass, a 10 s grace and a toleration of the
// interruption taint for 600 s (it stays as long as it can: the agent evicts it at the last
// moment that still gives it its grace) gets a spot notice; the kubelet is killed at the reclaim
// deadline, as the machine's end kills it; as the StatefulSet controller would, a replacement
// "db-0" with the same claim is created on another node object as soon as the old pod is gone.
//
//   - Without the volume rule (--volume-release=off, the plan of before issue 40) the pod is gone
//     by the deadline less the 5 s margin, and the kubelet publishes volumesInUse every 10 s: a
//     status update between the unmount and the deadline happens in about half of real reclaims,
//     so the run puts the pod's end just after one (the status loop's phase is read from the
//     moment the volume entered volumesInUse, alignDeadline). The volume is then still in
//     volumesInUse at the deadline, the attach/detach controller does not detach it from the dead
//     node, and the replacement gets the Multi-Attach event; its attach waits (six minutes
//     upstream; here until the test restarts the kubelet, which then publishes the release).
//   - With the rule (--volume-release=auto: 5 s unmount allowance + 10.4 s status period), in the
//     same phase, the volume leaves volumesInUse before the deadline, the controller detaches it
//     from the dead node and the replacement's volume is attached without that wait.
func TestVolumeReleasedBeforeReclaimOnRealNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	begin := time.Now()
	startCSI(ctx, t)
	t.Logf("the CSI driver, the attacher, the provisioner and the attach/detach controller ready in %s", time.Since(begin).Round(time.Millisecond))
	var runs []volumeRun
	for _, rule := range []bool{false, true} {
		name := map[bool]string{false: "WithoutVolumeRule", true: "WithVolumeRule"}[rule]
		var r volumeRun
		if !t.Run(name, func(t *testing.T) { r = volumeWindow(ctx, t, rule) }) {
			return
		}
		runs = append(runs, r)
	}
	rows := []string{"| moment | without the volume rule (`--volume-release=off`) | with it (`--volume-release=auto`) |", "|---|---|---|"}
	at := func(r volumeRun, x time.Time) string {
		if x.IsZero() {
			return "never"
		}
		return fmt.Sprintf("D%+.1f s", x.Sub(r.deadline).Seconds())
	}
	for _, m := range []struct {
		what string
		get  func(volumeRun) string
	}{
		{"spot notice (reclaim deadline D)", func(r volumeRun) string { return at(r, r.trigger) }},
		{"the pod's SIGTERM (eviction)", func(r volumeRun) string { return at(r, r.sigterm) }},
		{"its container ended (SIGKILL after the 10 s grace)", func(r volumeRun) string { return at(r, r.exited) }},
		{"the volume unmounted and unstaged (the kubelet's log)", func(r volumeRun) string { return at(r, r.unstaged) }},
		{"the pod gone from the API; replacement created", func(r volumeRun) string { return at(r, r.podGone) }},
		{"the kubelet's status update without it in volumesInUse", func(r volumeRun) string { return at(r, r.outAt) }},
		{"in volumesInUse at D, when the kubelet is killed", func(r volumeRun) string { return map[bool]string{true: "yes", false: "no"}[r.inUseAtDeadline] }},
		{"the agent's window summary for db-0 (from its claim and volume, read with the chart's ServiceAccount)", func(r volumeRun) string {
			if r.podSummary == "" {
				return "no per-pod line (the pod is not planned with the volume rule)"
			}
			_, after, _ := strings.Cut(r.podSummary, " volume ")
			if name, rest, ok := strings.Cut(after, " "); ok {
				return "`" + name + "` " + rest
			}
			return r.podSummary
		}},
		{"first Multi-Attach event on the replacement", func(r volumeRun) string { return at(r, r.multiAt) }},
		{"detached from the real node (its VolumeAttachment deleted)", func(r volumeRun) string { return at(r, r.node1Detached) }},
		{"attached to the replacement's node", func(r volumeRun) string {
			if r.replacementAttach.IsZero() && !r.afterRestart.IsZero() {
				return fmt.Sprintf("not while the node was dead; %s after the test restarted the kubelet", at(r, r.afterRestart))
			}
			return at(r, r.replacementAttach)
		}},
	} {
		rows = append(rows, fmt.Sprintf("| %s | %s | %s |", m.what, m.get(runs[0]), m.get(runs[1])))
	}
	t.Logf("the volume timelines (D = the reclaim deadline):\n%s", strings.Join(rows, "\n"))
	writeFigures(t, "volumes", strings.Join(rows, "\n"))
}

// volumeWindow runs one spot window of TestVolumeReleasedBeforeReclaimOnRealNode with the volume
// rule on or off and returns its timeline.
func volumeWindow(ctx context.Context, t *testing.T, rule bool) volumeRun {
	run := volumeRun{rule: rule}
	var reprievePod *v1.Pod
	if rule {
		_, reprievePod = install(ctx, t)
	} else {
		_, reprievePod = install(ctx, t, "--set-json", fmt.Sprintf(`extraArgs=["--aws-imds-endpoint=http://%s:%d","--volume-release=off"]`, nodeenv.NodeIP, imdsPort))
	}
	ns := "csi-off"
	if rule {
		ns = "csi-auto"
	}
	createNamespace(ctx, t, ns)
	out := filepath.Join(outDir, ns)
	taint, err := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	if err != nil {
		t.Fatal(err)
	}

	claim := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-db-0", Namespace: ns},
		Spec: v1.PersistentVolumeClaimSpec{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			StorageClassName: ptrTo(csiStorageClass),
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := env.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pv string
	waitFor(ctx, t, 60*time.Second, "the claim bound to a volume of the external provisioner", func() bool {
		c, err := env.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil || c.Status.Phase != v1.ClaimBound {
			return false
		}
		pv = c.Spec.VolumeName
		return true
	})
	vol, err := env.Client.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
	if err != nil || vol.Spec.CSI == nil {
		t.Fatalf("the claim's volume %s: %v (not a CSI volume?)", pv, err)
	}
	rec := &volumeRecorder{pv: pv, handle: vol.Spec.CSI.VolumeHandle}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	rec.record(wctx, t, ns)

	pod := func(onNode string) *v1.Pod {
		p := workloadPod(ns, "db-0", out, []string{"term", "-out", "/out/db-0"})
		p.Spec.NodeName = onNode
		p.Spec.TerminationGracePeriodSeconds = ptrTo[int64](10)
		p.Spec.Tolerations = append(p.Spec.Tolerations, v1.Toleration{Key: taint.Key, Operator: v1.TolerationOpEqual,
			Value: taint.Value, Effect: taint.Effect, TolerationSeconds: ptrTo[int64](600)})
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "data", VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim.Name}}})
		p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, v1.VolumeMount{Name: "data", MountPath: "/data"})
		return p
	}
	db0, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod(nodeName), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 90*time.Second, "db-0 running with its volume on the real node", func() bool {
		_, ok := readMillis(filepath.Join(out, "db-0"), "alive")
		return ok
	})
	snap := rec.snapshot()
	if snap.inUseAt.IsZero() || snap.attached[nodeName].IsZero() {
		t.Fatalf("db-0 runs, yet its volume %s is not in the real node's volumesInUse (%v) or not attached there (%v)", pv, snap.inUseAt, snap.attached)
	}
	run.inUseAt = snap.inUseAt
	// db-0's volumes, read as the agent reads them (issue 40, item 2: its claim and the claim's
	// volume): the unique name must be the one the real kubelet lists in volumesInUse.
	wantName := v1.UniqueVolumeName("kubernetes.io/csi/" + csiDriver + "^" + rec.handle)
	if vols, err := volumes.ReadPod(ctx, kubetest.Wrap(env.Client), db0); err != nil || !slices.Equal(vols.Attach, []v1.UniqueVolumeName{wantName}) {
		t.Errorf("db-0's volumes read from its claim: %v (%v), want [%s], the name in the node's volumesInUse", vols.Attach, err, wantName)
	}

	// The notice; the deadline put so that, without the rule, the pod's end comes just after a
	// status update of the kubelet, and the next one only after the deadline.
	trigger, deadline := alignDeadline(t, snap.inUseAt, time.Now())
	run.trigger, run.deadline = trigger, deadline
	switchIMDS(ctx, t, "--mock-trigger-time="+trigger.UTC().Format(time.RFC3339), "--rebalance-delay-sec=86400",
		"spot", "-a", "terminate", "-t", deadline.UTC().Format(time.RFC3339))
	defer quietIMDS(context.Background(), t)
	t.Logf("volume %s in volumesInUse at %s; notice at %s, deadline %s", pv, snap.inUseAt.Format("15:04:05.000"),
		trigger.Format("15:04:05"), deadline.Format("15:04:05"))

	// The StatefulSet controller's part: the replacement as soon as the old pod is gone.
	waitFor(ctx, t, time.Until(deadline)+5*time.Second, "db-0 gone from the API", func() bool {
		_, err := env.Client.CoreV1().Pods(ns).Get(ctx, "db-0", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	run.podGone = time.Now()
	if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod(replacementNode), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if d := time.Until(deadline); d > 0 {
		time.Sleep(d) // the reclaim itself: the machine goes at the deadline, whatever happens
	}
	run.inUseAtDeadline = rec.inUseNow()
	node.StopKubelet()
	killed := time.Now()
	t.Logf("kubelet stopped at D%+.2f s; the volume in volumesInUse then: %v", killed.Sub(deadline).Seconds(), run.inUseAtDeadline)
	restarted := false
	restart := func() {
		if restarted {
			return
		}
		restarted = true
		if err := node.RestartKubelet(context.Background(), nil); err != nil {
			t.Errorf("restarting the kubelet: %v", err)
		}
	}
	defer restart()

	dir := filepath.Join(out, "db-0")
	run.sigterm, _ = readMillis(dir, "sigterm")
	run.exited, _ = readMillis(dir, "alive")
	if rule {
		waitFor(ctx, t, 30*time.Second, "the volume attached to the replacement's node", func() bool {
			return !rec.snapshot().attached[replacementNode].IsZero()
		})
	} else {
		// The controller does not detach while the dead node lists the volume: 15 s of that
		// is the proof (upstream lets it go after six minutes, ReconcilerMaxWaitForUnmountDuration).
		waitFor(ctx, t, 30*time.Second, "the Multi-Attach event on the replacement", func() bool {
			return !rec.snapshot().multiAt.IsZero()
		})
		if d := time.Until(deadline.Add(15 * time.Second)); d > 0 {
			time.Sleep(d)
		}
	}
	if rule {
		run.podSummary, run.summary = podVolumeSummary(ctx, t, ns+"/db-0: ")
	}
	// The agent's count of the window's volumes, for the ReprieveVolumeStillInUse alert: its
	// pod still runs (stopping the kubelet stops no container).
	run.metrics = map[string]float64{}
	waitFor(ctx, t, 20*time.Second, "the agent's reprieve_window_volumes_total", func() bool {
		text, err := scrape(ctx, reprievePod, 10271)
		if err != nil {
			return false
		}
		for _, r := range []string{"released", "still_in_use"} {
			run.metrics[r], _ = metric(text, `reprieve_window_volumes_total{result="`+r+`"}`)
		}
		return run.metrics["released"]+run.metrics["still_in_use"] > 0
	})
	run.unstaged = kubeletLogTime(t, `UnmountDevice succeeded for volume "`+pv+`"`)
	snap = rec.snapshot()
	run.outAt, run.multiAt, run.multiText = snap.outAt, snap.multiAt, snap.multiText
	run.node1Detached, run.replacementAttach = snap.vaGone[nodeName], snap.attached[replacementNode]
	if !rule {
		restart()
		waitFor(ctx, t, 60*time.Second, "the volume attached to the replacement's node once the kubelet is back", func() bool {
			return !rec.snapshot().attached[replacementNode].IsZero()
		})
		run.afterRestart = rec.snapshot().attached[replacementNode]
	}

	// The assertions.
	if run.sigterm.IsZero() || run.exited.IsZero() {
		t.Fatalf("db-0 recorded no SIGTERM (%v) or no life (%v)", run.sigterm, run.exited)
	}
	if run.exited.After(deadline) {
		t.Errorf("db-0 still ran %.2f s after the deadline", run.exited.Sub(deadline).Seconds())
	}
	if rule {
		if run.inUseAtDeadline || run.outAt.IsZero() || !run.outAt.Before(deadline) {
			t.Errorf("with the volume rule the volume must leave volumesInUse before the deadline: left at %v, still in use at the deadline: %v", run.outAt, run.inUseAtDeadline)
		}
		if run.node1Detached.IsZero() {
			t.Errorf("the volume was never detached from the real node")
		}
		if late := run.replacementAttach.Sub(deadline); late > 10*time.Second {
			t.Errorf("the replacement's volume attached %.1f s after the deadline, want no Multi-Attach wait", late.Seconds())
		}
	} else {
		if !run.inUseAtDeadline {
			t.Errorf("without the volume rule, in this phase of the kubelet's status loop the volume must still be in volumesInUse at the deadline; it left at %v (D%+.1f s)", run.outAt, run.outAt.Sub(deadline).Seconds())
		}
		if run.multiAt.IsZero() {
			t.Errorf("no Multi-Attach event on the replacement")
		}
		if !run.replacementAttach.IsZero() {
			t.Errorf("the volume was attached to the replacement at D%+.1f s while the dead node still listed it in use", run.replacementAttach.Sub(deadline).Seconds())
		}
	}
	wantMetrics := map[string]float64{"released": 0, "still_in_use": 1}
	if rule {
		wantMetrics = map[string]float64{"released": 1, "still_in_use": 0}
	}
	if !maps.Equal(run.metrics, wantMetrics) {
		t.Errorf("reprieve_window_volumes_total after the window: %v, want %v", run.metrics, wantMetrics)
	}
	if rule {
		// The agent's own account (issue 40, item 2): db-0's volume, by the unique name the node
		// lists, released before the window's end (D less the 5 s margin), as the agent read it
		// from db-0's claim and volume with the chart's ServiceAccount.
		// At node level, from the node's volumesInUse as the agent's cache holds it: the one
		// volume in use during the window, released by its end.
		if want := "volumes in use during the window: 1 released (gone from the node's volumesInUse) by "; !strings.Contains(run.summary, want) {
			t.Errorf("the agent's window summary %q lacks %q", run.summary, want)
		}
		want := fmt.Sprintf("%s/db-0: volume kubernetes.io/csi/%s^%s released at D-", ns, csiDriver, rec.handle)
		if !strings.HasPrefix(run.podSummary, want) {
			t.Errorf("the agent's window summary for db-0 is %q, want it to begin %q", run.podSummary, want)
		} else if at, err := time.ParseDuration(strings.TrimSuffix(strings.TrimPrefix(run.podSummary, want), ".")); err != nil || at < 5*time.Second {
			t.Errorf("the agent's window summary for db-0 is %q: want the release before D-5s, the window's end (%v)", run.podSummary, err)
		} else if math.Abs((-at).Seconds()-run.outAt.Sub(deadline).Seconds()) > 1.5 {
			t.Errorf("the agent's window summary puts db-0's release at D-%s; the test saw the volume leave volumesInUse at D%+.1f s", at, run.outAt.Sub(deadline).Seconds())
		}
	}
	if rule && !run.unstaged.IsZero() && !run.outAt.IsZero() && run.outAt.Before(run.unstaged) {
		t.Errorf("the volume left volumesInUse (%s) before the kubelet unstaged it (%s)", run.outAt.Format("15:04:05.000"), run.unstaged.Format("15:04:05.000"))
	}
	t.Logf("%s: SIGTERM D%+.1f s, ended D%+.1f s, gone D%+.1f s, unstaged %v, out of volumesInUse %v, Multi-Attach %v (%s), detached from the real node %v, attached to the replacement %v, after the kubelet's restart %v",
		map[bool]string{true: "with the rule", false: "without"}[rule], run.sigterm.Sub(deadline).Seconds(), run.exited.Sub(deadline).Seconds(),
		run.podGone.Sub(deadline).Seconds(), rel(run.unstaged, deadline), rel(run.outAt, deadline), rel(run.multiAt, deadline), run.multiText, rel(run.node1Detached, deadline),
		rel(run.replacementAttach, deadline), rel(run.afterRestart, deadline))

	// Leave the node as the other tests expect it: the notice over, the taint gone, the
	// replacement and its claim deleted.
	restart()
	quietIMDS(ctx, t)
	waitFor(ctx, t, 60*time.Second, "the interruption taint gone from the real node", func() bool {
		n, err := env.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, tt := range n.Spec.Taints {
			if tt.Key == taint.Key {
				return false
			}
		}
		return true
	})
	_ = env.Client.CoreV1().Pods(ns).Delete(ctx, "db-0", metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)})
	return run
}

// podVolumeSummary waits up to 20 s for the agent's InterruptionHandled event on the real node
// whose per-pod part names prefix (namespace/pod: ) and returns that part and the whole
// message; empty, with an error, when none came.
func podVolumeSummary(ctx context.Context, t *testing.T, prefix string) (part, message string) {
	t.Helper()
	until := time.Now().Add(20 * time.Second)
	for {
		evs, err := env.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + nodeName + ",reason=" + events.ReasonInterruptionHandled})
		if err == nil {
			for _, e := range evs.Items {
				if i := strings.Index(e.Message, prefix); i >= 0 {
					part, _, _ := strings.Cut(e.Message[i:], "; ")
					t.Logf("the agent's window summary: %s", e.Message)
					return part, e.Message
				}
			}
		}
		if time.Now().After(until) || ctx.Err() != nil {
			t.Errorf("no %s event on %s naming %q within 20 s (last error %v)", events.ReasonInterruptionHandled, nodeName, prefix, err)
			return "", ""
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// rel is x relative to d, or "never".
func rel(x, d time.Time) string {
	if x.IsZero() {
		return "never"
	}
	return fmt.Sprintf("D%+.1f s", x.Sub(d).Seconds())
}

// alignDeadline picks the notice and the reclaim deadline (whole seconds, as the metadata
// service gives them) from the moment inUseAt when the kubelet's status update put the volume in
// volumesInUse: its status loop runs every nodeStatusUpdateFrequency (10 s) plus up to 4%
// jitter and the update's own time (wait.JitterUntil(kl.syncNodeStatus, 10s, 0.04, sliding)),
// so its k-th update after inUseAt comes between inUseAt+10k s and inUseAt+10.45k s. The
// deadline D goes 6-7 s after the latest the k-th update can come: without the rule the pod's
// container ends about 5.5 s before D (the 5 s margin and the agent's 0.5 s lead), after the
// k-th update, and the next one (from inUseAt+10(k+1) s) comes over half a second after D as
// long as 10.45k+7 < 10k+9.5, that is k <= 5. k is the smallest that leaves a window of at least 28 s from a notice 2 s from now.
func alignDeadline(t *testing.T, inUseAt, now time.Time) (trigger, deadline time.Time) {
	t.Helper()
	trigger = now.Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	for k := 1; k <= 5; k++ {
		latestK := inUseAt.Add(time.Duration(10.45 * float64(k) * float64(time.Second)))
		d := latestK.Add(6 * time.Second)
		d = time.Unix(int64(math.Ceil(float64(d.UnixNano())/1e9)), 0)
		if d.Sub(trigger) >= 28*time.Second {
			return trigger, d
		}
	}
	t.Fatalf("no status update of the kubelet to align on: the volume entered volumesInUse at %s, now %s", inUseAt.Format("15:04:05.000"), now.Format("15:04:05.000"))
	return
}

// kubeletLogTime is the time of the kubelet's last log line that contains text (klog's header
// "I1205 00:24:06.388141", local time, this year), or zero.
func kubeletLogTime(t *testing.T, text string) time.Time {
	t.Helper()
	b, err := os.ReadFile(node.KubeletLog())
	if err != nil {
		t.Log(err)
		return time.Time{}
	}
	var last time.Time
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, text) || len(line) < 21 {
			continue
		}
		at, err := time.ParseInLocation("0102 15:04:05.000000", line[1:21], time.Local)
		if err != nil {
			continue
		}
		last = at.AddDate(time.Now().Year(), 0, 0)
	}
	return last
}
