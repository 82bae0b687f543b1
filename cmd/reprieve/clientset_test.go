package main

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
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
