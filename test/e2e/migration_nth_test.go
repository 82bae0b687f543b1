package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/test/testenv"
)

const migrationGuide = "docs/migrating-from-nth.md"

// testMigrationGuideSwitchOver (issue 36 item 4; TestCPUBound/MigrationGuideSwitchOver) runs the Helm switch-over of
// docs/migrating-from-nth.md as it is written there. aws-node-termination-handler's own chart,
// from the module pinned in test/tools/nth (`make nth`), is installed in IMDS mode with the
// values of a typical release, on a control plane of the test's own: a real kube-apiserver with
// kube-controller-manager's daemonset, deployment, replicaset, garbage-collector and
// node-lifecycle controllers and kube-scheduler, so that Helm's --wait and uninstall see what a cluster does, on kwok spot
// and on-demand nodes. (Its own control plane, because the shared one already holds the
// shipped RBAC that a `helm install reprieve` would have to adopt.) Then every command of the
// guide's ```sh blocks in "Switching over" is run in order, with the guide's values file from
// its ```yaml block. Afterwards NTH's DaemonSet and pods are gone, reprieve's DaemonSet is Ready
// on exactly the spot nodes, and `reprieve doctor`, which warned of NTH on a spot node before,
// warns no more.
func testMigrationGuideSwitchOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	nthChart := nthChartDir(ctx, t)
	guide, err := os.ReadFile(filepath.Join(repoRoot(t), migrationGuide))
	if err != nil {
		t.Fatal(err)
	}
	commands, files := switchOverSteps(t, string(guide))

	cp, err := testenv.Start(ctx, testenv.Options{
		LogDir: filepath.Join(logDir, "migration"), FastPods: true, ControllerManager: true,
		// node-lifecycle-controller lifts the not-ready taint that the API server's
		// TaintNodesByCondition admission puts on a new node: without it the eviction guard,
		// which tolerates no such taint, stays Pending and Helm's --wait with it.
		Controllers: []string{"daemonset-controller", "deployment-controller", "replicaset-controller",
			"garbage-collector-controller", "serviceaccount-controller", "node-lifecycle-controller"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	if err := cp.StartScheduler(ctx); err != nil {
		t.Fatal(err)
	}
	spot := []string{"migration-spot-1", "migration-spot-2"}
	onDemand := []string{"migration-on-demand-1", "migration-on-demand-2"}
	for _, n := range spot {
		if _, err := cp.CreateNode(ctx, n, map[string]string{"karpenter.sh/capacity-type": "spot"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range onDemand {
		if _, err := cp.CreateNode(ctx, n, map[string]string{"karpenter.sh/capacity-type": "on-demand"}); err != nil {
			t.Fatal(err)
		}
	}

	// NTH as a team runs it: IMDS mode, rebalance monitoring, JSON logs, its metrics.
	if out, err := helm(t, "install", "aws-node-termination-handler", nthChart, "-n", "kube-system", "--kubeconfig", cp.Kubeconfig, "--wait",
		"--set", "enableRebalanceMonitoring=true,jsonLogging=true,enablePrometheusServer=true"); err != nil {
		t.Fatalf("installing NTH: %v\n%s", err, out)
	}
	nthPods := func() []v1.Pod {
		l, err := cp.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=aws-node-termination-handler"})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	if n := len(nthPods()); n != len(spot)+len(onDemand) {
		t.Fatalf("NTH runs %d pods, want one on each of the %d nodes", n, len(spot)+len(onDemand))
	}
	if out := doctorOn(ctx, t, cp, spot[0]); !strings.Contains(out, "aws-node-termination-handler also acts") {
		t.Fatalf("before the switch, doctor on %s does not warn of NTH:\n%s", spot[0], out)
	}

	// The guide's commands, in its order.
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range commands {
		args, out := guideCommand(t, c, dir, files)
		t.Logf("the guide's command: helm %s", strings.Join(args, " "))
		stdout, err := helm(t, append(args, "--kubeconfig", cp.Kubeconfig)...)
		if err != nil {
			t.Fatalf("the guide's command %q: %v", c, err)
		}
		if out != "" {
			if err := os.WriteFile(out, stdout, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "nth-values.yaml")); err != nil || !strings.Contains(string(b), "enableRebalanceMonitoring: true") {
		t.Errorf("the guide's `helm get values` wrote %q (%v), want NTH's values", b, err)
	}

	// NTH gone: its DaemonSet, and its pods once the garbage collector has deleted them.
	if _, err := cp.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "aws-node-termination-handler", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("NTH's DaemonSet after the switch: %v, want NotFound", err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return len(nthPods()) == 0, nil
	}); err != nil {
		t.Errorf("NTH's pods are still there a minute after the switch: %d", len(nthPods()))
	}

	// reprieve's DaemonSet Ready on the spot nodes, and only there.
	ds, err := cp.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "reprieve", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reprieve's DaemonSet after the switch: %v", err)
	}
	if s := ds.Status; s.DesiredNumberScheduled != int32(len(spot)) || s.NumberReady != s.DesiredNumberScheduled {
		t.Errorf("reprieve's DaemonSet: %d desired, %d ready; want Ready on the %d spot nodes", s.DesiredNumberScheduled, s.NumberReady, len(spot))
	}
	pods, err := cp.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(ds.Spec.Selector)})
	if err != nil {
		t.Fatal(err)
	}
	var on []string
	for _, p := range pods.Items {
		on = append(on, p.Spec.NodeName)
	}
	slices.Sort(on)
	if !slices.Equal(on, spot) {
		t.Errorf("reprieve's pods run on %v, want %v", on, spot)
	}
	out := doctorOn(ctx, t, cp, spot[0])
	// The ok line names every handler it looks for, NTH included: the warning is what must go.
	if strings.Contains(out, "aws-node-termination-handler also acts") || !strings.Contains(out, "ok    no other interruption handler seen on node "+spot[0]) {
		t.Errorf("after the switch, doctor on %s still warns of NTH, or checked nothing:\n%s", spot[0], out)
	}
}

// TestMigrationGuideListsEveryAlert: the guide names every alert of deploy/prometheus/rules.yaml
// (it once listed 8 of 12).
func TestMigrationGuideListsEveryAlert(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	guide, err := os.ReadFile(filepath.Join(root, migrationGuide))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\w+)`).FindAllStringSubmatch(string(rules), -1)
	if len(alerts) < 12 {
		t.Fatalf("rules.yaml has %d alerts; the pattern no longer reads it", len(alerts))
	}
	for _, a := range alerts {
		if !strings.Contains(string(guide), "`"+a[1]+"`") {
			t.Errorf("%s does not name the alert %s", migrationGuide, a[1])
		}
	}
}

// nthChartDir is aws-node-termination-handler's Helm chart in the module test/tools/nth pins
// (the module zip holds the repository's config/helm).
func nthChartDir(ctx context.Context, t *testing.T) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", "github.com/aws/aws-node-termination-handler")
	cmd.Dir = filepath.Join(repoRoot(t), "test", "tools", "nth")
	out, err := cmd.Output()
	var mod struct{ Dir, Error string }
	if err == nil {
		err = json.Unmarshal(out, &mod)
	}
	if err != nil || mod.Error != "" || mod.Dir == "" {
		msg := "aws-node-termination-handler's module (test/tools/nth) could not be downloaded: " + mod.Error
		if err != nil {
			msg += err.Error()
		}
		if os.Getenv("REPRIEVE_E2E_REQUIRED") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := filepath.Join(mod.Dir, "config", "helm", "aws-node-termination-handler")
	if _, err := os.Stat(filepath.Join(dir, "Chart.yaml")); err != nil {
		t.Fatalf("NTH's chart: %v", err)
	}
	return dir
}

// switchOverSteps reads the guide's "## Switching over" section: its ```sh blocks, whose lines
// (a trailing backslash joins the next) must each be a helm command or a comment, in order;
// and the files its ```yaml blocks define by a first line "# NAME".
func switchOverSteps(t *testing.T, guide string) (commands []string, files map[string]string) {
	t.Helper()
	files = map[string]string{}
	var section, block, lang, indent string
	in, fence := false, false
	sc := bufio.NewScanner(strings.NewReader(guide))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if !fence && strings.HasPrefix(line, "## ") {
			section = strings.TrimPrefix(line, "## ")
		}
		switch {
		case !fence && strings.HasPrefix(trimmed, "```") && len(trimmed) > 3:
			fence, lang, block = true, strings.TrimPrefix(trimmed, "```"), ""
			// A block in a list item is indented: its lines lose the fence's indentation only.
			indent = line[:len(line)-len(strings.TrimLeft(line, " "))]
			in = section == "Switching over"
		case fence && trimmed == "```":
			fence = false
			if lang == "yaml" {
				if first, _, ok := strings.Cut(block, "\n"); ok && strings.HasPrefix(first, "# ") {
					files[strings.TrimPrefix(first, "# ")] = block
				}
			}
			if in && lang == "sh" {
				for _, c := range strings.Split(strings.ReplaceAll(block, "\\\n", " "), "\n") {
					c = strings.TrimSpace(c)
					switch {
					case c == "" || strings.HasPrefix(c, "#"):
					case strings.HasPrefix(c, "helm "):
						commands = append(commands, c)
					default:
						t.Errorf("the switch-over's block has %q, which the test cannot run: keep its blocks to helm commands", c)
					}
				}
			}
		case fence:
			block += strings.TrimPrefix(line, indent) + "\n"
		}
	}
	var uninstall, install bool
	for _, c := range commands {
		uninstall = uninstall || strings.HasPrefix(c, "helm uninstall aws-node-termination-handler ")
		install = install || strings.HasPrefix(c, "helm install reprieve ")
	}
	if !uninstall || !install {
		t.Fatalf("the guide's switch-over %q lacks NTH's helm uninstall or reprieve's helm install", commands)
	}
	return commands, files
}

// guideCommand turns one of the guide's helm lines into helm's arguments: a file the guide
// defines is read from dir, and "> FILE" writes the standard output to dir/FILE.
func guideCommand(t *testing.T, c, dir string, files map[string]string) (args []string, out string) {
	t.Helper()
	if strings.ContainsAny(c, "'\"$`|;&") {
		t.Fatalf("the guide's command %q has shell syntax the test does not run", c)
	}
	f := strings.Fields(strings.TrimPrefix(c, "helm "))
	for i := 0; i < len(f); i++ {
		switch {
		case f[i] == ">" && i+1 < len(f):
			out = filepath.Join(dir, f[i+1])
			i++
		case files[f[i]] != "":
			args = append(args, filepath.Join(dir, f[i]))
		default:
			args = append(args, f[i])
		}
	}
	return args, out
}

// doctorOn runs `reprieve doctor` for node against cp with no metadata service (--provider
// none) and returns what it printed; its exit status is not the point here.
func doctorOn(ctx context.Context, t *testing.T, cp *testenv.Env, node string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, reprieveBin, "doctor", "--kubeconfig="+cp.Kubeconfig, "--node="+node, "--provider=none",
		"--kubelet-root-dir=/", "--imagefs-dir=/")
	cmd.Env = append(os.Environ(), "NODE_NAME=")
	b, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("running reprieve doctor: %v", err)
	}
	return string(b)
}
