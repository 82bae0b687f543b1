package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/test/fakes/gcpmeta"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// The GCE maintenance notices, scaled down so that a test takes seconds: an ordinary VM's 60 s
// and a GPU VM's hour ("Handling GPU host maintenance events") become these, in the fake and in
// reprieve's flags alike. Every VM gets the same flags; each must find its own window.
const (
	scaledVMNotice  = 15 * time.Second
	scaledGPUNotice = 30 * time.Second
)

// windowPods are pods whose graces exceed the ordinary VM's whole window, fit in it, and are
// short. They tolerate the interruption taint for an hour, so that reprieve's plan, not the
// taint manager, decides when each goes (a pod that tolerates it forever is left alone).
func windowPods() []scenario.Pod {
	return []scenario.Pod{
		{Name: "grace-30", Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(30)},
		{Name: "grace-12", Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(12)},
		{Name: "grace-3", Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(3)},
	}
}

// TestGCPMaintenanceOrdinaryAndGPU (issue 21 item 1): three VMs get the same
// TERMINATE_ON_HOST_MAINTENANCE without an upcoming-maintenance window, and the same flags. The
// ordinary VM stops scaledVMNotice later, the GPU VMs (one told by its machine family through
// the metadata server, one only by the node's GKE accelerator label) scaledGPUNotice later.
// Each must have every pod gone before its own stop. Before the fix every VM got the GPU
// VM's hour: the ordinary VM only got the NoSchedule maintenance taint and its pods died with
// it.
func TestGCPMaintenanceOrdinaryAndGPU(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	type vm struct {
		name, machineType string
		attached          bool
		labels            map[string]string
		window            time.Duration
	}
	vms := []vm{
		{name: "gcpw-ordinary", machineType: gcpmeta.OrdinaryMachineType, window: scaledVMNotice},
		{name: "gcpw-gpu-family", machineType: gcpmeta.GPUMachineType, window: scaledGPUNotice},
		{name: "gcpw-gpu-label", machineType: "n1-standard-8", attached: true, window: scaledGPUNotice,
			labels: map[string]string{"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}},
	}
	interruption, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	var wg sync.WaitGroup
	results := make([]string, len(vms))
	for i, m := range vms {
		node := m.name + "-node"
		setupNode(ctx, t, m.name, node, m.labels)
		obs := createObserved(ctx, t, m.name, node, interruption, windowPods())
		srv := gcpmeta.New()
		url, err := srv.Start("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		srv.SetMachineType(m.machineType)
		srv.SetGPUsAttached(m.attached)
		srv.Set(gcpmeta.PathOnHostMaintenance, "TERMINATE")
		rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig,
			"--provider=gcp", "--gcp-metadata-endpoint="+strings.TrimPrefix(url, "http://"),
			"--gcp-vm-maintenance-notice="+scaledVMNotice.String(), "--gcp-gpu-maintenance-notice="+scaledGPUNotice.String(),
			"--safety-margin="+margin.String())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = rp.Stop() }()
		waitReady(ctx, t, srv, node)
		wg.Add(1)
		go func() {
			defer wg.Done()
			stop := srv.StopForMaintenance(scaledGPUNotice, scaledVMNotice, nil)
			notice := time.Now()
			if d := stop.Sub(notice); d < m.window-time.Second || d > m.window+time.Second {
				t.Errorf("%s: the fake stops %v after the notice, want %v", m.name, d, m.window)
			}
			// The deadline reprieve knows is the VM's own stop.
			n := waitNodeNoFatal(ctx, t, node, func(n *v1.Node) bool { return n.Annotations[record.AnnotationReclaimDeadline] != "" })
			if n == nil {
				t.Errorf("%s: no deadline annotation: the notice was not acted on", m.name)
				return
			}
			deadline, _ := time.Parse(time.RFC3339, n.Annotations[record.AnnotationReclaimDeadline])
			if d := deadline.Sub(stop); d < -2*time.Second || d > time.Second {
				t.Errorf("%s: deadline %v, want the VM's stop %v", m.name, deadline, stop)
			}
			// Every pod gone before the stop, each with a grace that ends by it.
			waitUntil(ctx, stop.Add(2*time.Second))
			var rows []string
			for name, rec := range obs.Records() {
				end := rec.DeletedAt.Add(time.Duration(rec.LastGrace) * time.Second)
				rows = append(rows, fmt.Sprintf("%s deleted +%.1fs grace %ds gone +%.1fs", name, rec.DeletedAt.Sub(notice).Seconds(), rec.LastGrace, rec.GoneAt.Sub(notice).Seconds()))
				if rec.GoneAt.IsZero() || rec.GoneAt.After(stop) || end.After(stop.Add(250*time.Millisecond)) {
					t.Errorf("%s: pod %s gone at %v (deleted %v, grace %ds), after the VM's stop %v", m.name, name, rec.GoneAt, rec.DeletedAt, rec.LastGrace, stop)
				}
			}
			sort.Strings(rows)
			results[i] = fmt.Sprintf("%s (stop +%v): %s", m.name, stop.Sub(notice).Round(time.Second), strings.Join(rows, "; "))
		}()
	}
	wg.Wait()
	for _, r := range results {
		t.Log(r)
	}
}

// TestGCPExtendedPreemptionNotice (issue 21 item 2): a Spot VM with a 120 s
// preemptionNoticeDuration. preempted=TRUE turns 150 s before the power-off, and reprieve must
// plan for 150 s: the deadline is the power-off, and a pod whose grace fits is left running
// rather than evicted at once (with 30 s it would have been, with its grace cut to fit 25 s).
// The test ends once the plan is seen, long before the window does.
func TestGCPExtendedPreemptionNotice(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const ns, node = "gcpw-notice", "gcpw-notice-node"
	setupNode(ctx, t, ns, node, nil)
	interruption, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	obs := createObserved(ctx, t, ns, node, interruption, []scenario.Pod{{Name: "grace-60", Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(60)}})
	srv := gcpmeta.New()
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srv.Set(gcpmeta.PathProvisioningModel, "SPOT")
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig,
		"--provider=gcp", "--gcp-metadata-endpoint="+strings.TrimPrefix(url, "http://"), "--gcp-preemption-notice=120s")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	waitReady(ctx, t, srv, node)
	softOff, powerOff := srv.Preempt(120*time.Second, nil, nil)
	notice := time.Now()
	n := waitNode(ctx, t, node, "the deadline annotation", func(n *v1.Node) bool { return n.Annotations[record.AnnotationReclaimDeadline] != "" })
	deadline, err := time.Parse(time.RFC3339, n.Annotations[record.AnnotationReclaimDeadline])
	if err != nil {
		t.Fatal(err)
	}
	if d := deadline.Sub(notice); d < 148*time.Second || d > 151*time.Second {
		t.Errorf("deadline %v after the notice, want 150 s (the power-off at %v; soft-off %v)", d.Round(time.Second), powerOff, softOff)
	}
	if !hasTaint(n, interruption.Key, interruption.Effect) {
		t.Errorf("no interruption taint with the deadline: %+v", n.Spec.Taints)
	}
	// The 60 s pod's last safe moment is about 85 s away: it must still be running 10 s on.
	waitUntil(ctx, notice.Add(10*time.Second))
	if rec, ok := obs.Records()["grace-60"]; !ok || !rec.DeletedAt.IsZero() {
		t.Errorf("pod grace-60 deleted at %v (observed %v), within 10 s of a 150 s notice", rec.DeletedAt, ok)
	}
	t.Logf("notice %v, deadline %v (+%v), soft-off +%v, power-off +%v", notice.Format(time.RFC3339), deadline.Format(time.RFC3339),
		deadline.Sub(notice).Round(time.Second), softOff.Sub(notice).Round(time.Second), powerOff.Sub(notice).Round(time.Second))
}

// kubeletShutdown simulates the kubelet's graceful node shutdown (pkg/kubelet/nodeshutdown),
// which cannot run under kwok: at the soft-off it stops every pod still on the node, the
// non-critical ones with min(their grace, slice), slice being shutdownGracePeriod -
// shutdownGracePeriodCriticalPods. A pod already terminating gets the shorter of its own end
// and now + slice, as the kubelet's pod worker does when a kill with a shorter grace period
// override comes for a pod it is already stopping (pod_workers.go: the running termination is
// cancelled and restarted with the shorter grace). The API server counts a shorter grace from
// the first delete (its new deletionTimestamp is deletionTimestamp - old grace + new grace), so
// the grace sent here is the one that ends the pod then. It returns what it did, per pod.
func kubeletShutdown(ctx context.Context, t *testing.T, ns string, slice time.Duration) map[string]string {
	t.Helper()
	now := time.Now()
	pods, err := env.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("kubelet shutdown: listing pods: %v", err)
		return nil
	}
	did := map[string]string{}
	for _, p := range pods.Items {
		grace := int64(slice / time.Second)
		if p.Spec.TerminationGracePeriodSeconds != nil && *p.Spec.TerminationGracePeriodSeconds < grace {
			grace = *p.Spec.TerminationGracePeriodSeconds
		}
		state := "running"
		if p.DeletionTimestamp != nil && p.DeletionGracePeriodSeconds != nil {
			state = "terminating until " + p.DeletionTimestamp.Format(time.TimeOnly)
			if !p.DeletionTimestamp.Time.After(now.Add(slice)) {
				did[p.Name] = state + ": ends before the kubelet's cut, left alone"
				continue
			}
			// From the first delete to now + slice.
			first := p.DeletionTimestamp.Add(-time.Duration(*p.DeletionGracePeriodSeconds) * time.Second)
			grace = int64(now.Add(slice).Sub(first) / time.Second)
		}
		if err := env.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
			did[p.Name] = state + ": " + err.Error()
			continue
		}
		did[p.Name] = fmt.Sprintf("%s, cut to end by +%v", state, slice)
		if after, err := env.Client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{}); err == nil && after.DeletionTimestamp != nil {
			did[p.Name] += ", now until " + after.DeletionTimestamp.Format(time.TimeOnly)
		}
	}
	return did
}

// TestGCPGracefulShutdownBeside (issue 21 item 4) measures what happens when the kubelet's
// graceful node shutdown acts beside reprieve: GKE stops pods at the ACPI soft-off with 15 s
// for non-critical pods (shutdownGracePeriod 30 s, 15 s of it for critical ones: GKE "Spot
// VMs"). Here a Spot VM has a preemption notice (scaled: 20 s) and the power-off 30 s after
// the soft-off. reprieve plans against the power-off.
//
//   - With the default --safety-margin (5 s) its window ends 25 s after the soft-off, past the
//     kubelet's 15 s: the kubelet cuts the pods reprieve gave more, and stops those it had not
//     reached yet. The subtest asserts that it did cut some (else the measurement says nothing).
//   - With --safety-margin at the kubelet's critical slice (15 s) reprieve's window ends when the
//     kubelet would cut the non-critical pods: each pod reprieve evicted keeps the grace
//     reprieve gave it. The subtest asserts that the kubelet cut none.
//   - With the default margin and the kubelet's own config under --host-root (shutdownGracePeriod
//     30 s, shutdownGracePeriodCriticalPods 15 s), reprieve plans for the kubelet's cut itself:
//     every pod is evicted by the soft-off and gone before the kubelet would stop it. The kubelet
//     cuts none.
//
// Both assert every pod gone before the power-off, and log each pod's timeline.
func TestGCPGracefulShutdownBeside(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		margin  time.Duration
		wantCut bool
		kubelet bool
	}{
		{"default-margin", margin, true, false},
		{"margin-at-the-kubelet-slice", 15 * time.Second, false, false},
		{"kubelet-config-read", margin, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var extra []string
			if tc.kubelet {
				root := t.TempDir()
				dir := filepath.Join(root, "var", "lib", "kubelet")
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				cfg := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 15s\n"
				if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cfg), 0o644); err != nil {
					t.Fatal(err)
				}
				extra = append(extra, "--host-root="+root)
			}
			gracefulShutdownBeside(t, "gcpw-gns-"+strings.Split(tc.name, "-")[0], tc.margin, tc.wantCut, extra...)
		})
	}
}

func gracefulShutdownBeside(t *testing.T, ns string, margin time.Duration, wantCut bool, extra ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	node := ns + "-node"
	const notice, kubeletSlice = 20 * time.Second, 15 * time.Second
	setupNode(ctx, t, ns, node, nil)
	interruption, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	pods := []scenario.Pod{
		{Name: "grace-40", Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(40)},
		{Name: "grace-25", Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(25)},
		{Name: "grace-20", Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(20)},
		{Name: "grace-10", Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(10)},
		{Name: "grace-2", Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(2)},
	}
	obs := createObserved(ctx, t, ns, node, interruption, pods)
	srv := gcpmeta.New()
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srv.Set(gcpmeta.PathProvisioningModel, "SPOT")
	args := append([]string{"--kubeconfig=" + agentKubeconfig, "--provider=gcp", "--gcp-metadata-endpoint=" + strings.TrimPrefix(url, "http://"),
		"--gcp-preemption-notice=" + notice.String(), "--safety-margin=" + margin.String()}, extra...)
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	waitReady(ctx, t, srv, node)
	var mu sync.Mutex
	var did map[string]string
	start := time.Now()
	softOff, powerOff := srv.Preempt(notice, func() {
		d := kubeletShutdown(ctx, t, ns, kubeletSlice)
		mu.Lock()
		did = d
		mu.Unlock()
	}, nil)
	waitUntil(ctx, powerOff.Add(time.Second))

	mu.Lock()
	defer mu.Unlock()
	cut := 0
	for _, p := range pods {
		rec, ok := obs.Records()[p.Name]
		if !ok {
			t.Errorf("pod %s not observed", p.Name)
			continue
		}
		if rec.GoneAt.IsZero() || rec.GoneAt.After(powerOff) {
			t.Errorf("pod %s gone at %v, after the power-off %v", p.Name, rec.GoneAt, powerOff)
		}
		// The grace the pod got, from its first delete to its end, against what that delete
		// asked for (reprieve's plan, or the kubelet's own for a pod it reached first); a second
		// off for whole-second timestamps.
		got := rec.GoneAt.Sub(rec.DeletedAt).Round(time.Second)
		byKubelet := rec.DeletedAt.IsZero() || !rec.DeletedAt.Before(softOff.Add(-200*time.Millisecond))
		// For a pod the kubelet left alone, what reprieve itself asked last counts: a first
		// eviction whose answer outlasted its bound (a loaded server at the notice) is sent
		// again with the grace recomputed, a second less, and that is no cut of the kubelet's.
		asked := rec.Grace
		if !byKubelet && strings.HasSuffix(did[p.Name], "left alone") && rec.LastGrace > 0 && rec.LastGrace < asked {
			asked = rec.LastGrace
		}
		if got < time.Duration(asked-1)*time.Second {
			cut++
		}
		t.Logf("pod %s (grace %ds): first deleted +%.1fs with %ds (%s), gone +%.1fs, got %v; kubelet at the soft-off +%v: %s",
			p.Name, *p.Grace, rec.DeletedAt.Sub(start).Seconds(), rec.Grace, map[bool]string{true: "by the kubelet", false: "by reprieve"}[byKubelet],
			rec.GoneAt.Sub(start).Seconds(), got, softOff.Sub(start).Round(time.Second), did[p.Name])
	}
	t.Logf("--safety-margin %v: the kubelet's shutdown cut %d of %d pods below the grace their first delete gave", margin, cut, len(pods))
	if wantCut && cut == 0 {
		t.Error("the kubelet's shutdown cut no pod: the measurement shows nothing")
	}
	if !wantCut && cut > 0 {
		t.Errorf("the kubelet's shutdown cut %d pods, want none with the margin at its slice", cut)
	}
}

// waitReady waits until the provider has read the machine type and follows both values with
// hanging GETs, and the agent has read its node's accelerators (it logs that), so that the
// windows are known before the notice.
func waitReady(ctx context.Context, t *testing.T, srv *gcpmeta.Server, node string) {
	t.Helper()
	waitFor(ctx, t, node+": reprieve reading the machine type and watching the notices", func() bool {
		return srv.Count(gcpmeta.PathMachineType) > 0 && srv.Waiting(gcpmeta.PathPreempted) > 0 && srv.Waiting(gcpmeta.PathMaintenanceEvent) > 0
	})
	waitFor(ctx, t, node+": reprieve reading its node's accelerators", func() bool {
		b, err := os.ReadFile(filepath.Join(logDir, "reprieve-"+node+".log"))
		return err == nil && bytes.Contains(b, []byte("accelerator"))
	})
}

// waitNodeNoFatal is waitNode for goroutines: nil when the condition did not hold in time.
func waitNodeNoFatal(ctx context.Context, t *testing.T, node string, cond func(*v1.Node) bool) *v1.Node {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil && cond(n) {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// waitUntil sleeps until at, or until ctx ends.
func waitUntil(ctx context.Context, at time.Time) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(at)):
	}
}
