package e2e

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/test/testenv"
)

// TestDoctor runs `reprieve doctor` (the real binary) against the real API server and metadata
// endpoints: all green with the shipped role and amazon-ec2-metadata-mock; a ServiceAccount that
// lacks one permission gets that permission named with its fix; metadata endpoints that are down,
// or an IMDSv2 token request that never answers (the hop-limit symptom), fail with their fix.
func TestDoctor(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "doctor", "doctor-node"
	setupNode(ctx, t, ns, node, nil)
	kubeletConfig := kubeletConfigFile(t)
	doctor := func(t *testing.T, kubeconfig string, args ...string) (int, string) {
		t.Helper()
		// This machine runs no kubelet: its root filesystem stands in for nodefs and imagefs,
		// and a configuration file of the test's for the kubelet's (without one doctor fails:
		// the thresholds are unknown, TestDoctorReadsPlatformProfiles).
		cmd := exec.CommandContext(ctx, reprieveBin, append([]string{"doctor", "--kubeconfig=" + kubeconfig, "--node=" + node,
			"--kubelet-root-dir=/", "--imagefs-dir=/", "--kubelet-config=" + kubeletConfig}, args...)...)
		cmd.Env = append(os.Environ(), "NODE_NAME=")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return 0, string(out)
		case errors.As(err, &exit):
			return exit.ExitCode(), string(out)
		}
		t.Fatalf("running reprieve doctor: %v", err)
		return 0, ""
	}

	t.Run("all green", func(t *testing.T) {
		mock, endpoint, err := testenv.StartIMDSMock(ctx, logDir, "--imdsv2")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = mock.Stop() }()
		code, out := doctor(t, agentKubeconfig, "--provider=aws", "--aws-imds-endpoint="+endpoint)
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		for _, want := range []string{"ok    Kubernetes API server reachable", "ok    authenticated as system:serviceaccount:kube-system:reprieve",
			"ok    permission create pods/eviction", "ok    node doctor-node exists", "ok    IMDSv2 token", "ok    metadata service (aws) answers",
			"ok    kubelet config " + kubeletConfig + ": evictionHard memory.available<100Mi", "ok    memory.available ", "ok    nodefs.available ", "ok    pid.available ", "Every check passed."} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("a permission missing", func(t *testing.T) {
		shipped, err := env.Client.RbacV1().ClusterRoles().Get(ctx, "reprieve", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "reprieve-without-eviction"}}
		for _, r := range shipped.Rules {
			if !(len(r.Resources) == 1 && r.Resources[0] == "pods/eviction") {
				role.Rules = append(role.Rules, r)
			}
		}
		if len(role.Rules) != len(shipped.Rules)-1 {
			t.Fatalf("the shipped role has no rule for pods/eviction alone: %+v", shipped.Rules)
		}
		if _, err := env.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "doctor"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "reprieve-without-eviction"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "doctor", Namespace: ns}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		kubeconfig, err := env.ServiceAccountKubeconfig(ctx, ns, "doctor")
		if err != nil {
			t.Fatal(err)
		}
		code, out := doctor(t, kubeconfig, "--provider=none")
		if code != 1 {
			t.Errorf("exit %d, want 1", code)
		}
		if want := "FAIL  permission create pods/eviction: not granted to system:serviceaccount:doctor:doctor"; !strings.Contains(out, want) ||
			!strings.Contains(out, `fix: add {apiGroups: [""], resources: ["pods/eviction"], verbs: ["create"]}`) {
			t.Errorf("output lacks %q and its fix:\n%s", want, out)
		}
		if n := strings.Count(out, "FAIL"); n != 1 {
			t.Errorf("%d failures, want only the missing permission:\n%s", n, out)
		}
	})

	t.Run("metadata down", func(t *testing.T) {
		// Port 1: a port a reserved-then-closed one is not (another parallel test's server took
		// one between the reservation and doctor's call, and Azure's check got its 404): the
		// kernel hands out ports for :0 from ip_local_port_range only, never below 1024.
		const addr = "127.0.0.1:1"
		for provider, flag := range map[string]string{
			"aws":   "--aws-imds-endpoint=http://" + addr,
			"gcp":   "--gcp-metadata-endpoint=" + addr,
			"azure": "--azure-imds-endpoint=http://" + addr,
		} {
			code, out := doctor(t, agentKubeconfig, "--provider="+provider, flag)
			if code != 1 || !strings.Contains(out, "connection refused") || !strings.Contains(out, "fix: ") {
				t.Errorf("%s endpoint down: exit %d, want 1 with the refusal and a fix:\n%s", provider, code, out)
			}
		}
	})

	t.Run("hop limit", func(t *testing.T) {
		// Accepts the connection and never answers the token request, as IMDSv2's answer with a
		// hop limit of 1 never reaches a pod network.
		release := make(chan struct{})
		silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}))
		defer silent.Close()
		defer close(release)
		code, out := doctor(t, agentKubeconfig, "--provider=aws", "--aws-imds-endpoint="+silent.URL)
		if code != 1 || !strings.Contains(out, "no answer in 2 s") || !strings.Contains(out, "hostNetwork: true") {
			t.Errorf("exit %d, want 1 naming the hop-limit symptom and its fix:\n%s", code, out)
		}
	})
}

// kubeletConfigFile writes a KubeletConfiguration as kubeadm writes it, with the kubelet's
// default hard thresholds, for the doctor runs of a machine that runs no kubelet; its path is
// absolute, so it is under --host-root=/.
func kubeletConfigFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"+
		"evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 10%\n  nodefs.inodesFree: 5%\n  imagefs.available: 15%\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
