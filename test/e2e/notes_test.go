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
