package e2e

import (
	"strings"
	"testing"
)

// testChartGitOps (issue 49, item 2): the paths that apply the chart as it renders, without a
// cluster to look at (`helm template | kubectl apply`, kustomize's helmCharts, Argo CD), get no
// cleanup hook by default: nothing that `kubectl apply` would create at install (its Job, which
// waited for agents that never go and failed, and its node-patching identity). Helm's own actions,
// which run hooks (helm install, upgrade, uninstall; Flux's helm-controller), render it as before,
// every object a post-delete hook; cleanup.argoCD renders it without a cluster too, every object a
// post-delete hook, which Argo CD runs as a PostDelete hook once its Application is deleted.
func testChartGitOps(t *testing.T) {
	hooked := func(t *testing.T, manifest []byte) (hooks, cleanup int) {
		t.Helper()
		for _, o := range manifestObjects(t, "render", manifest) {
			name := o.GetName()
			isCleanup := strings.HasSuffix(name, "-cleanup") || o.GetLabels()["app.kubernetes.io/component"] == "cleanup"
			if o.GetAnnotations()["helm.sh/hook"] == "post-delete" {
				hooks++
			}
			if isCleanup {
				cleanup++
				if o.GetAnnotations()["helm.sh/hook"] != "post-delete" {
					t.Errorf("%s %s of the cleanup is not a post-delete hook: an apply would create it at install", o.GetKind(), name)
				}
			}
			if o.GetKind() == "Job" && o.GetAnnotations()["helm.sh/hook"] != "post-delete" {
				t.Errorf("Job %s is not a hook", name)
			}
		}
		return hooks, cleanup
	}
	// helm template, as `helm template | kubectl apply`, kustomize and Argo CD render.
	for _, args := range [][]string{nil, {"-f", "deploy/chart/values-gcp.yaml"}, {"-f", "deploy/chart/values-azure.yaml"}} {
		if h, c := hooked(t, render(t, "gitops", args...)); h != 0 || c != 0 {
			t.Errorf("helm template %v renders %d hooks, %d cleanup objects; want none: an apply would create them at install", args, h, c)
		}
	}
	// Argo CD: the hook, every object of it a post-delete hook.
	h, c := hooked(t, render(t, "gitops", "--set", "cleanup.argoCD=true"))
	if h == 0 || c == 0 || h != c {
		t.Errorf("helm template with cleanup.argoCD renders %d hooks and %d cleanup objects; want the cleanup's, each a post-delete hook", h, c)
	}
	// Helm with a cluster (helm install --dry-run=server renders as helm install does): the hook.
	out, err := helm(t, "template", "gitops", chartDir, "--namespace", "kube-system", "--set", "cloud=aws", "--dry-run=server", "--kubeconfig", env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if h, c := hooked(t, out); h == 0 || c == 0 {
		t.Errorf("a render with a cluster has %d hooks, %d cleanup objects; want the cleanup hook, which helm uninstall runs", h, c)
	}
}
