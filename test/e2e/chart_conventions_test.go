package e2e

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// chartMeta is the part of Chart.yaml the conventions check.
type chartMeta struct {
	Name, Version, AppVersion string
}

func readChartMeta(t *testing.T) chartMeta {
	t.Helper()
	var c chartMeta
	if err := yaml.Unmarshal(readRepoFile(t, chartDir, "Chart.yaml"), &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// testChartConventions checks what operators expect of any chart: the recommended labels on
// every object, name overrides, tolerating every taint by default (a pool with a NoExecute taint
// of its own must not be left without its agent), and a rolling update one node at a time.
func testChartConventions(t *testing.T) {
	chart := readChartMeta(t)
	t.Run("labels", func(t *testing.T) {
		for _, c := range chartCases {
			for _, u := range manifestObjects(t, c.name, render(t, "reprieve", c.args...)) {
				want := map[string]string{
					"helm.sh/chart":                fmt.Sprintf("%s-%s", chart.Name, chart.Version),
					"app.kubernetes.io/name":       "reprieve",
					"app.kubernetes.io/instance":   "reprieve",
					"app.kubernetes.io/version":    chart.AppVersion,
					"app.kubernetes.io/managed-by": "Helm",
					"app.kubernetes.io/part-of":    "reprieve",
				}
				got := map[string]string{}
				for k := range want {
					got[k] = u.GetLabels()[k]
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%s: %s %s has labels %v, want %v", c.name, u.GetKind(), u.GetName(), got, want)
				}
			}
		}
	})
	t.Run("overrides", func(t *testing.T) {
		for _, tc := range []struct{ set, name, label string }{
			{"nameOverride=spot-agent", "reprieve-spot-agent", "spot-agent"},
			{"fullnameOverride=node-agent", "node-agent", "reprieve"},
		} {
			ds, _ := renderDaemonSet(t, tc.set, "--set", tc.set)
			if ds.Name != tc.name || ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != tc.label {
				t.Errorf("--set %s: DaemonSet %s selecting name=%s; want %s selecting name=%s", tc.set, ds.Name,
					ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"], tc.name, tc.label)
			}
		}
	})
	t.Run("tolerations", func(t *testing.T) {
		ds, _ := renderDaemonSet(t, "defaults")
		var got []string
		for _, tt := range ds.Spec.Template.Spec.Tolerations {
			got = append(got, fmt.Sprintf("%s/%s/%s/%s", tt.Key, tt.Operator, tt.Value, tt.Effect))
		}
		if want := []string{"/Exists//"}; !reflect.DeepEqual(got, want) {
			t.Errorf("default tolerations %q, want %q: every taint, as node agents do", got, want)
		}
	})
	t.Run("grace-covers-a-window", func(t *testing.T) {
		ds, _ := renderDaemonSet(t, "defaults")
		// The agent finishes an interruption's window on SIGTERM: AWS's is 120 s.
		if g := ds.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g < 130 {
			t.Errorf("terminationGracePeriodSeconds %v, want at least 130 s (AWS's 120 s window and a margin)", g)
		}
	})
	t.Run("update-strategy", func(t *testing.T) {
		ds, _ := renderDaemonSet(t, "defaults")
		u := ds.Spec.UpdateStrategy
		if u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil || u.RollingUpdate.MaxUnavailable == nil ||
			u.RollingUpdate.MaxUnavailable.IntValue() != 1 {
			t.Errorf("updateStrategy %+v, want RollingUpdate with maxUnavailable 1", u)
		}
	})
	// A second release's monitoring selects its own series and DaemonSet: the PodMonitor sets
	// job to the release's name, the rules select on it and on the release's DaemonSet, and the
	// dashboard ships as a ConfigMap for Grafana's sidecar.
	t.Run("second-release-monitoring", func(t *testing.T) {
		manifest := string(render(t, "reprieve-gpu", "-f", "deploy/chart/examples/gpu-pool.yaml", "--set",
			"podMonitor.enabled=true,prometheusRule.enabled=true,grafanaDashboard.enabled=true"))
		for _, want := range []string{`up{job="reprieve-gpu"}`, `kube_daemonset_status_number_ready{daemonset="reprieve-gpu"}`,
			"replacement: reprieve-gpu", "grafana_dashboard: \"1\"", "name: reprieve-gpu-dashboard"} {
			if !strings.Contains(manifest, want) {
				t.Errorf("the reprieve-gpu render lacks %s", want)
			}
		}
		for _, bad := range []string{`job="reprieve"`, `daemonset="reprieve"`} {
			if strings.Contains(manifest, bad) {
				t.Errorf("the reprieve-gpu render selects the default release: %s", bad)
			}
		}
		custom := string(render(t, "reprieve", "--set", "podMonitor.enabled=true,prometheusRule.enabled=true,monitoring.job=spot-agents"))
		if !strings.Contains(custom, `up{job="spot-agents"}`) || !strings.Contains(custom, "replacement: spot-agents") {
			t.Error("monitoring.job=spot-agents does not reach both the PodMonitor and the rules")
		}
	})
	t.Run("pinned-image", func(t *testing.T) {
		ds, _ := renderDaemonSet(t, "defaults")
		img := ds.Spec.Template.Spec.Containers[0].Image
		if want := "ghcr.io/reprieve-dev/reprieve:" + chart.AppVersion; img != want || chart.AppVersion == "latest" {
			t.Errorf("image %s with appVersion %q, want %s pinned to a release", img, chart.AppVersion, want)
		}
	})
	t.Run("host-network", func(t *testing.T) {
		for _, c := range []struct {
			set  string
			want bool
		}{{"cloud=aws", true}, {"cloud=aws,hostNetwork=false", false}, {"cloud=gcp", false}, {"cloud=gcp,hostNetwork=true", true}, {"cloud=azure", false}} {
			ds, _ := renderDaemonSet(t, c.set, "--set", c.set)
			spec := ds.Spec.Template.Spec
			if spec.HostNetwork != c.want || (spec.DNSPolicy == "ClusterFirstWithHostNet") != c.want {
				t.Errorf("--set %s: hostNetwork %v, dnsPolicy %q; want the host network %v", c.set, spec.HostNetwork, spec.DNSPolicy, c.want)
			}
			if p := spec.Containers[0].Ports; len(p) == 0 || p[0].ContainerPort != 10271 {
				t.Errorf("--set %s: ports %+v; want metrics on 10271", c.set, p)
			}
		}
	})
	// The admission policies (and the warning policy) need ValidatingAdmissionPolicy v1: a cluster's discovery lists kinds,
	// and where it lacks the kind the chart leaves the policies out (rather than failing the
	// release); helm template without a cluster renders them (the chart's kubeVersion is 1.30).
	t.Run("policy-capabilities", func(t *testing.T) {
		count := func(args ...string) int {
			n := 0
			for _, u := range manifestObjects(t, "capabilities", render(t, "reprieve", args...)) {
				if u.GetKind() == "ValidatingAdmissionPolicy" && strings.HasPrefix(u.GetName(), "reprieve-") {
					n++
				}
			}
			return n
		}
		offline := count()
		if offline < 5 {
			t.Errorf("helm template: %d policies, want at least 5 (node, pod delete, events, eviction options, spot warnings)", offline)
		}
		if n := count("--api-versions", "apps/v1/DaemonSet"); n != 0 {
			t.Errorf("a cluster without ValidatingAdmissionPolicy v1: %d policies rendered, want none", n)
		}
		if n := count("--api-versions", "apps/v1/DaemonSet", "--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"); n != offline {
			t.Errorf("a cluster with ValidatingAdmissionPolicy v1: %d policies rendered, want %d", n, offline)
		}
	})
}
