package realnode

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/restmapper"

	"github.com/reprieve-dev/reprieve/test/nodeenv"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

const chartDir = "deploy/chart/reprieve"

// chartArgs are the values of the install on the real node: the project's AWS values file with
// what this test bed differs in. Each is a value a user sets for such a node:
//   - hostNetwork=false (the chart's documented choice for instances whose IMDSv2 hop limit is
//     2), so that the notice endpoint is a real hostPort through the CNI's portmap;
//   - the node's own paths for the kubelet's root directory and config and the image store;
//   - the metadata service at the node's address (the mock, through the test's forwarder);
//   - pressure.kubeletInsecureTLS=true: the kubelet's serving certificate is self-signed, as
//     on a node without serving-certificate bootstrap (the agent reads its PID limit there);
//   - image.pullPolicy=Never: the image is imported, there is no registry;
//   - evictionGuard.enabled=false: the guard is an admission webhook the API server calls
//     through a Service name, and this test bed has no cluster DNS for the API server to
//     resolve it with.
func chartArgs(extra ...string) []string {
	args := []string{
		"-f", "deploy/chart/values-aws.yaml",
		"--set", "hostNetwork=false,noticeEndpoint.enabled=true,image.pullPolicy=Never,evictionGuard.enabled=false,pressure.kubeletInsecureTLS=true",
		// The NoExecute mode, explicitly: the spot test was written when it was the default, and
		// waits for its NoExecute taint (the default is interruptionEviction: reprieve).
		"--set", "interruptionEviction=kube-controller-manager",
		"--set", "pressure.kubeletRootDir=" + node.RootDir + ",pressure.imageFsDir=" + node.ContainerdRoot + ",pressure.kubeletConfig=" + node.KubeletConfigPath,
		// -v=4: the pressure loop's decision at each reading under pressure ("Pressure
		// decision"), in the agent's log that REPRIEVE_E2E_KEEP_LOGS=1 keeps.
		"--set-json", fmt.Sprintf(`extraArgs=["--aws-imds-endpoint=http://%s:%d","-v=4"]`, nodeenv.NodeIP, imdsPort),
	}
	return append(args, extra...)
}

// render is `helm template reprieve` of the chart in kube-system with args.
func render(t *testing.T, args ...string) []byte {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := testenv.ToolsBin()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "helm"), append([]string{"template", "reprieve", chartDir, "--namespace", "kube-system"}, args...)...)
	cmd.Dir = root
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.Bytes())
	}
	return out
}

// apply server-side applies every object of manifest, as `kubectl apply --server-side` would,
// and returns the rendered DaemonSet.
func apply(ctx context.Context, t *testing.T, manifest []byte) *appsv1.DaemonSet {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal(doc, &u.Object); err != nil {
			t.Fatal(err)
		}
		if len(u.Object) == 0 {
			continue
		}
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk.Kind, u.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := u.GetNamespace()
			if ns == "" {
				ns = "kube-system"
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		if _, err := ri.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: "realnode-test", Force: true}); err != nil {
			t.Fatalf("applying %s %s: %v", gvk.Kind, u.GetName(), err)
		}
		if gvk.Kind == "DaemonSet" {
			ds = &appsv1.DaemonSet{}
			if _, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ds == nil {
		t.Fatal("the render has no DaemonSet")
	}
	return ds
}

// agentPod returns the running, ready reprieve pod on the real node of the DaemonSet's current
// template (nil when there is none yet).
func agentPod(ctx context.Context, t *testing.T) *v1.Pod {
	t.Helper()
	list, err := env.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=reprieve", FieldSelector: "spec.nodeName=" + nodeName})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := env.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "reprieve", metav1.GetOptions{})
	if err != nil {
		return nil
	}
	for i := range list.Items {
		p := &list.Items[i]
		if p.DeletionTimestamp == nil && p.Status.Phase == v1.PodRunning && podReady(p) &&
			p.Labels["pod-template-generation"] == strconv.FormatInt(ds.Generation, 10) {
			return p
		}
	}
	return nil
}

func podReady(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// install renders the chart with chartArgs(extra...), applies it and waits until the agent's
// pod of that render runs and is ready on the real node.
func install(ctx context.Context, t *testing.T, extra ...string) (*appsv1.DaemonSet, *v1.Pod) {
	t.Helper()
	ds := apply(ctx, t, render(t, chartArgs(extra...)...))
	var p *v1.Pod
	waitFor(ctx, t, 90*time.Second, "the reprieve pod running and ready on the real node", func() bool {
		p = agentPod(ctx, t)
		return p != nil
	})
	return ds, p
}

// uninstall deletes the DaemonSet and waits until its pod is gone from the node.
func uninstall(ctx context.Context, t *testing.T) {
	t.Helper()
	keepAgentLogs(t)
	err := env.Client.AppsV1().DaemonSets("kube-system").Delete(ctx, "reprieve", metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	// No garbage collector runs in this control plane: delete the DaemonSet's pods as it would.
	if err := env.Client.CoreV1().Pods("kube-system").DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=reprieve"}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 60*time.Second, "the reprieve pod gone from the real node", func() bool {
		list, err := env.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=reprieve", FieldSelector: "spec.nodeName=" + nodeName})
		return err == nil && len(list.Items) == 0
	})
}

// keepAgentLogs copies the agents' container logs from the node's pod-logs directory into the
// run's log directory before their pods go (the kubelet removes a deleted pod's logs with it), as
// <test>-<file>: the pressure decisions they log at -v=4 are what explains a test's timing.
func keepAgentLogs(t *testing.T) {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(node.RootDir, "pod-logs", "kube-system_reprieve-*", "reprieve", "*.log"))
	for _, f := range logs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Logf("keeping the agent's log %s: %v", f, err)
			continue
		}
		pod := filepath.Base(filepath.Dir(filepath.Dir(f)))
		name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + pod + "-" + filepath.Base(f)
		if err := os.WriteFile(filepath.Join(logDir, name), b, 0o644); err != nil {
			t.Logf("keeping the agent's log %s: %v", f, err)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

// waitFor polls cond every 100 ms until it holds, failing the test after timeout.
func waitFor(ctx context.Context, t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// scrape returns the agent's /metrics.
func scrape(ctx context.Context, p *v1.Pod, port int) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s:%d/metrics", p.Status.PodIP, port), nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return string(b), err
}

// metric returns the value of the sample named name with labels (`name{labels}`), or false.
func metric(text, sample string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// createNamespace creates ns with its default ServiceAccount (the serviceaccount controller
// adds it; pods wait for it).
func createNamespace(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	if err := env.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 30*time.Second, "the default ServiceAccount of "+ns, func() bool {
		_, err := env.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
}

// readMillis reads a record file of the workload: a Unix time in milliseconds.
func readMillis(dir, name string) (time.Time, bool) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}
