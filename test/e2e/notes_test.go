package e2e

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// testChartNotes: NOTES.txt, rendered by `helm install --dry-run=server` against the real API
// server (lookup reads the cluster's nodes), counts the nodes the DaemonSet's selection matches
// now, leaves out Windows nodes, and warns when none matches; without a cluster it says it could
// not count (issue 35 item 2).
func testChartNotes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spot, win := "notes-eks-spot", "notes-windows-spot"
	if _, err := env.CreateNode(ctx, spot, map[string]string{"eks.amazonaws.com/capacityType": "SPOT", "kubernetes.io/os": "linux"}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.CreateNode(ctx, win, map[string]string{"karpenter.sh/capacity-type": "spot", "kubernetes.io/os": "windows"}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, n := range []string{spot, win} {
			_ = env.Client.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	}()
	notes := func(args ...string) string {
		t.Helper()
		out, err := helm(t, append([]string{"install", "notes", chartDir, "--namespace", "kube-system", "--dry-run=server",
			"--kubeconfig", env.Kubeconfig}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		s := string(out)
		if i := strings.Index(s, "NOTES:"); i >= 0 {
			return s[i:]
		}
		t.Fatalf("no NOTES in\n%s", s)
		return ""
	}
	got := notes("-f", "deploy/chart/values-aws.yaml")
	m := regexp.MustCompile(`It selects (\d+) of the cluster's (\d+) nodes now \((\d+) Windows nodes left out`).FindStringSubmatch(got)
	if m == nil {
		t.Fatalf("NOTES do not count the nodes selected and the Windows ones left out:\n%s", got)
	}
	selected, _ := strconv.Atoi(m[1])
	windows, _ := strconv.Atoi(m[3])
	if selected < 1 || windows < 1 {
		t.Errorf("NOTES count %d selected and %d Windows nodes; want the EKS spot node selected and the Windows one left out:\n%s", selected, windows, got)
	}
	if strings.Contains(got, "WARNING: no node") {
		t.Errorf("NOTES warn with a spot node present:\n%s", got)
	}
	got = notes("-f", "deploy/chart/values-aws.yaml", "--set", "nodeSelector.pool=no-such-pool")
	if !strings.Contains(got, "WARNING: no node of the") || !strings.Contains(got, "no agent runs") {
		t.Errorf("NOTES do not warn when no node matches:\n%s", got)
	}
}

// testChartNotesPlacement (issues 48 and 49): NOTES.txt, rendered against the real API server,
// names Karpenter's nodes among those selected and the value that leaves them to Karpenter, and
// counts them as left out once excludeNodes does; it says where the eviction guard will run: on a
// set of nodes that are all spot capacity (the guard confined to them with
// evictionGuard.nodeSelector), a warning with the cost, or with offSpot required that it stays
// Pending; with a node off spot among them, neither. A PrometheusRule without the PodMonitor says
// that ReprieveAgentAbsent was left out.
func testChartNotesPlacement(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const label = "reprieve.test/notes-placement"
	nodes := map[string]map[string]string{
		"notes-karpenter-spot": {"karpenter.sh/capacity-type": "spot", "karpenter.sh/nodepool": "default", label: "spot"},
		"notes-mng-spot":       {"eks.amazonaws.com/capacityType": "SPOT", label: "spot"},
		"notes-on-demand":      {"eks.amazonaws.com/capacityType": "ON_DEMAND", label: "mixed"},
	}
	for name, l := range nodes {
		if _, err := env.CreateNode(ctx, name, l); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for name := range nodes {
			_ = env.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
		}
	}()
	notes := func(args ...string) string {
		t.Helper()
		out, err := helm(t, append([]string{"install", "notes", chartDir, "--namespace", "kube-system", "--dry-run=server",
			"--kubeconfig", env.Kubeconfig, "-f", "deploy/chart/values-aws.yaml"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		s := string(out)
		if i := strings.Index(s, "NOTES:"); i >= 0 {
			return s[i:]
		}
		t.Fatalf("no NOTES in\n%s", s)
		return ""
	}
	got := notes()
	if !regexp.MustCompile(`NOTE: \d+ of the selected nodes are Karpenter's`).MatchString(got) || !strings.Contains(got, "excludeNodes={karpenter.sh/nodepool}") {
		t.Errorf("NOTES do not name Karpenter's nodes and the value that leaves them to it:\n%s", got)
	}
	got = notes("--set", "excludeNodes={karpenter.sh/nodepool}")
	if strings.Contains(got, "of the selected nodes are Karpenter's") || !regexp.MustCompile(`\d+ more are left to other handlers`).MatchString(got) {
		t.Errorf("with excludeNodes, NOTES still name Karpenter's nodes, or do not count them left out:\n%s", got)
	}
	sel := "evictionGuard.nodeSelector." + strings.ReplaceAll(label, ".", `\.`)
	got = notes("--set", sel+"=spot")
	if !strings.Contains(got, "WARNING: no Linux node the eviction guard may use is off spot capacity, so it runs on spot") ||
		!strings.Contains(got, "past their PodDisruptionBudgets") || !strings.Contains(got, "port 10250 of its pods") {
		t.Errorf("NOTES do not warn that the guard runs on spot capacity, with the cost, or name its port:\n%s", got)
	}
	got = notes("--set", sel+"=spot,evictionGuard.offSpot=required")
	if !strings.Contains(got, "the eviction guard stays Pending") {
		t.Errorf("NOTES do not warn that the guard stays Pending with offSpot required:\n%s", got)
	}
	got = notes("--set", sel+"=mixed")
	if strings.Contains(got, "WARNING: no Linux node the eviction guard") {
		t.Errorf("NOTES warn with a node off spot among the guard's:\n%s", got)
	}
	// The PrometheusRule's kind is not served here (no Prometheus Operator): a client-side dry
	// run renders the NOTES without the cluster.
	out, err := helm(t, "install", "notes", chartDir, "--namespace", "kube-system", "--dry-run=client", "-f", "deploy/chart/values-aws.yaml",
		"--set", "prometheusRule.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "leaves out ReprieveAgentAbsent") || !strings.Contains(string(out), "kind: PrometheusRule") ||
		strings.Contains(string(out), "alert: ReprieveAgentAbsent") {
		t.Errorf("the PrometheusRule without the PodMonitor: NOTES do not say ReprieveAgentAbsent was left out, or it is in the rules:\n%s", out)
	}
	out, err = helm(t, "install", "notes", chartDir, "--namespace", "kube-system", "--dry-run=client", "-f", "deploy/chart/values-aws.yaml",
		"--set", "prometheusRule.enabled=true,podMonitor.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "leaves out ReprieveAgentAbsent") || !strings.Contains(string(out), "alert: ReprieveAgentAbsent") {
		t.Errorf("the PrometheusRule with the PodMonitor: want ReprieveAgentAbsent in the rules and no note:\n%s", out)
	}
}
