package e2e

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// installDaemonSets applies each shipped DaemonSet (deploy/manifests/daemonset*.yaml: AWS,
// GCP, Azure) to the real API server with kube-controller-manager's daemonset and
// taint-eviction controllers and kube-scheduler running: one reprieve pod lands on each of that
// cloud's spot nodes and none elsewhere; the interruption taint and reprieve's own taints on a
// node evict a pod that does not tolerate them, yet leave that node's reprieve pod running.
// The shipped pod templates need the privileged Pod Security level, as their manifests say:
// baseline refuses AWS's for the host network, and all three for the read-only hostPath volume of
// pressure.source=host. Renders of the chart with pressure.source=summary or off pass baseline
// on GCP and Azure; on AWS the host network still keeps them out.
//
// It runs in TestWithTaintEvictionController's group, whose controller manager runs the
// daemonset controller and kube-scheduler for it.
func installDaemonSets(ctx context.Context, t *testing.T) {
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	if err := env.CreateNamespace(ctx, "baseline"); err != nil {
		t.Fatal(err)
	}
	patchNamespace(ctx, t, "baseline", map[string]string{"pod-security.kubernetes.io/enforce": "baseline"})
	const hostNamespaces, hostPath = "host namespaces", "hostPath volumes"
	for _, c := range []struct {
		cloud, file string
		spot        map[string]string
		// refusals are what baseline refuses the pod template for (none: it passes).
		refusals []string
	}{
		{"aws", "daemonset.yaml", map[string]string{"karpenter.sh/capacity-type": "spot"}, []string{hostNamespaces, hostPath}},
		{"gcp", "daemonset-gcp.yaml", map[string]string{"cloud.google.com/gke-spot": "true"}, []string{hostPath}},
		{"azure", "daemonset-azure.yaml", map[string]string{"kubernetes.azure.com/scalesetpriority": "spot"}, []string{hostPath}},
	} {
		t.Run(c.cloud, func(t *testing.T) { installDaemonSet(ctx, t, c.cloud, c.file, c.spot, c.refusals) })
	}
	// The chart's other pressure sources: no hostPath volume without the kubelet's configuration
	// (readKubeletConfig=false); with it, its read-only hostPath volumes (issue 48, item 3).
	for _, c := range []struct {
		cloud, source, readConfig string
		refusals                  []string
	}{
		{"aws", "summary", "false", []string{hostNamespaces}},
		{"gcp", "host", "false", []string{hostPath}},
		{"gcp", "summary", "false", nil},
		{"gcp", "off", "false", nil},
		{"azure", "host", "false", []string{hostPath}},
		{"azure", "summary", "false", nil},
		{"gcp", "summary", "true", []string{hostPath}},
		{"azure", "off", "true", []string{hostPath}},
	} {
		name := c.cloud + "-" + c.source + "-config-" + c.readConfig
		t.Run("pod-security-"+name, func(t *testing.T) {
			ds, _ := renderDaemonSet(t, name, "--set", "cloud="+c.cloud+",pressure.source="+c.source+",readKubeletConfig="+c.readConfig)
			checkBaseline(ctx, t, name, ds.Spec.Template.Spec, c.refusals)
		})
	}
}

// checkBaseline creates a pod of spec with a dry run in a namespace that enforces the baseline
// Pod Security level, and checks that it is refused for each of refusals (and only then).
func checkBaseline(ctx context.Context, t *testing.T, name string, spec v1.PodSpec, refusals []string) {
	t.Helper()
	probe := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "psa-" + name, Namespace: "baseline"}, Spec: *spec.DeepCopy()}
	// Only the Pod Security check is wanted: not the ServiceAccount and priority class, which
	// belong to kube-system.
	probe.Spec.ServiceAccountName, probe.Spec.DeprecatedServiceAccount, probe.Spec.PriorityClassName, probe.Spec.Priority = "", "", "", nil
	_, err := env.Client.CoreV1().Pods("baseline").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case len(refusals) == 0 && err != nil:
		t.Errorf("the %s pod template fails the baseline Pod Security level: %v", name, err)
	case len(refusals) > 0 && err == nil:
		t.Errorf("the %s pod template passes baseline; want it refused for %s", name, strings.Join(refusals, " and "))
	case len(refusals) > 0:
		for _, r := range refusals {
			if !strings.Contains(err.Error(), r) {
				t.Errorf("baseline refuses the %s pod template with %v; want it refused for %s", name, err, r)
			}
		}
		if !apierrors.IsForbidden(err) {
			t.Errorf("the %s pod template: %v; want a Forbidden from Pod Security admission", name, err)
		}
	}
}

func installDaemonSet(ctx context.Context, t *testing.T, cloud, file string, spot map[string]string, refusals []string) {
	ns := "install-" + cloud
	nodes := []string{ns + "-spot-1", ns + "-spot-2", ns + "-spot-3"}
	setupNode(ctx, t, ns, nodes[0], spot)
	for _, n := range nodes[1:] {
		if _, err := env.CreateNode(ctx, n, spot); err != nil {
			t.Fatal(err)
		}
	}
	// A pool with a NoExecute taint of its own, as GPU pools have: the agent must land there too
	// (it tolerates every taint), or the node's pods die with the machine unannounced.
	patchNode(ctx, t, map[string]any{"spec": map[string]any{"taints": []v1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: v1.TaintEffectNoExecute}}}}, nodes[2])
	onDemand := ns + "-on-demand"
	if _, err := env.CreateNode(ctx, onDemand, nil); err != nil {
		t.Fatal(err)
	}
	// The agent's pods run as soon as kwok sees them: this runs in the serial phase, one cloud
	// after another (the DaemonSets share a name), and only waits for them to run.
	if err := scenario.Apply(ctx, env.Client, readRepoFile(t, "deploy", "manifests", file), scenario.InstantDaemonSets); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = env.Client.AppsV1().DaemonSets("kube-system").Delete(context.Background(), "reprieve", metav1.DeleteOptions{})
	}()
	ds, err := env.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "reprieve", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Pod Security: the pod template, as a pod in a namespace that enforces baseline.
	checkBaseline(ctx, t, cloud, ds.Spec.Template.Spec, refusals)
	checkHardening(t, cloud, ds.Spec.Template.Spec)
	agentPod := func(node string) *v1.Pod {
		list, err := env.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=reprieve"})
		if err != nil {
			t.Fatal(err)
		}
		var found *v1.Pod
		for i := range list.Items {
			if p := &list.Items[i]; p.Spec.NodeName == node {
				if found != nil {
					t.Errorf("two reprieve pods on %s: %s and %s", node, found.Name, p.Name)
				}
				found = p
			}
		}
		return found
	}
	waitFor(ctx, t, "one running reprieve pod on each spot node", func() bool {
		for _, n := range nodes {
			if p := agentPod(n); p == nil || p.Status.Phase != v1.PodRunning {
				return false
			}
		}
		return true
	})
	if p := agentPod(onDemand); p != nil {
		t.Errorf("a reprieve pod on the node its nodeSelector leaves out: %s", p.Name)
	}

	// A workload pod that tolerates nothing: the taint-eviction controller deletes it once the
	// interruption taint is on, which shows the controller at work on this node.
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	if err := scenario.Create(ctx, env.Client, ns, nodes[0], taint, scenario.InstantAll([]scenario.Pod{{Name: "workload", Kind: scenario.Plain, Grace: ptr64(1)}})); err != nil {
		t.Fatal(err)
	}
	before := agentPod(nodes[0])
	n, err := env.Client.CoreV1().Nodes().Get(ctx, nodes[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	cfg := config.DefaultConfig()
	added := []v1.Taint{{Key: taint.Key, Value: taint.Value, Effect: taint.Effect, TimeAdded: &now}}
	for _, spec := range []string{cfg.RebalanceTaint, cfg.MaintenanceTaint} {
		t2, _ := config.ParseTaint(spec)
		added = append(added, t2)
	}
	// The pressure taints of the pressure issue use these keys; the DaemonSet must tolerate them
	// already.
	for _, key := range []string{"reprieve.io/memory-pressure", "reprieve.io/disk-pressure", "reprieve.io/pid-pressure"} {
		added = append(added, v1.Taint{Key: key, Value: "true", Effect: v1.TaintEffectNoSchedule})
	}
	patchNode(ctx, t, map[string]any{"spec": map[string]any{"taints": append(n.Spec.Taints, added...)}}, nodes[0])
	waitFor(ctx, t, "the workload evicted by the taint-eviction controller", func() bool {
		p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "workload", metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
	})
	// For 3 s more, the controllers may do anything else they would do: the agent's pod must stay
	// the same running pod throughout (checked every 100 ms, failing at the first change).
	stayed := func(p *v1.Pod) bool {
		return p != nil && p.UID == before.UID && p.DeletionTimestamp == nil && p.Status.Phase == v1.PodRunning
	}
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Second, true, func(context.Context) (bool, error) {
		return !stayed(agentPod(nodes[0])), nil
	})
	after := agentPod(nodes[0])
	if after == nil || after.UID != before.UID || after.DeletionTimestamp != nil || after.Status.Phase != v1.PodRunning {
		t.Errorf("the reprieve pod on the tainted node: before %s, after %+v; want it still running (its tolerations hold)", before.UID, after)
	}
	var taints []string
	for _, tt := range added {
		taints = append(taints, tt.Key+":"+string(tt.Effect))
	}
	t.Logf("%s: reprieve pods on %d spot nodes; on %s it survived %s", cloud, len(nodes), nodes[0], strings.Join(taints, ", "))
}

func patchNamespace(ctx context.Context, t *testing.T, name string, labels map[string]string) {
	t.Helper()
	ns, err := env.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	maps.Copy(ns.Labels, labels)
	if _, err := env.Client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// checkHardening checks the shipped pod template as the API server stored it, field by field:
// the container's securityContext, the host namespaces (only AWS's host network), and the exact
// set of host paths, each read-only: four files of /proc (never the directory, which would show
// every host process's command line and environment), the cgroup tree, the kubelet's root and
// the image store.
func checkHardening(t *testing.T, cloud string, spec v1.PodSpec) {
	t.Helper()
	// AKS: one init container more, which copies the kubelet's two root-only files (issue 48,
	// item 3): root, but with every capability dropped and a read-only root filesystem.
	wantInit := 0
	if cloud == "azure" {
		wantInit = 1
	}
	if len(spec.Containers) != 1 || len(spec.InitContainers) != wantInit || len(spec.EphemeralContainers) != 0 {
		t.Fatalf("%s: %d containers, %d init containers; want the agent's one and %d init container", cloud, len(spec.Containers), len(spec.InitContainers), wantInit)
	}
	for _, ic := range spec.InitContainers {
		isc := ic.SecurityContext
		if isc == nil || isc.ReadOnlyRootFilesystem == nil || !*isc.ReadOnlyRootFilesystem || isc.AllowPrivilegeEscalation == nil || *isc.AllowPrivilegeEscalation ||
			(isc.Privileged != nil && *isc.Privileged) || isc.Capabilities == nil || len(isc.Capabilities.Add) != 0 || !slices.Equal(isc.Capabilities.Drop, []v1.Capability{"ALL"}) ||
			isc.SeccompProfile == nil || isc.SeccompProfile.Type != v1.SeccompProfileTypeRuntimeDefault || len(ic.Args) == 0 || ic.Args[0] != "copy-kubelet-files" {
			t.Errorf("%s: init container %s %+v, args %q; want copy-kubelet-files, read-only root, no capability, no escalation, RuntimeDefault", cloud, ic.Name, isc, ic.Args)
		}
	}
	c := spec.Containers[0]
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatalf("%s: the agent's container has no securityContext", cloud)
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
		t.Errorf("%s: runAsNonRoot %v, want true", cloud, sc.RunAsNonRoot)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("%s: readOnlyRootFilesystem %v, want true", cloud, sc.ReadOnlyRootFilesystem)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("%s: allowPrivilegeEscalation %v, want false", cloud, sc.AllowPrivilegeEscalation)
	case sc.Privileged != nil && *sc.Privileged:
		t.Errorf("%s: privileged", cloud)
	case sc.Capabilities == nil || len(sc.Capabilities.Add) != 0 || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL":
		t.Errorf("%s: capabilities %+v, want drop [ALL] and no add", cloud, sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != v1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("%s: seccompProfile %+v, want RuntimeDefault", cloud, sc.SeccompProfile)
	case sc.RunAsUser != nil && *sc.RunAsUser == 0:
		t.Errorf("%s: runAsUser 0", cloud)
	case sc.ProcMount != nil && *sc.ProcMount != v1.DefaultProcMount:
		t.Errorf("%s: procMount %s", cloud, *sc.ProcMount)
	}
	if spec.HostNetwork != (cloud == "aws") || spec.HostPID || spec.HostIPC {
		t.Errorf("%s: hostNetwork %v, hostPID %v, hostIPC %v; want only AWS on the host network", cloud, spec.HostNetwork, spec.HostPID, spec.HostIPC)
	}
	for _, p := range c.Ports {
		if p.HostPort != 0 && !spec.HostNetwork {
			t.Errorf("%s: host port %d off the host network", cloud, p.HostPort)
		}
	}
	want := map[string]v1.HostPathType{
		"/proc/meminfo": v1.HostPathFile, "/proc/loadavg": v1.HostPathFile,
		"/proc/sys/kernel/pid_max": v1.HostPathFile, "/proc/sys/kernel/threads-max": v1.HostPathFile,
		"/sys/fs/cgroup": v1.HostPathDirectory, "/var/lib/kubelet": v1.HostPathDirectory, "/var/lib/containerd": v1.HostPathDirectory,
	}
	// The kubelet's configuration where each cloud keeps it (docs/install.md, "Each platform as it
	// is"): nothing more of /etc than that.
	switch cloud {
	case "aws":
		want["/etc/kubernetes/kubelet"] = v1.HostPathDirectory
		// nodeadm's flags (/etc/eks/kubelet/environment); absent on AL2 and Bottlerocket.
		want["/etc/eks/kubelet"] = v1.HostPathDirectoryOrCreate
	case "gcp":
		want["/home/kubernetes/kubelet-config.yaml"] = v1.HostPathFile
	case "azure":
		// The init container's alone; the agent reads its copies.
		want["/etc/default"] = v1.HostPathDirectory
	}
	mounts := map[string]v1.VolumeMount{}
	for _, ic := range spec.InitContainers {
		for _, m := range ic.VolumeMounts {
			mounts[m.Name] = m
		}
	}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	got := map[string]v1.HostPathType{}
	for _, vol := range spec.Volumes {
		if vol.HostPath == nil {
			continue
		}
		typ := v1.HostPathUnset
		if vol.HostPath.Type != nil {
			typ = *vol.HostPath.Type
		}
		got[vol.HostPath.Path] = typ
		m, ok := mounts[vol.Name]
		switch {
		case !ok:
			t.Errorf("%s: host path %s is not mounted", cloud, vol.HostPath.Path)
		case !m.ReadOnly || m.MountPath != "/host"+vol.HostPath.Path:
			t.Errorf("%s: host path %s mounted at %s (read-only %v); want read-only at /host%s", cloud, vol.HostPath.Path, m.MountPath, m.ReadOnly, vol.HostPath.Path)
		case m.MountPropagation != nil && *m.MountPropagation != v1.MountPropagationNone:
			t.Errorf("%s: host path %s with mount propagation %s", cloud, vol.HostPath.Path, *m.MountPropagation)
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("%s: host paths %v; want exactly %v", cloud, got, want)
	}
}
