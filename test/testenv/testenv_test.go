package testenv

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// requireTools skips the test when the tools are not built, unless REPRIEVE_E2E_REQUIRED=1
// makes that a failure.
func requireTools(t *testing.T) {
	t.Helper()
	if _, err := ToolsBin(); err != nil {
		if os.Getenv("REPRIEVE_E2E_REQUIRED") == "1" {
			t.Fatalf("end-to-end tools missing and REPRIEVE_E2E_REQUIRED=1: %v", err)
		}
		t.Skipf("skipping end-to-end test: %v (set REPRIEVE_E2E_REQUIRED=1 to make this a failure)", err)
	}
}

func TestSmoke(t *testing.T) {
	requireTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	begin := time.Now()
	env, err := Start(ctx, Options{ControllerManager: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Stop)
	t.Logf("Start took %s; logs in %s", time.Since(begin).Round(time.Millisecond), env.LogDir)
	defer func() {
		if t.Failed() {
			t.Logf("logs kept in %s", env.LogDir)
		}
	}()

	t.Run("pod lifecycle", func(t *testing.T) {
		const ns = "smoke"
		if err := env.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		node, err := env.CreateNode(ctx, "smoke-node", map[string]string{"pool": "spot"})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("node Ready in %s", time.Since(begin).Round(time.Millisecond))
		if got := node.Status.Allocatable.Pods().Value(); got != 300 {
			t.Errorf("allocatable pods = %d, want 300", got)
		}
		if got := node.Status.Allocatable.Cpu().Value(); got != 32 {
			t.Errorf("allocatable cpu = %d, want 32", got)
		}
		if node.Labels["pool"] != "spot" {
			t.Errorf("labels = %v, want pool=spot", node.Labels)
		}

		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
			Spec: corev1.PodSpec{
				NodeName:                      node.Name,
				TerminationGracePeriodSeconds: ptr.To[int64](3),
				Containers:                    []corev1.Container{{Name: "c", Image: "registry.invalid/none"}},
			},
		}
		if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod: %v", err)
		}
		begin = time.Now()
		waitFor(ctx, t, 30*time.Second, "pod Running and Ready", func() bool {
			p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "p", metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning && podReady(p)
		})
		t.Logf("pod Running in %s", time.Since(begin).Round(time.Millisecond))

		p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !hasToleration(p, corev1.TaintNodeNotReady) {
			t.Errorf("pod tolerations %v lack the DefaultTolerationSeconds ones", p.Spec.Tolerations)
		}

		deleted := time.Now()
		if err := env.Client.CoreV1().Pods(ns).Delete(ctx, "p", metav1.DeleteOptions{}); err != nil {
			t.Fatalf("deleting pod: %v", err)
		}
		waitFor(ctx, t, 15*time.Second, "pod gone", func() bool {
			_, err := env.Client.CoreV1().Pods(ns).Get(ctx, "p", metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
		gone := time.Since(deleted)
		t.Logf("pod gone %s after the delete", gone.Round(time.Millisecond))
		// The server's audit log has the delete, on the machine's clock, between the call and
		// its return (audit.go): what the timing tests read in place of their watch's sight.
		audit, err := env.Audit()
		if err != nil {
			t.Fatal(err)
		}
		if a, ok := FirstPodEnd(audit, ns, "p"); !ok {
			t.Errorf("the audit log has no accepted delete of %s/p: %+v", ns, audit)
		} else if a.Received.Before(deleted) || a.Answered.Before(a.Received) || a.Answered.After(deleted.Add(gone)) || a.User.Username != adminUser {
			t.Errorf("audited delete of %s/p by %s received %v, answered %v; want by %s between the call at %v and the pod's end %v later",
				ns, a.User.Username, a.Received, a.Answered, adminUser, deleted, gone)
		}
		if gone < 1900*time.Millisecond || gone > 3500*time.Millisecond {
			t.Errorf("pod vanished %s after a delete with 3 s grace, want 2-3.5 s (deletionTimestamp is whole seconds)", gone)
		}

		// A second delete with a shorter grace period (as the Eviction API or a forced
		// drain may send) moves the end earlier, as it does for a real kubelet.
		pod.Name = "q"
		pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](60)
		if _, err := env.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod: %v", err)
		}
		if err := env.Client.CoreV1().Pods(ns).Delete(ctx, "q", metav1.DeleteOptions{}); err != nil {
			t.Fatalf("deleting pod: %v", err)
		}
		// The second delete must meet a pod already terminating with its 60 s grace.
		waitFor(ctx, t, 15*time.Second, "pod terminating", func() bool {
			p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "q", metav1.GetOptions{})
			return err == nil && p.DeletionTimestamp != nil
		})
		deleted = time.Now()
		if err := env.Client.CoreV1().Pods(ns).Delete(ctx, "q", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](1)}); err != nil {
			t.Fatalf("deleting pod again: %v", err)
		}
		waitFor(ctx, t, 15*time.Second, "pod gone", func() bool {
			_, err := env.Client.CoreV1().Pods(ns).Get(ctx, "q", metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
		gone = time.Since(deleted)
		t.Logf("pod with 60 s grace gone %s after a second delete with 1 s grace", gone.Round(time.Millisecond))
		if gone > 1500*time.Millisecond {
			t.Errorf("pod vanished %s after a delete with 1 s grace, want at most 1.5 s", gone)
		}
	})

	t.Run("imds spot notice", func(t *testing.T) {
		when := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second).Format(time.RFC3339)
		mock, endpoint, err := StartIMDSMock(ctx, env.LogDir, "-I", "spot", "-a", "terminate", "-t", when)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := mock.Stop(); err != nil {
				t.Error(err)
			}
		}()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, endpoint+"/latest/api/token", nil)
		req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "60")
		token := string(do(t, req, http.StatusOK))
		if token == "" {
			t.Fatal("empty IMDSv2 token")
		}

		req, _ = http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/latest/meta-data/spot/instance-action", nil)
		if resp, err := http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		} else {
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("GET without a token with -I: %s, want 401", resp.Status)
			}
		}

		req.Header.Set("X-aws-ec2-metadata-token", token)
		body := do(t, req, http.StatusOK)
		var action struct {
			Action string `json:"action"`
			Time   string `json:"time"`
		}
		if err := json.Unmarshal(body, &action); err != nil {
			t.Fatalf("decoding %q: %v", body, err)
		}
		if action.Action != "terminate" || action.Time != when {
			t.Errorf("instance-action = %+v, want terminate at %s", action, when)
		}
	})

	// Nothing may have died along the way.
	for _, p := range env.Processes() {
		if p.Exited() {
			t.Errorf("%s exited (%s): %s", p.Name(), p.ExitDescription(), p.LogTail(20))
		}
	}
}

func TestStartFailureReportsLog(t *testing.T) {
	requireTools(t)
	real, err := ToolsBin()
	if err != nil {
		t.Fatal(err)
	}
	// A tools folder whose kube-apiserver fails at once.
	dir := t.TempDir()
	for _, name := range append(slices.Clone(requiredTools), KwokStagesDir) {
		if name == KubeAPIServerBin {
			continue
		}
		if err := os.Symlink(filepath.Join(real, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	script := "#!/bin/sh\necho 'flag provided but not defined: --boom' >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(dir, KubeAPIServerBin), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(ToolsBinEnv, dir)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logDir := t.TempDir()
	env, err := Start(ctx, Options{LogDir: logDir})
	if err == nil {
		env.Stop()
		t.Fatal("Start succeeded with a broken kube-apiserver")
	}
	t.Log(err)
	for _, want := range []string{"starting kube-apiserver", "--boom", "exit status 1", logDir} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q", want)
		}
	}
}

func TestToolsBinMissing(t *testing.T) {
	t.Setenv(ToolsBinEnv, t.TempDir())
	_, err := ToolsBin()
	if err == nil || !strings.Contains(err.Error(), "make tools") || !strings.Contains(err.Error(), EtcdBin) {
		t.Fatalf("ToolsBin() error = %v, want one naming %s and `make tools`", err, EtcdBin)
	}
}

func TestProcess(t *testing.T) {
	sh := "/bin/sh"
	if _, err := os.Stat(sh); err != nil {
		t.Skip("no /bin/sh")
	}
	log := t.TempDir() + "/p.log"
	ctx := context.Background()

	p, err := StartProcess(ctx, "ignores-term", log, sh, []string{"-c", `trap "" TERM; echo one; echo two; while :; do sleep 0.1; done`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 5*time.Second, "output", func() bool { return strings.Contains(p.LogTail(5), "two") })
	if got := p.LogTail(1); got != "two" {
		t.Errorf("LogTail(1) = %q, want %q", got, "two")
	}
	if _, err := p.Wait(100 * time.Millisecond); err == nil {
		t.Error("Wait on a running process returned no error")
	}
	begin := time.Now()
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(begin); d < 4*time.Second {
		t.Errorf("Stop of a process that ignores SIGTERM took %s, want about 5 s", d)
	}
	if err := p.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}

	p, err = StartProcess(ctx, "exits", log, sh, []string{"-c", "exit 3"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(5 * time.Second); err != nil || code != 3 {
		t.Errorf("Wait = %d, %v; want 3, nil", code, err)
	}
	if err := p.Kill(); err != nil {
		t.Errorf("Kill after exit: %v", err)
	}
}

func TestFreePort(t *testing.T) {
	ports, err := freePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	if ports[0] == ports[1] || ports[1] == ports[2] || ports[0] == ports[2] {
		t.Errorf("freePorts(3) = %v, want distinct ports", ports)
	}
}

// TestFreePortNeverRepeats: tests that run in parallel each ask for ports; the kernel hands a
// closed port out again at random (bind to port 0 picks from the whole ephemeral range), so
// among 500 answers some repeat unless FreePort remembers what it gave.
func TestFreePortNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 500 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("FreePort returned %d twice", p)
		}
		seen[p] = true
	}
}

func waitFor(ctx context.Context, t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func do(t *testing.T, req *http.Request, want int) []byte {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", req.Method, req.URL, err)
	}
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %s (%s), want %d", req.Method, req.URL, resp.Status, body, want)
	}
	return body
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func hasToleration(p *corev1.Pod, key string) bool {
	for _, tol := range p.Spec.Tolerations {
		if tol.Key == key {
			return true
		}
	}
	return false
}

// TestAPF: with Options.APF the API server runs API Priority and Fairness with the seats given
// (its answers carry APF's headers, and its priority levels share those seats), the default
// keeps it off, and RestartAPIServerWith switches it on the same address.
func TestAPF(t *testing.T) {
	requireTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := Start(ctx, Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Stop)
	// APF names the FlowSchema that classified a request in every answer
	// (k8s.io/apiserver/pkg/server/filters/priority-and-fairness.go).
	flowSchema := func(host string) string {
		cfg := rest.CopyConfig(env.Config)
		cfg.Host = host
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, host+"/api/v1/namespaces/default", nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID")
	}
	if fs := flowSchema(env.Host); fs != "" {
		t.Fatalf("APF answered on the default server (FlowSchema %s): it must stay off", fs)
	}
	peer, err := env.StartAPIServer(ctx, "apf", &APF{MaxRequestsInflight: 4, MaxMutatingRequestsInflight: 2})
	if err != nil {
		t.Fatal(err)
	}
	if fs := flowSchema(peer.Host); fs == "" {
		t.Fatal("no APF header from the server started with APF")
	}
	metrics, err := peer.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(metrics), `apiserver_flowcontrol_nominal_limit_seats{priority_level="workload-high"} 1`) {
		t.Errorf("workload-high's nominal seats are not 1 of 6 (ceil(6 x 40 / 245)):\n%s", grepLines(string(metrics), "nominal_limit_seats"))
	}
	if err := env.RestartAPIServerWith(ctx, &APF{MaxRequestsInflight: 8, MaxMutatingRequestsInflight: 4}); err != nil {
		t.Fatal(err)
	}
	if fs := flowSchema(env.Host); fs == "" {
		t.Fatal("no APF header after RestartAPIServerWith")
	}
}

func grepLines(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
