package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/reprieve-dev/reprieve/agent"
)

// TestClientsetGroups checks that every group of kubernetes.Interface that the binary's code
// calls (agent/, cmd/, providers/, kubelet/, outside tests) is one newClientset builds, and
// that each of those is built (any other is the nil interface clientset embeds), over one
// rate limiter.
func TestClientsetGroups(t *testing.T) {
	iface := reflect.TypeFor[kubernetes.Interface]()
	var names []string
	for i := range iface.NumMethod() {
		names = append(names, iface.Method(i).Name)
	}
	call := regexp.MustCompile(`\.(` + strings.Join(names, "|") + `)\(\)`)
	called := map[string]string{}
	for _, dir := range []string{"../../agent", "../../cmd", "../../providers", "../../kubelet"} {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range call.FindAllStringSubmatch(string(b), -1) {
				called[m[1]] = path
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(called) == 0 || called["CoreV1"] == "" {
		t.Fatalf("found no calls of the clientset's groups (%v): is the scan reading the sources?", called)
	}
	for name, path := range called {
		if !slices.Contains(clientsetGroups, name) {
			t.Errorf("%s calls %s(), which newClientset does not build: add it to clientset", path, name)
		}
	}
	c, err := newClientset(&rest.Config{Host: "https://127.0.0.1:1", QPS: 5, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	v := reflect.ValueOf(c)
	for _, name := range clientsetGroups {
		out := v.MethodByName(name).Call(nil)[0]
		if out.IsNil() {
			t.Errorf("newClientset built no %s client", name)
		}
	}
	// --kube-api-qps bounds the agent's requests together, as kubernetes.NewForConfig's shared
	// limiter does: not once per group.
	if core, policy := c.CoreV1().RESTClient().GetRateLimiter(), c.PolicyV1().RESTClient().GetRateLimiter(); core == nil || core != policy {
		t.Errorf("the groups do not share one rate limiter: core %p, policy %p", core, policy)
	}
}

// TestClientSpeaksProtobuf checks that every request of the agent's client asks for and sends
// protobuf, with JSON still accepted: the typed clients' own (client-go's gentype prefers
// protobuf for built-in types) and those made on the REST client directly, as agent/evict's
// postEviction makes its evictions (without the config's content type, JSON).
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
	cfg := agent.DefaultConfig()
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
