package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/reprieve-dev/reprieve/agent/guard"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// isCABundleRole says whether a ClusterRole of the guard's render is the one that lets the guard
// write its own webhook configuration's caBundle (<name>-ca-bundle), not the one that reads pods.
func isCABundleRole(r *rbacv1.ClusterRole) bool { return strings.HasSuffix(r.Name, "-ca-bundle") }

// guardProxy stands in for the guard's Service: it passes each connection to the next replica
// that accepts one, as kube-proxy sends a Service's connections to its ready endpoints only.
type guardProxy struct {
	ln net.Listener

	mu       sync.Mutex
	backends []string
	next     int
}

func startGuardProxy(t *testing.T, backends ...string) *guardProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &guardProxy{ln: ln, backends: backends}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *guardProxy) serve(c net.Conn) {
	defer func() { _ = c.Close() }()
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
		defer func() { _ = up.Close() }()
		go func() { _, _ = io.Copy(up, c); _ = up.(*net.TCPConn).CloseWrite() }()
		_, _ = io.Copy(c, up)
		return
	}
}

// startChartGuard runs `$REPRIEVE_BIN eviction-guard` with the args of the chart's Deployment,
// except the listener (addr) and the kubeconfig (the guard's ServiceAccount), with 127.0.0.1
// added to its certificate's hosts (the proxy's address, which the webhook's URL names).
func startChartGuard(ctx context.Context, t *testing.T, name, kubeconfig, addr string, chartArgs []string, extra ...string) *testenv.Process {
	t.Helper()
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
	args = append(append(args, "--kubeconfig="+kubeconfig, "-v=2"), extra...)
	p, err := testenv.StartProcess(ctx, name, filepath.Join(logDir, name+".log"), reprieveBin, args, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	return p
}

// guardChart renders the chart's guard for release in ns and returns its objects: those the test
// applies (the Deployment and its budget are run by the test as processes instead, and the
// webhook calls the proxy's URL instead of the Service, which this cluster cannot route to),
// the Deployment's container args, and the manifest's bytes.
func guardChart(t *testing.T, release, ns, proxyURL string, set ...string) (apply []*unstructured.Unstructured, args []string, manifest []byte) {
	t.Helper()
	manifest, err := helm(t, append([]string{"template", release, chartDir, "--namespace", ns, "--set", "cloud=aws",
		"--show-only", "templates/eviction-guard.yaml"}, set...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range manifestObjects(t, "eviction-guard.yaml", manifest) {
		switch o.GetKind() {
		case "Deployment":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
				t.Fatal(err)
			}
			args = d.Spec.Template.Spec.Containers[0].Args
			continue
		case "PodDisruptionBudget":
			continue
		case "ValidatingWebhookConfiguration":
			hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
			if len(hooks) != 1 {
				t.Fatalf("the render has %d webhooks; want 1", len(hooks))
			}
			hooks[0].(map[string]any)["clientConfig"] = map[string]any{"url": proxyURL}
			if err := unstructured.SetNestedSlice(o.Object, hooks, "webhooks"); err != nil {
				t.Fatal(err)
			}
		}
		apply = append(apply, o)
	}
	if len(args) == 0 {
		t.Fatal("the render has no guard Deployment")
	}
	return apply, args, manifest
}

// TestLifecycleGuardCertificateSurvivesReapply installs the chart's eviction guard as GitOps
// tools do, from `helm template` with no lookup (kubectl's client-side apply), runs two replicas
// with the Deployment's own args, and, while the agent of node A keeps evicting (server-side dry
// runs, every 50 ms) through the guard, renders the chart again and applies it twice more
// (client-side, then server-side as Argo CD's ServerSideApply does) and restarts a replica, as
// a rollout does. Every eviction must pass: no window of failures. The guard's Secret and the
// webhook's caBundle are those the guard made, before and after; each replica serves a
// certificate that verifies for the Service's name against the caBundle. Then, with both replicas
// down, `reprieve doctor` names the guard as unreachable, and so do the agent's /readyz detail
// and metric while it stays Ready; a replica back, the agent's warning goes.
func TestLifecycleGuardCertificateSurvivesReapply(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const ns, release, nodeA, nodeB = "lc-guard", "lcg", "lc-guard-a", "lc-guard-b"
	const sa, guardSA, name = release + "-reprieve", release + "-reprieve-eviction-guard", release + "-reprieve-eviction-guard"
	c := env.Client
	// The agent's identity as the chart names it, with the shipped role and policies, and a
	// token bound to its pod on node A.
	kubeA := boundAgents(ctx, t, ns, sa, nodeA, nodeB)
	agentA := clientFor(t, kubeA)

	ports := make([]string, 2)
	for i := range ports {
		p, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	proxy := startGuardProxy(t, ports...)
	url := "https://" + proxy.ln.Addr().String() + "/validate-eviction"

	objs, args, first := guardChart(t, release, ns, url)
	if bytes.Contains(first, []byte("PRIVATE KEY")) || bytes.Contains(first, []byte("caBundle:")) {
		t.Fatal("the default render carries a key or a caBundle; want the guard to make them")
	}
	ap := newApplier(t)
	t.Cleanup(func() { ap.deleteAll(context.Background(), objs) })
	ap.clientSide(ctx, t, objs)

	guardKube, err := env.ServiceAccountKubeconfig(ctx, ns, guardSA)
	if err != nil {
		t.Fatal(err)
	}
	// A sync a second, not a minute: more of the replicas' syncs meet during the re-applies.
	replicas := []*testenv.Process{
		startChartGuard(ctx, t, "lc-guard-0", guardKube, ports[0], args, "--tls-sync-interval=1s"),
		startChartGuard(ctx, t, "lc-guard-1", guardKube, ports[1], args, "--tls-sync-interval=1s"),
	}

	victim, err := c.CoreV1().Pods(ns).Get(ctx, "victim-"+nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	evictA := func() error { return evict(ctx, agentA, ns, victim.Name, ptr64(30), &victim.UID, true) }
	waitFor(ctx, t, "the guard's certificate published and the guard answering", func() bool { return evictA() == nil })

	secretOf := func() *v1.Secret {
		t.Helper()
		s, err := c.CoreV1().Secrets(ns).Get(ctx, name+"-tls", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	bundleOf := func() []byte {
		t.Helper()
		h, err := c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return h.Webhooks[0].ClientConfig.CABundle
	}
	before, bundle := secretOf(), bundleOf()
	if !bytes.Equal(bundle, before.Data["ca.crt"]) {
		t.Fatal("the webhook's caBundle is not the guard's Secret's ca.crt")
	}

	// The agent keeps evicting through the guard from here on.
	var ok, failed atomic.Int64
	var errMu sync.Mutex
	var errs []string
	stop := make(chan struct{})
	var hammer sync.WaitGroup
	hammer.Add(1)
	go func() {
		defer hammer.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if err := evictA(); err != nil {
				failed.Add(1)
				errMu.Lock()
				if len(errs) < 5 {
					errs = append(errs, time.Now().Format("15:04:05.000")+" "+err.Error())
				}
				errMu.Unlock()
				continue
			}
			ok.Add(1)
		}
	}()

	// A re-render: the same bytes (nothing generated), applied as kubectl apply does.
	objs2, _, second := guardChart(t, release, ns, url)
	if !bytes.Equal(first, second) {
		t.Error("two renders of the chart differ; want the same objects at every sync")
	}
	ap.clientSide(ctx, t, objs2)
	time.Sleep(3 * time.Second) // three of each replica's syncs
	// Argo CD with ServerSideApply=true, Flux.
	ap.serverSide(ctx, t, "argocd-controller", objs2)
	time.Sleep(3 * time.Second)
	// A rollout: replica 0 stops and a new process takes its place, and reads the Secret.
	_ = replicas[0].Stop()
	replicas[0] = startChartGuard(ctx, t, "lc-guard-0b", guardKube, ports[0], args, "--tls-sync-interval=1s")
	time.Sleep(3 * time.Second)
	close(stop)
	hammer.Wait()

	t.Logf("through the re-applies and the restart: %d evictions passed, %d failed", ok.Load(), failed.Load())
	if failed.Load() != 0 || ok.Load() < 20 {
		t.Errorf("through the re-applies and the restart: %d evictions passed, %d failed; want none failed, at least 20 passed:\n%s",
			ok.Load(), failed.Load(), strings.Join(errs, "\n"))
	}
	after := secretOf()
	for _, k := range []string{"ca.crt", "ca.key", "tls.crt", "tls.key"} {
		if !bytes.Equal(before.Data[k], after.Data[k]) {
			t.Errorf("the Secret's %s changed across the re-applies; want the guard's kept", k)
		}
	}
	if !bytes.Equal(bundleOf(), bundle) {
		t.Error("the webhook's caBundle changed across the re-applies; want the guard's kept")
	}
	// Each replica's certificate verifies for the Service's name (what the API server dials in a
	// cluster) against the caBundle.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	for _, addr := range ports {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: name + "." + ns + ".svc"})
		if err != nil {
			t.Errorf("replica %s: its certificate does not verify for %s.%s.svc against the caBundle: %v", addr, name, ns, err)
			continue
		}
		_ = conn.Close()
	}

	// Both replicas down: doctor, as node A's agent, names the guard.
	for _, r := range replicas {
		_ = r.Stop()
	}
	out, err := exec.CommandContext(ctx, reprieveBin, "doctor", "--kubeconfig="+kubeA, "--node="+nodeA, "--provider=none",
		"--kubelet-root-dir=/", "--imagefs-dir=/", "--kubelet-config="+kubeletConfigFile(t)).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	if want := "FAIL  the eviction guard is unreachable"; !strings.Contains(string(out), want) || !strings.Contains(string(out), "eviction-guard.reprieve.io") {
		t.Errorf("doctor with the guard down does not say %q naming its webhook:\n%s", want, out)
	}
	if err == nil {
		t.Error("doctor with the guard down exited 0; want a failure")
	}

	// And node A's agent, started with the guard down, says so in its readiness detail and its
	// metric while staying Ready (the path falls back to a DELETE at each last safe moment); a
	// replica back, the warning goes within the check's backoff.
	p, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, nodeA, "--kubeconfig="+kubeA, "--provider=none",
		"--pod-name=agent-"+nodeA, "--pod-namespace="+ns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const unreachable = "warning: the eviction guard is unreachable since"
	waitFor(ctx, t, "the agent's readiness detail naming the guard", func() bool {
		_, body := readyz()
		return strings.Contains(body, unreachable)
	})
	if code, body := readyz(); code != http.StatusOK || !strings.Contains(body, guard.WebhookName) {
		t.Errorf("/readyz with the guard down: %d %q; want 200 (still Ready) naming the webhook %s", code, body, guard.WebhookName)
	}
	if text, err := scenario.Scrape(addr); err != nil || !strings.Contains(text, `reprieve_evictions_check_status{status="guard_unreachable"} 1`) {
		t.Errorf("the metric with the guard down: %v %s", err, grep(text, "reprieve_evictions_check_status"))
	}
	replicas[0] = startChartGuard(ctx, t, "lc-guard-0c", guardKube, ports[0], args, "--tls-sync-interval=1s")
	defer func() { _ = replicas[0].Stop() }()
	waitFor(ctx, t, "the warning gone with a replica back", func() bool {
		code, body := readyz()
		return code == http.StatusOK && strings.HasPrefix(body, "ok\n") && !strings.Contains(body, "warning:")
	})
}
