package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/kubelet"
	"github.com/reprieve-dev/reprieve/test/profiles"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// profilesLabel marks the nodes of installOnProfiles, and its DaemonSets select only them, so
// that they neither land on the nodes of InstallDaemonSet (which runs beside it) nor count
// those. The chart's own selection is ANDed with it and is what the test asserts.
const profilesLabel = "reprieve.test/profiles"

// installOnProfiles installs the chart as each cloud's values file renders it
// (deploy/chart/values-<cloud>.yaml) beside nodes of every platform profile (test/profiles):
// EKS managed node group and Karpenter on AL2023, GKE Spot, AKS spot, Windows spot nodes of
// Karpenter and AKS, and an on-demand EKS node. With kube-controller-manager's daemonset
// controller and kube-scheduler, an agent pod runs on every Linux spot node of every profile,
// whatever the cloud's values, and on no Windows or on-demand node; the DaemonSet's status
// counts exactly those. And the agent reads each of its cloud's profiles through the render's
// mounts: the host paths the chart mounts for the kubelet's configuration exist on that
// platform's node with their hostPath type, and kubelet.FindConfig over just what they show, at
// the container's --host-root with its --kubelet-config flags, gives the profile's thresholds,
// drop-ins and graceful shutdown.
//
// It runs in TestWithTaintEvictionController's group (the daemonset controller and the
// scheduler), the three clouds side by side, each with its own DaemonSet and nodes.
func installOnProfiles(ctx context.Context, t *testing.T) {
	for _, cloud := range []string{"aws", "gcp", "azure"} {
		t.Run(cloud, func(t *testing.T) {
			t.Parallel()
			installOnProfilesCloud(ctx, t, cloud)
		})
	}
}

// profileNodes are the profiles installOnProfiles puts a node of, and an on-demand EKS node.
func profileNodes() []profiles.Profile {
	all := profiles.All()
	onDemand := profiles.EKSManagedNodeGroup()
	onDemand.Name, onDemand.Spot = "eks-mng-on-demand", false
	onDemand.Labels = withLabels(onDemand.Labels, map[string]string{"eks.amazonaws.com/capacityType": "ON_DEMAND", "eks.amazonaws.com/nodegroup": "on-demand-ng"})
	return append(all, onDemand)
}

// withLabels is a copy of a with b's entries added.
func withLabels(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	maps.Copy(out, b)
	return out
}

// createProfileNode creates a kwok node of profile p named name, with more labels, and waits
// until it is Ready and, when the node-lifecycle controller runs, its not-ready taint is gone.
// The node is deleted when the test ends.
func createProfileNode(ctx context.Context, t *testing.T, name string, p profiles.Profile, labels map[string]string) *v1.Node {
	t.Helper()
	n := p.Node(name)
	n.Labels = withLabels(n.Labels, labels)
	created, err := env.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating node %s of %s: %v", name, p.Name, err)
	}
	t.Cleanup(func() { _ = env.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	if !created.Status.Allocatable.Memory().Equal(*n.Status.Allocatable.Memory()) {
		// The API server dropped the status on create: set it through the status subresource.
		created.Status = n.Status
		if _, err := env.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("setting the status of node %s: %v", name, err)
		}
	}
	waitTaint := env.ControllerManagerRunning("nodelifecycle")
	var last *v1.Node
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = got
		ready := false
		for _, c := range got.Status.Conditions {
			ready = ready || (c.Type == v1.NodeReady && c.Status == v1.ConditionTrue)
		}
		notReadyTaint := slices.ContainsFunc(got.Spec.Taints, func(tt v1.Taint) bool { return tt.Key == v1.TaintNodeNotReady })
		return ready && (!waitTaint || !notReadyTaint), nil
	})
	if err != nil {
		t.Fatalf("node %s (%s) not ready: %v (last %+v)", name, p.Name, err, last)
	}
	// kwok keeps what the kubelet would have reported: the profile's allocatable and nodeInfo.
	if a := last.Status.Allocatable.Memory(); !a.Equal(*n.Status.Allocatable.Memory()) || last.Status.NodeInfo.OperatingSystem != p.OS {
		t.Fatalf("node %s: allocatable memory %s, os %q; want the profile's %s, %s", name, a, last.Status.NodeInfo.OperatingSystem, n.Status.Allocatable.Memory(), p.OS)
	}
	return last
}

func installOnProfilesCloud(ctx context.Context, t *testing.T, cloud string) {
	name := "profiles-" + cloud
	// A metrics port of its own: InstallDaemonSet's shipped AWS DaemonSet, beside it in the
	// group, selects every spot node too (these ones included), and on the host network its
	// agent holds 10271 there.
	ds, _ := renderDaemonSet(t, name, "-f", "deploy/chart/values-"+cloud+".yaml", "--set", "metrics.port=10371")
	checkProfileMounts(t, cloud, ds)

	nodes := map[string]profiles.Profile{}
	var wantAgents []string
	for _, p := range profileNodes() {
		node := "prof-" + cloud + "-" + p.Name
		nodes[node] = p
		createProfileNode(ctx, t, node, p, map[string]string{profilesLabel: cloud})
		if p.Linux() && p.Spot {
			wantAgents = append(wantAgents, node)
		}
	}
	slices.Sort(wantAgents)

	// The render, as its own DaemonSet beside InstallDaemonSet's kube-system/reprieve: its own
	// name and instance label, and only this test's nodes.
	ds.Name = name
	for _, m := range []map[string]string{ds.Labels, ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels} {
		m["app.kubernetes.io/instance"] = name
	}
	if ds.Spec.Template.Spec.NodeSelector == nil {
		ds.Spec.Template.Spec.NodeSelector = map[string]string{}
	}
	ds.Spec.Template.Spec.NodeSelector[profilesLabel] = cloud
	scenario.InstantTemplate(&ds.Spec.Template) // the serial phase (TestWithTaintEvictionController)
	if _, err := env.Client.AppsV1().DaemonSets("kube-system").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	selector := "app.kubernetes.io/name=reprieve,app.kubernetes.io/instance=" + name
	t.Cleanup(func() {
		bg := context.Background()
		_ = env.Client.AppsV1().DaemonSets("kube-system").Delete(bg, name, metav1.DeleteOptions{})
		// No garbage collector runs here: the pods go with the DaemonSet only when deleted.
		_ = env.Client.CoreV1().Pods("kube-system").DeleteCollection(bg, metav1.DeleteOptions{GracePeriodSeconds: ptr64(0)},
			metav1.ListOptions{LabelSelector: selector})
	})

	agents := func() (running, placed []string) {
		list, err := env.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Items {
			if p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
				continue
			}
			placed = append(placed, p.Spec.NodeName)
			if p.Status.Phase == v1.PodRunning {
				running = append(running, p.Spec.NodeName)
			}
		}
		slices.Sort(running)
		slices.Sort(placed)
		return running, placed
	}
	var running, placed []string
	var status appsv1.DaemonSetStatus
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		running, placed = agents()
		got, err := env.Client.AppsV1().DaemonSets("kube-system").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		status = got.Status
		return slices.Equal(running, wantAgents) && int(status.NumberReady) == len(wantAgents), nil
	})
	if err != nil {
		t.Fatalf("%s values: agents running on %v (placed on %v); want exactly %v: %v", cloud, running, placed, wantAgents, err)
	}
	// For 2 s more, no agent lands on a Windows or on-demand node.
	time.Sleep(2 * time.Second)
	running, placed = agents()
	if !slices.Equal(placed, wantAgents) {
		t.Errorf("%s values: agents placed on %v, want exactly the Linux spot nodes %v", cloud, placed, wantAgents)
	}
	for _, node := range placed {
		if p := nodes[node]; !p.Linux() || !p.Spot {
			t.Errorf("%s values: an agent on %s, a %s %s node (spot %v)", cloud, node, p.Name, p.OS, p.Spot)
		}
	}
	if int(status.DesiredNumberScheduled) != len(wantAgents) {
		t.Errorf("%s values: the DaemonSet wants %d pods, want %d (the Linux spot nodes %v)", cloud, status.DesiredNumberScheduled, len(wantAgents), wantAgents)
	}
	t.Logf("%s values: agents on %v; none on the Windows and on-demand nodes", cloud, running)
}

// checkProfileMounts checks the kubelet configuration the agent of ds reads on each Linux profile
// of cloud: each host path ds mounts for it exists there with its hostPath type, and the
// configuration found through the mounts alone is the profile's.
func checkProfileMounts(t *testing.T, cloud string, ds *appsv1.DaemonSet) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	envs := map[string]string{}
	for _, e := range c.Env {
		envs[e.Name] = e.Value
	}
	hostRoot := envs["REPRIEVE_HOST_ROOT"]
	if hostRoot == "" {
		t.Fatalf("%s: the agent has no REPRIEVE_HOST_ROOT: %v", cloud, c.Env)
	}
	mounts := map[string]v1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	checked := 0
	for _, p := range profiles.All() {
		if p.Cloud != cloud || !p.Linux() {
			continue
		}
		checked++
		root, view := t.TempDir(), t.TempDir()
		if err := p.WriteHostRoot(root); err != nil {
			t.Fatal(err)
		}
		// The init containers first, as the kubelet runs them: the emptyDirs they fill (AKS's
		// copy of the kubelet's root-only files) are what the agent then mounts.
		emptyDirs := runInitContainers(t, cloud, p, spec, root)
		configVolumes := 0
		for _, vol := range spec.Volumes {
			if dir, ok := emptyDirs[vol.Name]; ok {
				m, mounted := mounts[vol.Name]
				if !mounted {
					continue
				}
				configVolumes++
				rel, ok := strings.CutPrefix(m.MountPath, hostRoot)
				if !ok {
					t.Errorf("%s: %s mounted at %s, outside --host-root %s", cloud, vol.Name, m.MountPath, hostRoot)
					continue
				}
				if err := copyPath(filepath.Join(dir, m.SubPath), filepath.Join(view, rel)); err != nil {
					t.Errorf("%s on a %s node: the agent's mount of %s: %v", cloud, p.Name, vol.Name, err)
				}
				continue
			}
			if vol.HostPath == nil || !strings.HasPrefix(vol.Name, "host-kubelet-config") {
				continue
			}
			configVolumes++
			m, ok := mounts[vol.Name]
			if !ok {
				t.Errorf("%s: volume %s is not mounted", cloud, vol.Name)
				continue
			}
			src := filepath.Join(root, vol.HostPath.Path)
			st, err := os.Stat(src)
			typ := v1.HostPathUnset
			if vol.HostPath.Type != nil {
				typ = *vol.HostPath.Type
			}
			switch {
			case err != nil && (typ == v1.HostPathDirectoryOrCreate || typ == v1.HostPathFileOrCreate):
				continue // the kubelet creates it empty: nothing to read there
			case err != nil:
				t.Errorf("%s: the chart mounts %s (%s), which a %s node lacks: the agent's pod would not start there", cloud, vol.HostPath.Path, typ, p.Name)
				continue
			case typ == v1.HostPathDirectory && !st.IsDir(), typ == v1.HostPathFile && !st.Mode().IsRegular():
				t.Errorf("%s: the chart mounts %s as %s; on a %s node it is %s", cloud, vol.HostPath.Path, typ, p.Name, st.Mode().Type())
				continue
			}
			rel, ok := strings.CutPrefix(m.MountPath, hostRoot)
			if !ok {
				t.Errorf("%s: %s mounted at %s, outside --host-root %s", cloud, vol.HostPath.Path, m.MountPath, hostRoot)
				continue
			}
			if err := copyPath(src, filepath.Join(view, rel)); err != nil {
				t.Fatal(err)
			}
		}
		if configVolumes == 0 {
			t.Errorf("%s: the render mounts no kubelet configuration", cloud)
		}
		kc, err := kubelet.FindConfig(kubelet.Lookup{HostRoot: view, Path: envs["REPRIEVE_KUBELET_CONFIG"], DropInDir: envs["REPRIEVE_KUBELET_CONFIG_DIR"]})
		if err != nil {
			t.Errorf("%s on %s: %v", cloud, p.Name, err)
			continue
		}
		var hard []string
		for _, th := range kc.Hard {
			hard = append(hard, th.String())
		}
		var dropIns []string
		for _, d := range kc.DropIns {
			dropIns = append(dropIns, strings.TrimPrefix(d, view))
		}
		got := fmt.Sprintf("found %v at %s, drop-ins %v, evictionHard %v, shutdown %v/%v", kc.Found, strings.TrimPrefix(kc.Path, view), dropIns, hard,
			kc.ShutdownGracePeriod, kc.ShutdownGracePeriodCriticalPods)
		want := fmt.Sprintf("found true at %s, drop-ins %v, evictionHard %v, shutdown %v/%v", p.ConfigPath, p.DropIns, p.Hard,
			p.ShutdownGracePeriod, p.ShutdownGracePeriodCriticalPods)
		if got != want {
			t.Errorf("%s values on a %s node, through the chart's mounts: %s\nwant %s", cloud, p.Name, got, want)
		} else {
			t.Logf("%s values on a %s node: %s", cloud, p.Name, got)
		}
	}
	if checked == 0 {
		t.Errorf("%s: no Linux profile", cloud)
	}
}

// runInitContainers runs the init containers of spec as the kubelet would on a node whose host
// filesystem is root: each with its hostPath volumes at their mount paths and the pod's
// emptyDirs, its command the reprieve binary with the container's args, those paths rewritten to
// the test's folders. It returns each emptyDir volume's folder as the init containers left it.
func runInitContainers(t *testing.T, cloud string, p profiles.Profile, spec v1.PodSpec, root string) map[string]string {
	t.Helper()
	emptyDirs := map[string]string{}
	hostPaths := map[string]*v1.HostPathVolumeSource{}
	for _, vol := range spec.Volumes {
		switch {
		case vol.EmptyDir != nil:
			emptyDirs[vol.Name] = t.TempDir()
		case vol.HostPath != nil:
			hostPaths[vol.Name] = vol.HostPath
		}
	}
	for _, ic := range spec.InitContainers {
		fsRoot := t.TempDir() // the container's own filesystem, where its mounts are
		type mount struct{ at, dir string }
		var ms []mount
		for _, m := range ic.VolumeMounts {
			switch {
			case emptyDirs[m.Name] != "":
				ms = append(ms, mount{m.MountPath, emptyDirs[m.Name]})
			case hostPaths[m.Name] != nil:
				if !m.ReadOnly {
					t.Errorf("%s: init container %s mounts host path %s writable", cloud, ic.Name, hostPaths[m.Name].Path)
				}
				src := filepath.Join(root, hostPaths[m.Name].Path)
				if _, err := os.Stat(src); err != nil {
					t.Errorf("%s: init container %s mounts %s, which a %s node lacks", cloud, ic.Name, hostPaths[m.Name].Path, p.Name)
					continue
				}
				if err := copyPath(src, filepath.Join(fsRoot, m.MountPath)); err != nil {
					t.Fatal(err)
				}
				ms = append(ms, mount{m.MountPath, filepath.Join(fsRoot, m.MountPath)})
			}
		}
		// A container path in an argument: under a mount, the mount's folder; else the
		// container's own filesystem.
		local := func(path string) string {
			for _, m := range ms {
				if rest, ok := strings.CutPrefix(path, m.at); ok && (rest == "" || strings.HasPrefix(rest, "/")) {
					return m.dir + rest
				}
			}
			return filepath.Join(fsRoot, path)
		}
		var args []string
		for _, a := range ic.Args {
			if name, val, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "--") && strings.HasPrefix(val, "/") {
				a = name + "=" + local(val)
			}
			args = append(args, a)
		}
		if ic.SecurityContext == nil || ic.SecurityContext.ReadOnlyRootFilesystem == nil || !*ic.SecurityContext.ReadOnlyRootFilesystem ||
			ic.SecurityContext.Capabilities == nil || !slices.Equal(ic.SecurityContext.Capabilities.Drop, []v1.Capability{"ALL"}) ||
			ic.SecurityContext.AllowPrivilegeEscalation == nil || *ic.SecurityContext.AllowPrivilegeEscalation {
			t.Errorf("%s: init container %s securityContext %+v; want a read-only root, every capability dropped, no privilege escalation", cloud, ic.Name, ic.SecurityContext)
		}
		out, err := exec.Command(reprieveBin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("%s on a %s node: init container %s (%s): %v\n%s", cloud, p.Name, ic.Name, strings.Join(ic.Args, " "), err, out)
		}
	}
	return emptyDirs
}

// copyPath copies the file or directory tree src to dst.
func copyPath(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, data, st.Mode().Perm())
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.CopyFS(dst, os.DirFS(src))
}
