package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/agent/config"
)

// TestBinaryLinksOnlyItsGroups checks that the binary does not link client-go's clientset or
// its scheme, which register every API group at init (agent/kube), and that of k8s.io/api it
// links only the groups agent/kube registers and admission/v1 (the eviction guard's reviews).
func TestBinaryLinksOnlyItsGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	allowed := []string{"k8s.io/api/core/v1", "k8s.io/api/policy/v1", "k8s.io/api/authentication/v1",
		"k8s.io/api/authorization/v1", "k8s.io/api/apps/v1", "k8s.io/api/batch/v1", "k8s.io/api/admission/v1",
		// batch/v1's Job names the scheduling group's workload reference.
		"k8s.io/api/scheduling/v1alpha3",
		// storage.k8s.io: CSIDrivers (whether a pod's volume attaches, agent/volumes_api.go),
		// which k8s.io/csi-translation-lib links anyway (0.55 MB of the stripped binary's
		// 29.5 MB with the library, `go build -trimpath -ldflags=-s -w` with and without it,
		// 2026-12-05).
		"k8s.io/api/storage/v1"}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "k8s.io/api/core/v1") {
		t.Fatalf("go list named no k8s.io/api/core/v1 among %d packages: is it listing the binary?", len(deps))
	}
	for _, p := range deps {
		switch {
		case p == "k8s.io/client-go/kubernetes" || strings.HasPrefix(p, "k8s.io/client-go/kubernetes/"):
			t.Errorf("the binary links %s, whose scheme registers every API group: use agent/kube", p)
		case strings.HasPrefix(p, "k8s.io/api/") && !slices.Contains(allowed, p):
			t.Errorf("the binary links %s, a group agent/kube does not register", p)
		}
	}
}

// TestClientSpeaksProtobuf checks that every request of the agent's client asks for and sends
// protobuf, with JSON still accepted: the typed calls of agent/kube and those made on the REST
// client directly, as agent/evict's postEviction makes its evictions (without the config's
// content type, JSON).
func TestClientSpeaksProtobuf(t *testing.T) {
	type seen struct{ accept, contentType string }
	got := make(chan seen, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Header.Get("Accept"), r.Header.Get("Content-Type")}
		http.Error(w, "no", http.StatusTeapot)
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+srv.URL+`"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.DefaultConfig()
	cfg.Kubeconfig = kubeconfig
	c, err := newClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, _ = c.CoreV1().Nodes().Get(ctx, "n", metav1.GetOptions{})
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
	_ = c.CoreV1().RESTClient().Post().Namespace(ev.Namespace).Resource("pods").Name(ev.Name).SubResource("eviction").
		MaxRetries(0).Body(ev).Do(ctx).Error()
	const accept, protobuf = "application/vnd.kubernetes.protobuf,application/json", "application/vnd.kubernetes.protobuf"
	if read := <-got; read.accept != accept {
		t.Errorf("node read: Accept %q, want %q", read.accept, accept)
	}
	if evict := <-got; evict.accept != accept || evict.contentType != protobuf {
		t.Errorf("eviction: Accept %q, Content-Type %q; want %q, %q", evict.accept, evict.contentType, accept, protobuf)
	}
}
