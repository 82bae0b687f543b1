package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/reprieve-dev/reprieve/agent/guard"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// The pool's reprieve runs as the chart installs it by default (issue 46): `helm template` of
// deploy/chart/reprieve in kube-system, of which the bench applies the cluster's objects (the
// agent's admission policies; the eviction guard's ServiceAccount, RBAC, Secret, priority level
// and webhook, failurePolicy Fail and timeoutSeconds 3 as rendered; with flowControl, the agents'
// priority level) and runs the workloads as local processes: each agent with a token bound to a
// pod of its own on its node, as the kubelet projects it, and the guard's Deployment as two
// processes with the Deployment's own arguments behind a proxy that stands in for its Service
// (the webhook's clientConfig is the proxy's URL: this cluster has no Service routing). The
// guard then keeps its own certificate and the webhook's caBundle, as in a cluster.

// chartRelease, chartNamespace and agentAccount are the chart's default release: the agents are
// kube-system/reprieve, the guard kube-system/reprieve-eviction-guard.
const (
	chartRelease   = "reprieve"
	chartNamespace = "kube-system"
	agentAccount   = "reprieve"
)

// chartKinds are the kinds of the render the bench applies, and their resources. The rest (the
// DaemonSet, the guard's Deployment, Service and budget, a hook's Job) are run, or routed, by
// the bench itself, or are not needed here.
var chartKinds = map[string]schema.GroupVersionResource{
	"ServiceAccount":                   {Version: "v1", Resource: "serviceaccounts"},
	"Secret":                           {Version: "v1", Resource: "secrets"},
	"ClusterRole":                      {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
	"ClusterRoleBinding":               {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
	"Role":                             {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"},
	"RoleBinding":                      {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"},
	"ValidatingAdmissionPolicy":        {Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"},
	"ValidatingAdmissionPolicyBinding": {Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"},
	"ValidatingWebhookConfiguration":   {Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"},
	"PriorityLevelConfiguration":       {Group: "flowcontrol.apiserver.k8s.io", Version: "v1", Resource: "prioritylevelconfigurations"},
	"FlowSchema":                       {Group: "flowcontrol.apiserver.k8s.io", Version: "v1", Resource: "flowschemas"},
}

// guardReplicas is the chart's evictionGuard.replicas.
const guardReplicas = 2

// chartInstall is one pool run's install of the chart: the objects it created (deleted at
// uninstall, the webhook first) and the guard's processes.
type chartInstall struct {
	b       *bench
	dyn     dynamic.Interface
	created []*unstructured.Unstructured
	guards  []*testenv.Process
	addrs   []string
	proxy   *tcpProxy
	// agentPods are the agents' own pods in kube-system, to which their tokens are bound;
	// agentMu guards them: the pool makes every node's token at once (agentToken).
	agentMu   sync.Mutex
	agentPods []string
}

// helm runs the tools' helm with a home of its own.
func (b *bench) helm(ctx context.Context, args ...string) ([]byte, error) {
	dir, err := testenv.ToolsBin()
	if err != nil {
		return nil, err
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "helm"), args...)
	cmd.Dir = root
	home, err := os.MkdirTemp(b.logDir, "helm-")
	if err != nil {
		return nil, fmt.Errorf("running helm: %w", err)
	}
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out, nil
}

// renderChart renders the chart's default install with set (--set values) and returns its
// objects.
func (b *bench) renderChart(ctx context.Context, set ...string) ([]*unstructured.Unstructured, error) {
	args := []string{"template", chartRelease, "deploy/chart/reprieve", "--namespace", chartNamespace, "--set", "cloud=aws"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	manifest, err := b.helm(ctx, args...)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading the chart's render: %w", err)
		}
		obj := map[string]any{}
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("decoding the chart's render: %w", err)
		}
		if len(obj) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: obj})
	}
}

// installChart applies the chart's render for a pool run, and with the guard starts its
// replicas and waits until they are ready (their index synced). Agent tokens come from
// agentToken, after the agents' pods exist.
func (b *bench) installChart(ctx context.Context, withGuard, flowControl bool) (_ *chartInstall, err error) {
	objs, err := b.renderChart(ctx, "evictionGuard.enabled="+strconv.FormatBool(withGuard), "flowControl.enabled="+strconv.FormatBool(flowControl))
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(b.env.Config)
	if err != nil {
		return nil, fmt.Errorf("creating the dynamic client: %w", err)
	}
	inst := &chartInstall{b: b, dyn: dyn}
	defer func() {
		if err != nil {
			inst.uninstall(context.WithoutCancel(ctx))
		}
	}()
	var guardArgs []string
	guardName := chartRelease + "-eviction-guard"
	if withGuard {
		port, err := testenv.FreePort()
		if err != nil {
			return nil, err
		}
		proxyAddr := "127.0.0.1:" + strconv.Itoa(port)
		for _, o := range objs {
			switch o.GetKind() {
			case "Deployment":
				var d appsv1.Deployment
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
					return nil, fmt.Errorf("reading the guard's Deployment: %w", err)
				}
				guardArgs = d.Spec.Template.Spec.Containers[0].Args
			case "ValidatingWebhookConfiguration":
				hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
				if len(hooks) != 1 {
					return nil, fmt.Errorf("the render has %d webhooks; want 1", len(hooks))
				}
				hooks[0].(map[string]any)["clientConfig"] = map[string]any{"url": "https://" + proxyAddr + guard.PathValidate}
				if err := unstructured.SetNestedSlice(o.Object, hooks, "webhooks"); err != nil {
					return nil, err
				}
			}
		}
		if len(guardArgs) == 0 {
			return nil, errors.New("the chart's render has no guard Deployment")
		}
		if inst.proxy, err = startTCPProxy(proxyAddr); err != nil {
			return nil, err
		}
	}
	// Every object, the webhook included: each guard replica writes its CA into the webhook's
	// caBundle before it listens. Until the guard answers, the webhook refuses every eviction,
	// as with the guard down; no agent runs yet.
	for _, o := range objs {
		if chartKinds[o.GetKind()].Resource != "" {
			if err := inst.apply(ctx, o); err != nil {
				return nil, err
			}
		}
	}
	if withGuard {
		kubeconfig, err := b.env.ServiceAccountKubeconfig(ctx, chartNamespace, guardName)
		if err != nil {
			return nil, err
		}
		for i := range guardReplicas {
			if err := inst.startGuard(ctx, i, guardArgs, kubeconfig); err != nil {
				return nil, err
			}
		}
		inst.proxy.setBackends(inst.addrs)
	}
	return inst, nil
}

// apply creates o, or, when it exists (the agent's ServiceAccount and role, which every section
// shares), leaves it as it is, and uninstall does too: a new ServiceAccount would end every token
// of the old one. A webhook configuration that exists is replaced.
func (inst *chartInstall) apply(ctx context.Context, o *unstructured.Unstructured) error {
	gvr := chartKinds[o.GetKind()]
	var ri dynamic.ResourceInterface = inst.dyn.Resource(gvr)
	if o.GetNamespace() != "" {
		ri = inst.dyn.Resource(gvr).Namespace(o.GetNamespace())
	}
	created, err := ri.Create(ctx, o, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) && o.GetKind() == "ValidatingWebhookConfiguration" {
		// One left by a run that did not end: it names a proxy that is gone.
		if err := ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting the stale %s %s: %w", o.GetKind(), o.GetName(), err)
		}
		created, err = ri.Create(ctx, o, metav1.CreateOptions{})
	}
	switch {
	case apierrors.IsAlreadyExists(err):
		return nil
	case err != nil:
		return fmt.Errorf("creating %s %s: %w", o.GetKind(), o.GetName(), err)
	}
	inst.created = append(inst.created, created)
	return nil
}

// startGuard runs replica i of the guard with the Deployment's arguments, on a port of its own
// and with 127.0.0.1 among its certificate's hosts (the proxy's address, which the webhook
// names), and waits until it is ready.
func (inst *chartInstall) startGuard(ctx context.Context, i int, chartArgs []string, kubeconfig string) error {
	port, err := testenv.FreePort()
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	var args []string
	for _, a := range chartArgs {
		switch {
		case strings.HasPrefix(a, "--bind-address="):
			a = "--bind-address=" + addr
		case strings.HasPrefix(a, "--tls-hosts="):
			a += ",127.0.0.1"
		}
		args = append(args, a)
	}
	args = append(args, "--kubeconfig="+kubeconfig)
	p, err := testenv.StartProcess(ctx, "eviction-guard", filepath.Join(inst.b.logDir, fmt.Sprintf("eviction-guard-%d.log", i)), inst.b.bin, args, nil)
	if err != nil {
		return err
	}
	inst.guards = append(inst.guards, p)
	inst.addrs = append(inst.addrs, addr)
	hc := insecureClient()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("the guard exited: %s", p.ExitDescription())
		}
		resp, err := hc.Get("https://" + addr + guard.PathReadyz)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}); err != nil {
		return fmt.Errorf("waiting for guard replica %d to be ready: %w\n%s", i, err, p.LogTail(20))
	}
	return nil
}

func insecureClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
}

// agentToken makes the agent pod of node in kube-system (a DaemonSet's pod of the agent's
// ServiceAccount, which no agent evicts) and returns a token bound to it: with node in its
// claims, as the kubelet projects it.
func (inst *chartInstall) agentToken(ctx context.Context, node string) (token, kubeconfig string, err error) {
	taint, err := interruptionTaint()
	if err != nil {
		return "", "", err
	}
	name := "reprieve-" + node
	if err := scenario.Create(ctx, inst.b.env.Client, chartNamespace, node, taint, []scenario.Pod{{Name: name, Kind: scenario.DaemonSet, ServiceAccount: agentAccount}}); err != nil {
		return "", "", err
	}
	inst.agentMu.Lock()
	inst.agentPods = append(inst.agentPods, name)
	inst.agentMu.Unlock()
	pod, err := inst.b.env.Client.CoreV1().Pods(chartNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", "", fmt.Errorf("reading the agent pod %s: %w", name, err)
	}
	kubeconfig, err = inst.b.env.BoundServiceAccountKubeconfig(ctx, chartNamespace, agentAccount, pod)
	if err != nil {
		return "", "", err
	}
	token, err = tokenOf(kubeconfig)
	return token, kubeconfig, err
}

// waitGuardInForce waits until the API server calls the guard for the agents: a dry-run
// eviction of a pod that does not exist, with an agent's token, refused by the guard (its
// caBundle published, its replicas answering through the proxy).
func (inst *chartInstall) waitGuardInForce(ctx context.Context, kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", kubeconfig, err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the agent's client: %w", err)
	}
	grace, uid := int64(1), types.UID("probe")
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		last = c.PolicyV1().Evictions(chartNamespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "guard-probe", Namespace: chartNamespace},
			DeleteOptions: &metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}, DryRun: []string{metav1.DryRunAll}}})
		return last != nil && apierrors.IsForbidden(last) && strings.Contains(last.Error(), "eviction guard refused"), nil
	}); err != nil {
		return fmt.Errorf("waiting for the eviction guard to be in force: %w (last answer: %v)", err, last)
	}
	return nil
}

// guardFigures are what the guard's replicas counted, added up (RSS and the in-flight peak:
// the largest).
type guardFigures struct {
	Results     map[string]float64 // reprieve_guard_reviews_total by result
	Lookups     map[string]float64 // reprieve_guard_pod_lookups_total by from
	InFlight    float64            // reprieve_guard_source_reviews_in_flight_peak
	ConnRefused float64
	RSS         float64 // process_resident_memory_bytes
	IndexPods   float64
}

func (inst *chartInstall) guardMetrics(ctx context.Context) (guardFigures, error) {
	f := guardFigures{Results: map[string]float64{}, Lookups: map[string]float64{}}
	hc := insecureClient()
	for _, addr := range inst.addrs {
		text, err := httpText(ctx, hc, "https://"+addr+guard.PathMetrics)
		if err != nil {
			return f, err
		}
		s, err := parseMetrics(text)
		if err != nil {
			return f, err
		}
		for _, r := range []string{guard.ResultAllowed, guard.ResultDenied, guard.ResultError, guard.ResultRejected} {
			f.Results[r] += sum(s, "reprieve_guard_reviews_total", map[string]string{"result": r})
		}
		for _, from := range []string{guard.FromIndex, guard.FromAPI} {
			f.Lookups[from] += sum(s, "reprieve_guard_pod_lookups_total", map[string]string{"from": from})
		}
		f.InFlight = max(f.InFlight, sum(s, "reprieve_guard_source_reviews_in_flight_peak", nil))
		f.ConnRefused += sum(s, "reprieve_guard_connections_refused_total", nil)
		f.RSS = max(f.RSS, sum(s, "process_resident_memory_bytes", nil))
		f.IndexPods = max(f.IndexPods, sum(s, "reprieve_guard_index_pods", nil))
	}
	return f, nil
}

func httpText(ctx context.Context, hc *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("reading %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b), nil
}

// uninstall deletes the webhook first (so that no eviction meets a guard that is gone), then
// the other objects it created, stops the guard and its proxy and deletes the agents' pods.
func (inst *chartInstall) uninstall(ctx context.Context) {
	slices.SortStableFunc(inst.created, func(a, b *unstructured.Unstructured) int {
		return boolInt(b.GetKind() == "ValidatingWebhookConfiguration") - boolInt(a.GetKind() == "ValidatingWebhookConfiguration")
	})
	for _, o := range inst.created {
		var ri dynamic.ResourceInterface = inst.dyn.Resource(chartKinds[o.GetKind()])
		if o.GetNamespace() != "" {
			ri = inst.dyn.Resource(chartKinds[o.GetKind()]).Namespace(o.GetNamespace())
		}
		if err := ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			inst.b.o.Logf("pool: deleting %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	stopAll(inst.guards)
	if inst.proxy != nil {
		inst.proxy.Close()
	}
	for _, name := range inst.agentPods {
		if err := inst.b.env.Client.CoreV1().Pods(chartNamespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil && !apierrors.IsNotFound(err) {
			inst.b.o.Logf("pool: deleting %s: %v", name, err)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// tcpProxy stands in for the guard's Service: it passes each connection to the next replica
// that accepts one, as kube-proxy spreads a Service's connections over its ready endpoints.
type tcpProxy struct {
	ln net.Listener

	mu       sync.Mutex
	backends []string
	next     int
	conns    map[net.Conn]bool
}

func startTCPProxy(addr string) (*tcpProxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("starting the guard's proxy: %w", err)
	}
	p := &tcpProxy{ln: ln, conns: map[net.Conn]bool{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p, nil
}

func (p *tcpProxy) setBackends(b []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.backends = slices.Clone(b)
}

func (p *tcpProxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
}

func (p *tcpProxy) serve(c net.Conn) {
	p.track(c, true)
	defer func() { p.track(c, false); _ = c.Close() }()
	p.mu.Lock()
	order := make([]string, 0, len(p.backends))
	for i := range p.backends {
		order = append(order, p.backends[(p.next+i)%len(p.backends)])
	}
	p.next++
	p.mu.Unlock()
	for _, b := range order {
		up, err := net.DialTimeout("tcp", b, time.Second)
		if err != nil {
			continue
		}
		p.track(up, true)
		defer func() { p.track(up, false); _ = up.Close() }()
		go func() {
			_, _ = io.Copy(up, c)
			if tc, ok := up.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
		}()
		_, _ = io.Copy(c, up)
		return
	}
}

// Close stops listening and closes every connection.
func (p *tcpProxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}
