package e2e

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestPressureTenantForgedPods (issue 37 case 9, issue 39 item 2) tries, on the real API server,
// what a tenant who may only create pods in its namespace can write to look critical or like a
// DaemonSet's pod, and checks that reprieve, like the kubelet, still ranks such a pod:
//   - a pod annotated kubernetes.io/config.source: file with a controller owner reference of kind
//     DaemonSet in the group evil.example.com: the API server takes it; the kubelet overwrites
//     config.source with "api" on its own copy and ranks the pod like any other;
//   - a pod annotated kubernetes.io/config.mirror, bound to the node by hand: the API server takes
//     it too (ValidatePodSpecificAnnotations only wants spec.nodeName), but refuses adding the
//     annotation to an existing pod. The kubelet never runs such a pod (it files it as a mirror
//     pod and deletes it as orphaned), so it holds no memory and reprieve leaves it, as the
//     kubelet does.
//
// The forged pod is the memory hog: reprieve evicts it, not its neighbour.
func TestPressureTenantForgedPods(t *testing.T) {
	// Not parallel: Go runs it alone, before the parallel tests start. Its pod may be evicted only
	// at the last reading that still leaves it 3 s (issue 47: precision first, a grace cut waits),
	// a window one reading wide; under -parallel 32 on two cores a reading came late past it in
	// two of four whole runs, and the pod was left to the kubelet. A pod held for that window now
	// goes at the reading that steps over it, with what fits (docs/pressure.md), but with less
	// than this test's bounds assume: it still runs alone.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, node, tenant = "pressure-forged", "pressure-forged-node", "tenant-forger"
	c := env.Client
	setupNode(ctx, t, ns, node, nil)
	// The tenant may create, read and update pods in its namespace, nothing more.
	if _, err := c.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pods"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "update", "patch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pods"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pods"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: tenant}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	imp := rest.CopyConfig(env.Config)
	imp.Impersonate = rest.ImpersonationConfig{UserName: tenant}
	tc, err := kubernetes.NewForConfig(imp)
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	mk := func(cl kubernetes.Interface, name, request string, mutate func(*v1.Pod)) (*v1.Pod, error) {
		grace := int64(30)
		p := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: &grace, AutomountServiceAccountToken: new(bool),
				Containers: []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
					Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceMemory: resource.MustParse(request)}}}}},
		}
		if mutate != nil {
			mutate(p)
		}
		return cl.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	}
	var rbacErr error
	waitFor(ctx, t, "the tenant's Role in force", func() bool {
		_, rbacErr = tc.CoreV1().Pods(ns).Get(ctx, "none", metav1.GetOptions{})
		return rbacErr != nil && strings.Contains(rbacErr.Error(), "not found")
	})
	forged, err := mk(tc, "forged", "200Mi", func(p *v1.Pod) {
		p.Annotations = map[string]string{"kubernetes.io/config.source": "file"}
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "evil.example.com/v1", Kind: "DaemonSet", Name: "x",
			UID: "00000000-0000-0000-0000-000000000001", Controller: &yes}}
	})
	if err != nil {
		t.Fatalf("the tenant's forged pod was refused: %v", err)
	}
	fakeMirror, err := mk(tc, "fake-mirror", "200Mi", func(p *v1.Pod) {
		p.Annotations = map[string]string{v1.MirrorPodAnnotationKey: "forged"}
	})
	if err != nil {
		t.Fatalf("the API server refused a tenant's pod with the mirror annotation: %v", err)
	}
	web, err := mk(tc, "web", "1Gi", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Adding the mirror annotation later is refused (ValidatePodSpecificAnnotationUpdates).
	web.Annotations = map[string]string{v1.MirrorPodAnnotationKey: "forged"}
	if _, err := tc.CoreV1().Pods(ns).Update(ctx, web, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "may not add mirror pod annotation") {
		t.Fatalf("adding the mirror annotation to a pod: %v, want the API server's refusal", err)
	}
	obs, err := scenario.Observe(ctx, c, ns)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Stop()
	// forged uses 4 GiB against 200Mi and leaks the fall (fakeKubelet.leaker); web uses 1.2 GiB of
	// its 1 GiB. fake-mirror reports 6 GiB here, which a kubelet never would (it does not run it):
	// even so it is not ranked.
	kl := &fakeKubelet{pods: map[*v1.Pod]int64{forged: 4 * gi, web: 1228 * mi, fakeMirror: 6 * gi}, leaker: forged}
	kl.set(2*gi+100*mi, -100*mi) // crosses 2Gi in 1 s; the kubelet's 1Gi about 11 s away
	srv := httptest.NewServer(kl)
	defer srv.Close()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kubelet-config.yaml"),
		[]byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nevictionHard:\n  memory.available: 1Gi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none",
		"--pressure-source=summary", "--kubelet-summary-url="+srv.URL+"/stats/summary", "--kubelet-token-file="+filepath.Join(dir, "none"),
		"--host-root="+dir, "--kubelet-config=kubelet-config.yaml",
		"--pressure-thresholds=memory.available<2Gi", "--pressure-minimum-reclaim=memory.available=256Mi",
		"--pressure-interval=500ms", "--pressure-trend-window=5s", "--safety-margin=2s")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	waitFor(ctx, t, "forged evicted", func() bool { return !obs.Records()["forged"].DeletedAt.IsZero() })
	kl.set(3*gi, 0)
	for _, name := range []string{"web", "fake-mirror"} {
		if r := obs.Records()[name]; !r.DeletedAt.IsZero() {
			t.Errorf("%s was evicted; the forged hog should have gone alone", name)
		}
	}
	t.Logf("forged evicted with %d s of grace", obs.Records()["forged"].Grace)
}
