package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// chartDir is the chart, relative to the repository root.
const chartDir = "deploy/chart/reprieve"

// helmBin returns the helm that test/tools/helm.sh builds into the tools folder.
func helmBin(t *testing.T) string {
	t.Helper()
	dir, err := testenv.ToolsBin()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "helm")
	if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
		msg := fmt.Sprintf("helm is missing from %s: run `make tools` (or `make helm`)", dir)
		if os.Getenv("REPRIEVE_E2E_REQUIRED") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}

// helm runs helm with args in the repository root and returns its standard output. A render
// or lint that names no cloud (no cloud= value, no values file) is an AWS release: the chart has
// no default cloud and fails without one (TestChart's lint names the choice).
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	if len(args) > 0 && (args[0] == "template" || args[0] == "lint") && !namesCloud(args) {
		args = append(slices.Clone(args), "--set", "cloud=aws")
	}
	cmd := exec.Command(helmBin(t), args...)
	cmd.Dir = repoRoot(t)
	// No user config or cache of this machine's helm: the test sees the chart alone.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out, nil
}

// namesCloud says whether helm args choose the cloud: a cloud= value or a values file.
func namesCloud(args []string) bool {
	for _, a := range args {
		if a == "-f" || a == "--values" || strings.Contains(a, "cloud=") || strings.Contains(a, `"cloud"`) {
			return true
		}
	}
	return false
}

// render is `helm template` of the chart as release in kube-system, with more helm args
// (-f FILE, --set K=V).
func render(t *testing.T, release string, args ...string) []byte {
	t.Helper()
	out, err := helm(t, append([]string{"template", release, chartDir, "--namespace", "kube-system"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// chartCase is one set of chart values the tests render.
type chartCase struct {
	name string
	args []string
}

// chartCases are the values files the repository ships and the combinations of values that
// change the templates' shape.
var chartCases = []chartCase{
	{"defaults", nil},
	{"aws", []string{"-f", "deploy/chart/values-aws.yaml"}},
	{"gcp", []string{"-f", "deploy/chart/values-gcp.yaml"}},
	{"azure", []string{"-f", "deploy/chart/values-azure.yaml"}},
	{"gpu-pool", []string{"-f", "deploy/chart/examples/gpu-pool.yaml"}},
	{"aws-summary", []string{"--set", "cloud=aws,pressure.source=summary,pressure.kubeletInsecureTLS=true"}},
	{"gcp-summary", []string{"--set", "cloud=gcp,pressure.source=summary"}},
	{"azure-summary", []string{"--set", "cloud=azure,pressure.source=summary"}},
	{"azure-off", []string{"--set", "cloud=azure,pressure.source=off"}},
	{"every-value", []string{"-f", "deploy/chart/values-gcp.yaml", "--set-json", `{
		"metrics": {"port": 9090}, "interruptionTaint": "example.com/reclaim:NoExecute",
		"interruptionEviction": "reprieve", "safetyMargin": "10s", "dryRun": true, "extraArgs": ["--evict-daemonset-pods", "-v=2"],
		"webhook": {"urlSecret": {"name": "hook", "key": "endpoint"}, "headersSecret": {"name": "hook-headers"}},
		"pressure": {"thresholds": "memory.available<500Mi,nodefs.available<15%", "headroom": "0.05",
			"transitionPeriod": "2m", "kubeletConfig": "/etc/kubernetes/kubelet.yaml"},
		"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
			{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["batch"]}]}]}}},
		"tolerateAllTaints": false,
		"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}],
		"logFormat": "json", "extraEnv": [{"name": "REPRIEVE_EVICTION_WORKERS", "value": "32"}],
		"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
		"podLabels": {"team": "platform"}, "podAnnotations": {"example.com/owner": "platform"},
		"podMonitor": {"enabled": true, "labels": {"release": "kube-prometheus-stack"}},
		"prometheusRule": {"enabled": true}, "grafanaDashboard": {"enabled": true}}`}},
}

// testChartLint runs `helm lint --strict` on the chart with each case's values, and checks
// that values the chart cannot render are refused with a message that names them.
func testChartLint(t *testing.T) {
	for _, c := range chartCases {
		if _, err := helm(t, append([]string{"lint", "--strict", chartDir}, c.args...)...); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	for _, bad := range []struct{ set, want string }{
		{"cloud=oracle", "cloud"},
		// No cloud: the release fails and names the choice.
		{"cloud=", "choose the cloud this release runs on, aws (EKS), gcp (GKE) or azure (AKS)"},
		{"nodes=ondemand", "nodes"},
		{"pressure.source=proc", "source"},
		{"interruptionTaint=cloud=spot:NoSchedule", "interruptionTaint"},
		{"interruptionEviction=budgets", "interruptionEviction"},
		{"pressure.source=off,pressure.kubeletInsecureTLS=true", "pressure.source=summary or host only"},
		{"metrics.port=0", "port"},
		// Misspelled keys are errors, not silently ignored values.
		{"toleration[0].operator=Exists", "toleration"},
		{"nodeselector.pool=gpu", "nodeselector"},
		{"podMonitor.enable=true", "enable"},
		{"evictionGuard.replica=3", "replica"},
		{"logFormat=xml", "logFormat"},
	} {
		_, err := helm(t, "template", "reprieve", chartDir, "--set", bad.set)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("--set %s: %v; want an error naming %s", bad.set, err, bad.want)
		}
	}
}

// testManifestsRendered checks that deploy/manifests/ is what `make manifests` renders from
// the chart now (deploy/chart/render.sh), file for file.
func testManifestsRendered(t *testing.T) {
	root := repoRoot(t)
	out := t.TempDir()
	cmd := exec.Command("bash", filepath.Join(root, "deploy", "chart", "render.sh"), out)
	cmd.Env = append(os.Environ(), "HELM="+helmBin(t), "HELM_CONFIG_HOME="+out, "HELM_CACHE_HOME="+out, "HELM_DATA_HOME="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("deploy/chart/render.sh: %v\n%s", err, b)
	}
	rendered, err := filepath.Glob(filepath.Join(out, "*.yaml"))
	if err != nil || len(rendered) < 5 {
		t.Fatalf("render.sh wrote %v (%v); want the five manifests", rendered, err)
	}
	for _, path := range rendered {
		name := filepath.Base(path)
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(root, "deploy", "manifests", name))
		if err != nil {
			t.Errorf("deploy/manifests/%s: %v; run `make manifests`", name, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("deploy/manifests/%s differs from a fresh render of %s%s: run `make manifests`",
				name, chartDir, firstLineDiff(got, want))
		}
	}
}

// firstLineDiff describes the first line where got and want differ.
func firstLineDiff(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(g), len(w)) {
		gl, wl := "<end of file>", "<end of file>"
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf(" (line %d is %q, the render has %q)", i+1, gl, wl)
		}
	}
	return ""
}

// testChartRendersApplyServerDryRun renders every case and applies each object with a
// server-side dry run on the real API server, as TestManifestsApplyServerDryRun does for the
// plain manifests. The Prometheus Operator's kinds are left out (no CRDs here) and checked
// against deploy/prometheus/ instead.
func testChartRendersApplyServerDryRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := newDryRunner(t)
	applied := 0
	for _, c := range chartCases {
		release := "reprieve"
		if c.name == "gpu-pool" {
			release = "reprieve-gpu"
		}
		var kube bytes.Buffer
		for _, obj := range manifestObjects(t, c.name, render(t, release, c.args...)) {
			if obj.GroupVersionKind().Group == "monitoring.coreos.com" {
				checkMonitoring(t, c.name, obj.Object)
				continue
			}
			b, err := yaml.Marshal(obj.Object)
			if err != nil {
				t.Fatal(err)
			}
			kube.WriteString("---\n")
			kube.Write(b)
		}
		applied += d.apply(ctx, t, c.name, kube.Bytes())
	}
	t.Logf("%d objects from %d renders applied with a server-side dry run", applied, len(chartCases))
}

// checkMonitoring checks the chart's PodMonitor and PrometheusRule against deploy/prometheus/.
func checkMonitoring(t *testing.T, source string, obj map[string]any) {
	t.Helper()
	kind, _ := obj["kind"].(string)
	switch kind {
	case "PrometheusRule":
		var plain map[string]any
		if err := yaml.Unmarshal(readRepoFile(t, "deploy", "prometheus", "rules.yaml"), &plain); err != nil {
			t.Fatal(err)
		}
		spec, _ := obj["spec"].(map[string]any)
		if !reflect.DeepEqual(spec["groups"], plain["groups"]) {
			t.Errorf("%s: the chart's PrometheusRule differs from deploy/prometheus/rules.yaml: run `make manifests`", source)
		}
	case "PodMonitor":
		if meta, _ := obj["metadata"].(map[string]any); meta != nil {
			if l, _ := meta["labels"].(map[string]any); l["app.kubernetes.io/component"] == "eviction-guard" {
				return // the guard's own scrape, checked by TestCPUBound/EvictionGuardChartPodMonitor
			}
		}
		var plain map[string]any
		if err := yaml.Unmarshal(readRepoFile(t, "deploy", "prometheus", "podmonitor.yaml"), &plain); err != nil {
			t.Fatal(err)
		}
		// The same scrape as deploy/prometheus/podmonitor.yaml; the selector may add the
		// release's instance label.
		want, got := map[string]any{}, map[string]any{}
		w, _ := plain["spec"].(map[string]any)
		g, _ := obj["spec"].(map[string]any)
		for _, k := range []string{"jobLabel", "namespaceSelector", "podMetricsEndpoints"} {
			got[k], want[k] = g[k], w[k]
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the chart's PodMonitor scrapes otherwise than deploy/prometheus/podmonitor.yaml:\n got %v\nwant %v", source, got, want)
		}
	default:
		t.Errorf("%s: unexpected %s", source, kind)
	}
}

// chartObjects decodes a render into typed objects, leaving out the Prometheus Operator's.
func chartObjects(t *testing.T, source string, manifest []byte) []runtime.Object {
	t.Helper()
	var objs []runtime.Object
	for _, u := range manifestObjects(t, source, manifest) {
		if u.GroupVersionKind().Group == "monitoring.coreos.com" {
			continue
		}
		b, err := u.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(b, nil, nil)
		if err != nil {
			t.Fatalf("%s: %s: %v", source, u.GetKind(), err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// renderDaemonSet renders the chart and returns its DaemonSet and ClusterRole (nil when the
// render has none).
func renderDaemonSet(t *testing.T, source string, args ...string) (*appsv1.DaemonSet, *rbacv1.ClusterRole) {
	t.Helper()
	var ds *appsv1.DaemonSet
	var role *rbacv1.ClusterRole
	for _, obj := range chartObjects(t, source, render(t, "reprieve", args...)) {
		switch o := obj.(type) {
		case *appsv1.DaemonSet:
			ds = o
		case *rbacv1.ClusterRole:
			// The agent's, not the eviction guard's (get pods only) nor the uninstall hook's.
			if c := o.Labels["app.kubernetes.io/component"]; c != "eviction-guard" && c != "cleanup" {
				role = o
			}
		}
	}
	if ds == nil {
		t.Fatalf("%s: no DaemonSet in the render", source)
	}
	return ds, role
}

// settings is what the agent's container sets, as flags: its args, and each REPRIEVE_<FLAG>
// variable as --flag=value (and a "true" one also as the bare --flag). The chart passes its
// settings as variables so that `reprieve doctor` run in the pod sees them too.
func settings(c v1.Container) []string {
	out := slices.Clone(c.Args)
	for _, e := range c.Env {
		name, ok := strings.CutPrefix(e.Name, "REPRIEVE_")
		if !ok {
			continue
		}
		flag := "--" + strings.ToLower(strings.ReplaceAll(name, "_", "-"))
		out = append(out, flag+"="+e.Value)
		if e.Value == "true" {
			out = append(out, flag)
		}
	}
	return out
}

// hostSourcePaths are the host paths the DaemonSet mounts for pressure.source=host, and
// kubeletConfigPaths where each cloud keeps the kubelet's configuration, which it mounts too
// unless pressure.kubeletConfig names the file.
var (
	hostSourcePaths = []string{"/proc/meminfo", "/proc/loadavg", "/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max", "/sys/fs/cgroup", "/var/lib/kubelet", "/var/lib/containerd"}
	// (azure: the init container's /etc/default, from which it copies the two root-only files).
	kubeletConfigPaths = map[string][]string{"aws": {"/etc/kubernetes/kubelet", "/etc/eks/kubelet"}, "gcp": {"/home/kubernetes/kubelet-config.yaml"}, "azure": {"/etc/default"}}
	// excludedNodeKeys end every term of the DaemonSet's node affinity: no Fargate, no
	// virtual-kubelet node (issue 48, item 2).
	excludedNodeKeys = []string{"eks.amazonaws.com/compute-type", "type"}
	// everySpotLabel is the chart's default selection, one term per platform's spot label, each
	// with the exclusions.
	everySpotLabel = withExcludedKeys("karpenter.sh/capacity-type", "eks.amazonaws.com/capacityType", "cloud.google.com/gke-spot", "cloud.google.com/gke-preemptible", "kubernetes.azure.com/scalesetpriority")
	linuxOnly      = map[string]string{"kubernetes.io/os": "linux"}
)

// withExcludedKeys is the keys of node affinity terms, one per key given, each followed by
// excludedNodeKeys.
func withExcludedKeys(keys ...string) []string {
	var out []string
	for _, k := range keys {
		out = append(append(out, k), excludedNodeKeys...)
	}
	return out
}

// testChartValues checks what each value does to the rendered DaemonSet, ClusterRole and
// admission policy.
func testChartValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  string
		// hostNetwork: whether the pod uses the host network; hostPaths: the host paths it
		// mounts (read-only, under /host); nodesStats: whether the ClusterRole grants get on
		// nodes/stats.
		hostNetwork, nodesStats bool
		hostPaths               []string
		args, absentArgs        []string
		nodeSelector            map[string]string
		affinityKeys            []string
	}{
		{name: "aws", set: "cloud=aws", hostNetwork: true, hostPaths: append(slices.Clone(hostSourcePaths), kubeletConfigPaths["aws"]...), nodesStats: true,
			args:         []string{"--provider=aws", "--metrics-bind-address=:10271", "--pressure-source=host", "--host-root=/host"},
			absentArgs:   []string{"--kubelet-insecure-tls", "--dry-run", "--safety-margin", "--interruption-taint", "--pressure-thresholds", "--pressure-headroom", "--pressure-transition-period", "--kubelet-config", "--webhook"},
			nodeSelector: linuxOnly, affinityKeys: everySpotLabel},
		{name: "gcp", set: "cloud=gcp", hostPaths: append(slices.Clone(hostSourcePaths), kubeletConfigPaths["gcp"]...), nodesStats: true,
			args:         []string{"--provider=gcp", "--pressure-source=host", "--host-root=/host"},
			nodeSelector: linuxOnly, affinityKeys: everySpotLabel},
		{name: "azure-summary", set: "cloud=azure,pressure.source=summary,pressure.kubeletInsecureTLS=true,readKubeletConfig=false", nodesStats: true,
			args:         []string{"--provider=azure", "--pressure-source=summary", "--kubelet-insecure-tls"},
			absentArgs:   []string{"--host-root"},
			nodeSelector: linuxOnly, affinityKeys: everySpotLabel},
		{name: "gcp-off", set: "cloud=gcp,pressure.source=off,readKubeletConfig=false",
			args: []string{"--pressure-source=off"}, absentArgs: []string{"--host-root", "--kubelet-insecure-tls"},
			nodeSelector: linuxOnly, affinityKeys: everySpotLabel},
		// With summary or off, the kubelet's configuration is still read by default (issue 48,
		// item 3): its mounts alone, under --host-root.
		{name: "azure-summary-config", set: "cloud=azure,pressure.source=summary", nodesStats: true, hostPaths: kubeletConfigPaths["azure"],
			args: []string{"--pressure-source=summary", "--host-root=/host"}, nodeSelector: linuxOnly, affinityKeys: everySpotLabel},
		{name: "gcp-off-config", set: "cloud=gcp,pressure.source=off", hostPaths: kubeletConfigPaths["gcp"],
			args: []string{"--pressure-source=off", "--host-root=/host"}, nodeSelector: linuxOnly, affinityKeys: everySpotLabel},
		// nodes=all: every Linux node but Fargate and virtual-kubelet ones, one term.
		{name: "all-nodes", set: "cloud=aws,nodes=all,pressure.source=off,readKubeletConfig=false", hostNetwork: true,
			args: []string{"--provider=aws"}, nodeSelector: linuxOnly, affinityKeys: excludedNodeKeys},
		// A selection of the user's replaces the default whole; Linux stays selected.
		{name: "pool-selector", affinityKeys: excludedNodeKeys, set: "cloud=gcp,nodeSelector.pool=gpu,pressure.thresholds=memory.available<1Gi,pressure.headroom=0.1,pressure.transitionPeriod=1m,pressure.kubeletConfig=/etc/kubernetes/kubelet.yaml,safetyMargin=9s,dryRun=true",
			hostPaths: append(slices.Clone(hostSourcePaths), "/etc/kubernetes/kubelet.yaml"), nodesStats: true,
			args:         []string{"--pressure-thresholds=memory.available<1Gi", "--pressure-headroom=0.1", "--pressure-transition-period=1m", "--kubelet-config=/etc/kubernetes/kubelet.yaml", "--safety-margin=9s", "--dry-run"},
			nodeSelector: map[string]string{"pool": "gpu", "kubernetes.io/os": "linux"}},
		{name: "crio", set: "cloud=azure,pressure.imageFsDir=/var/lib/containers/storage,pressure.kubeletRootDir=/data/kubelet",
			hostPaths:    []string{"/proc/meminfo", "/proc/loadavg", "/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max", "/sys/fs/cgroup", "/data/kubelet", "/var/lib/containers/storage", kubeletConfigPaths["azure"][0]},
			nodesStats:   true,
			args:         []string{"--imagefs-dir=/var/lib/containers/storage", "--kubelet-root-dir=/data/kubelet"},
			nodeSelector: linuxOnly, affinityKeys: everySpotLabel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, role := renderDaemonSet(t, tc.name, "--set", tc.set)
			spec := ds.Spec.Template.Spec
			c := spec.Containers[0]
			if spec.HostNetwork != tc.hostNetwork {
				t.Errorf("hostNetwork %v, want %v", spec.HostNetwork, tc.hostNetwork)
			}
			if tc.hostNetwork && spec.DNSPolicy != "ClusterFirstWithHostNet" {
				t.Errorf("dnsPolicy %q with the host network, want ClusterFirstWithHostNet", spec.DNSPolicy)
			}
			var hostPaths []string
			for _, v := range spec.Volumes {
				if v.HostPath == nil {
					continue
				}
				hostPaths = append(hostPaths, v.HostPath.Path)
				mounted := false
				// The agent's mounts, and its init container's (AKS's copy of the kubelet's files).
				var mounts []v1.VolumeMount
				for _, ic := range spec.InitContainers {
					mounts = append(mounts, ic.VolumeMounts...)
				}
				for _, m := range append(mounts, c.VolumeMounts...) {
					if m.Name == v.Name {
						mounted = true
						if m.MountPath != "/host"+v.HostPath.Path || !m.ReadOnly {
							t.Errorf("host path %s mounted at %s readOnly=%v, want /host%s read-only", v.HostPath.Path, m.MountPath, m.ReadOnly, v.HostPath.Path)
						}
					}
				}
				if !mounted {
					t.Errorf("host path volume %s is not mounted", v.Name)
				}
			}
			if !slices.Equal(hostPaths, tc.hostPaths) {
				t.Errorf("host paths %q, want %q (only what the pressure readers need, never the whole /)", hostPaths, tc.hostPaths)
			}
			// The agent finds the kubelet's Summary API from its node (InternalIP and kubelet
			// port): nothing about it belongs in the pod spec.
			if slices.ContainsFunc(c.Env, func(e v1.EnvVar) bool { return e.Name == "HOST_IP" }) {
				t.Error("HOST_IP in the pod spec; the agent reads the kubelet's address from its node")
			}
			set := settings(c)
			if len(c.Args) != 0 {
				t.Errorf("args %q: the chart's settings belong in REPRIEVE_* variables, args are for extraArgs", c.Args)
			}
			for _, a := range tc.args {
				if !slices.Contains(set, a) {
					t.Errorf("settings %q lack %s", set, a)
				}
			}
			for _, a := range tc.absentArgs {
				if slices.ContainsFunc(set, func(s string) bool { return strings.HasPrefix(s, a) }) {
					t.Errorf("settings %q have %s, which no value asked for", set, a)
				}
			}
			if tc.nodeSelector != nil && !reflect.DeepEqual(spec.NodeSelector, tc.nodeSelector) {
				t.Errorf("nodeSelector %v, want %v", spec.NodeSelector, tc.nodeSelector)
			}
			if tc.affinityKeys != nil {
				var keys []string
				if spec.Affinity != nil && spec.Affinity.NodeAffinity != nil && spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
					for _, term := range spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
						for _, e := range term.MatchExpressions {
							keys = append(keys, e.Key)
						}
					}
				}
				if !reflect.DeepEqual(keys, tc.affinityKeys) {
					t.Errorf("node affinity on %v, want on %v", keys, tc.affinityKeys)
				}
			} else if spec.Affinity != nil {
				t.Errorf("affinity %v, want none", spec.Affinity)
			}
			nodesStats := false
			for _, r := range role.Rules {
				if slices.Contains(r.Resources, "nodes/stats") {
					nodesStats = reflect.DeepEqual(r.Verbs, []string{"get"})
				}
			}
			if nodesStats != tc.nodesStats {
				t.Errorf("ClusterRole grants get on nodes/stats: %v, want %v", nodesStats, tc.nodesStats)
			}
		})
	}

	// Every flag the chart writes is one the agent has: a renamed flag fails here, not at a
	// pod's start.
	t.Run("flags-exist", func(t *testing.T) {
		fs := pflag.NewFlagSet("reprieve", pflag.ContinueOnError)
		cfg := config.DefaultConfig()
		cfg.AddFlags(fs)
		for _, c := range chartCases {
			ds, _ := renderDaemonSet(t, c.name, c.args...)
			// A misspelled variable would be ignored silently: each must name a flag.
			for _, a := range settings(ds.Spec.Template.Spec.Containers[0]) {
				name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
				if a == "-v=2" { // klog's, from extraArgs
					continue
				}
				if fs.Lookup(name) == nil {
					t.Errorf("%s: the chart passes %s, which the agent does not have", c.name, a)
				}
			}
		}
	})

	t.Run("every-value", func(t *testing.T) {
		var c chartCase
		for _, cc := range chartCases {
			if cc.name == "every-value" {
				c = cc
			}
		}
		manifest := render(t, "reprieve", c.args...)
		ds, _ := renderDaemonSet(t, c.name, c.args...)
		spec := ds.Spec.Template.Spec
		ctr := spec.Containers[0]
		set := settings(ctr)
		for _, a := range []string{"--metrics-bind-address=:9090", "--interruption-taint=example.com/reclaim:NoExecute",
			"--webhook-url-file=/etc/reprieve/webhook-url/endpoint", "--webhook-headers-file=/etc/reprieve/webhook-headers/headers",
			"--evict-daemonset-pods", "-v=2", "--log-format=json", "--eviction-workers=32"} {
			if !slices.Contains(set, a) {
				t.Errorf("settings %q lack %s", set, a)
			}
		}
		if !slices.Equal(ctr.Args, []string{"--evict-daemonset-pods", "-v=2"}) {
			t.Errorf("args %q, want extraArgs alone", ctr.Args)
		}
		if u := ds.Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil ||
			u.RollingUpdate.MaxUnavailable == nil || u.RollingUpdate.MaxUnavailable.String() != "10%" {
			t.Errorf("updateStrategy %+v, want RollingUpdate with maxUnavailable 10%%", u)
		}
		if ds.Spec.Template.Labels["team"] != "platform" || ds.Spec.Template.Annotations["example.com/owner"] != "platform" {
			t.Errorf("pod labels %v and annotations %v lack podLabels and podAnnotations", ds.Spec.Template.Labels, ds.Spec.Template.Annotations)
		}
		if len(ctr.Ports) != 1 || ctr.Ports[0].ContainerPort != 9090 || ctr.Ports[0].Name != "metrics" ||
			ctr.LivenessProbe.HTTPGet.Port.String() != "metrics" || ctr.ReadinessProbe.HTTPGet.Port.String() != "metrics" {
			t.Errorf("ports %+v and probes on %s/%s, want metrics on 9090 for both", ctr.Ports,
				ctr.LivenessProbe.HTTPGet.Port.String(), ctr.ReadinessProbe.HTTPGet.Port.String())
		}
		var tolerated []string
		for _, tt := range spec.Tolerations {
			tolerated = append(tolerated, fmt.Sprintf("%s/%s/%s/%s", tt.Key, tt.Operator, tt.Value, tt.Effect))
		}
		want := []string{"example.com/reclaim/Exists//NoExecute", "reprieve.io/rebalance-recommended/Exists//",
			"reprieve.io/scheduled-maintenance/Exists//", "/Exists//NoSchedule", "nvidia.com/gpu/Exists//NoExecute"}
		if !reflect.DeepEqual(tolerated, want) {
			t.Errorf("tolerations %q, want %q", tolerated, want)
		}
		if !reflect.DeepEqual(spec.NodeSelector, linuxOnly) || spec.Affinity == nil || len(spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) != 1 {
			t.Errorf("nodeSelector %v and affinity %v: the pool's affinity should replace the default selection, Linux kept", spec.NodeSelector, spec.Affinity)
		}
		secrets := map[string]bool{}
		for _, v := range spec.Volumes {
			if v.Secret != nil {
				secrets[v.Secret.SecretName] = true
			}
		}
		for _, m := range ctr.VolumeMounts {
			if !m.ReadOnly {
				t.Errorf("volume %s mounted writable", m.Name)
			}
		}
		if !secrets["hook"] || !secrets["hook-headers"] {
			t.Errorf("secret volumes %v, want hook and hook-headers", secrets)
		}
		// The admission policy lets the agent set its own interruption taint's key.
		if !bytes.Contains(manifest, []byte("t.key == 'example.com/reclaim'")) || bytes.Contains(manifest, []byte("t.key == 'cloud'")) {
			t.Errorf("the admission policy does not follow interruptionTaint")
		}
	})
}
