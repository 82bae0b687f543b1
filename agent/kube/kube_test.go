package kube

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// request is what a server sees of one request.
type request struct {
	method, path, query, contentType, accept string
	body                                     []byte
}

func (r request) String() string {
	return fmt.Sprintf("%s %s?%s (Content-Type %q, Accept %q, %d bytes of body)", r.method, r.path, r.query, r.contentType, r.accept, len(r.body))
}

// recorder is an API server that records each request and answers 404 with a Status.
func recorder(t *testing.T) (*httptest.Server, func() []request) {
	var mu sync.Mutex
	var seen []request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, request{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), r.Header.Get("Accept"), b})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []request {
		mu.Lock()
		defer mu.Unlock()
		out := seen
		seen = nil
		return out
	}
}

// TestSameRequestsAsClientGo checks that each call of this package's client sends the request
// client-go's typed client sends for the same call: method, path, query, content type, accept
// and body, byte for byte. The typed clients are the reference (what reprieve sent before it had
// a client of its own); the server only records.
func TestSameRequestsAsClientGo(t *testing.T) {
	srv, seen := recorder(t)
	cfg := &rest.Config{Host: srv.URL, UserAgent: "reprieve/test"}
	UseProtobuf(cfg)
	ours, err := NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	node := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "e1"}, Reason: "R", Message: "m"}
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
		DeleteOptions: &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}}
	list := metav1.ListOptions{FieldSelector: "spec.nodeName=n1", Limit: 500, Continue: "c", ResourceVersion: "0", TimeoutSeconds: ptr.To[int64](30)}
	patch := []byte(`{"status":{"conditions":[{"type":"X","status":"True"}]}}`)
	// The Accept this package sends instead of client-go's: a pod write's answer as metadata
	// only, discarded (pods.go).
	accept := map[string]string{"patch pod status": metadataOnly, "delete pod with grace and UID": metadataOnly}
	for _, tc := range []struct {
		name         string
		ours, theirs func() error
	}{
		{"get node", func() error { _, err := ours.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); return err },
			func() error { _, err := theirs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); return err }},
		{"list nodes", func() error { _, err := ours.CoreV1().Nodes().List(ctx, list); return err },
			func() error { _, err := theirs.CoreV1().Nodes().List(ctx, list); return err }},
		{"watch nodes", func() error { _, err := ours.CoreV1().Nodes().Watch(ctx, list); return err },
			func() error { _, err := theirs.CoreV1().Nodes().Watch(ctx, list); return err }},
		{"patch node, dry run", func() error {
			_, err := ours.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, []byte("{}"), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}, func() error {
			_, err := theirs.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, []byte("{}"), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"patch node status", func() error {
			_, err := ours.CoreV1().Nodes().Patch(ctx, "n1", types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
			return err
		}, func() error {
			_, err := theirs.CoreV1().Nodes().Patch(ctx, "n1", types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
			return err
		}},
		{"list pods of every namespace", func() error { _, err := ours.CoreV1().Pods("").List(ctx, list); return err },
			func() error { _, err := theirs.CoreV1().Pods("").List(ctx, list); return err }},
		{"watch pods", func() error { _, err := ours.CoreV1().Pods("").Watch(ctx, list); return err },
			func() error { _, err := theirs.CoreV1().Pods("").Watch(ctx, list); return err }},
		{"get pod", func() error { _, err := ours.CoreV1().Pods("ns").Get(ctx, "p", metav1.GetOptions{}); return err },
			func() error { _, err := theirs.CoreV1().Pods("ns").Get(ctx, "p", metav1.GetOptions{}); return err }},
		{"patch pod status", func() error {
			_, err := ours.CoreV1().Pods("ns").Patch(ctx, "p", types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
			return err
		}, func() error {
			_, err := theirs.CoreV1().Pods("ns").Patch(ctx, "p", types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
			return err
		}},
		{"delete pod with grace and UID", func() error {
			return ours.CoreV1().Pods("ns").Delete(ctx, "p", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](7), Preconditions: metav1.NewUIDPreconditions("u1")})
		}, func() error {
			return theirs.CoreV1().Pods("ns").Delete(ctx, "p", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](7), Preconditions: metav1.NewUIDPreconditions("u1")})
		}},
		{"eviction on the REST client", func() error {
			return ours.CoreV1().RESTClient().Post().Namespace("ns").Resource("pods").Name("p").SubResource("eviction").MaxRetries(0).Body(ev).Do(ctx).Error()
		}, func() error {
			return theirs.CoreV1().RESTClient().Post().Namespace("ns").Resource("pods").Name("p").SubResource("eviction").MaxRetries(0).Body(ev).Do(ctx).Error()
		}},
		{"eviction", func() error { return ours.PolicyV1().Evictions("ns").Evict(ctx, ev) },
			func() error { return theirs.PolicyV1().Evictions("ns").Evict(ctx, ev) }},
		{"create event", func() error {
			_, err := ours.CoreV1().Events("default").Create(ctx, node, metav1.CreateOptions{})
			return err
		},
			func() error {
				_, err := theirs.CoreV1().Events("default").Create(ctx, node, metav1.CreateOptions{})
				return err
			}},
		{"the recorder's create", func() error { _, err := (&EventSink{ours.CoreV1().Events("")}).Create(node); return err },
			func() error { _, err := theirs.CoreV1().Events("").CreateWithEventNamespace(node); return err }},
		{"the recorder's update", func() error { _, err := (&EventSink{ours.CoreV1().Events("")}).Update(node); return err },
			func() error { _, err := theirs.CoreV1().Events("").UpdateWithEventNamespace(node); return err }},
		{"the recorder's patch", func() error {
			_, err := (&EventSink{ours.CoreV1().Events("")}).Patch(node, []byte(`{"count":2}`))
			return err
		}, func() error {
			_, err := theirs.CoreV1().Events("").PatchWithEventNamespace(node, []byte(`{"count":2}`))
			return err
		}},
		{"list budgets", func() error {
			_, err := ours.PolicyV1().PodDisruptionBudgets("ns").List(ctx, metav1.ListOptions{})
			return err
		},
			func() error {
				_, err := theirs.PolicyV1().PodDisruptionBudgets("ns").List(ctx, metav1.ListOptions{})
				return err
			}},
		{"list ReplicaSets", func() error { _, err := ours.AppsV1().ReplicaSets("ns").List(ctx, metav1.ListOptions{}); return err },
			func() error { _, err := theirs.AppsV1().ReplicaSets("ns").List(ctx, metav1.ListOptions{}); return err }},
		{"list Jobs", func() error { _, err := ours.BatchV1().Jobs("ns").List(ctx, metav1.ListOptions{}); return err },
			func() error { _, err := theirs.BatchV1().Jobs("ns").List(ctx, metav1.ListOptions{}); return err }},
		{"SelfSubjectReview", func() error {
			_, err := ours.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
			return err
		}, func() error {
			_, err := theirs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
			return err
		}},
		{"SelfSubjectAccessReview", func() error {
			_, err := ours.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
				Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "create", Resource: "pods", Subresource: "eviction"}}}, metav1.CreateOptions{})
			return err
		}, func() error {
			_, err := theirs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
				Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "create", Resource: "pods", Subresource: "eviction"}}}, metav1.CreateOptions{})
			return err
		}},
		{"server version", func() error { _, err := ours.Discovery().ServerVersion(); return err },
			func() error { _, err := theirs.Discovery().ServerVersion(); return err }},
	} {
		errOurs := tc.ours()
		got := seen()
		errTheirs := tc.theirs()
		want := seen()
		if len(want) == 0 {
			t.Fatalf("%s: client-go sent no request (%v)", tc.name, errTheirs)
		}
		// client-go retries nothing on a 404; each call is one request.
		if len(got) != 1 || len(want) != 1 {
			t.Errorf("%s: %d requests, client-go %d: %v, %v", tc.name, len(got), len(want), got, want)
			continue
		}
		g, w := got[0], want[0]
		if a, ok := accept[tc.name]; ok {
			w.accept = a
		}
		if g.method != w.method || g.path != w.path || g.query != w.query || g.contentType != w.contentType ||
			g.accept != w.accept || !bytes.Equal(g.body, w.body) {
			t.Errorf("%s:\n sent   %v\n client-go %v", tc.name, g, w)
		}
		if (errOurs == nil) != (errTheirs == nil) {
			t.Errorf("%s: error %v, client-go's %v", tc.name, errOurs, errTheirs)
		}
	}
}

// TestOneRateLimiter checks that the groups share one rate limiter, as kubernetes.NewForConfig's
// clients do: --kube-api-qps bounds the agent's requests together, not once per group.
func TestOneRateLimiter(t *testing.T) {
	c, err := NewForConfig(&rest.Config{Host: "https://127.0.0.1:1", QPS: 5, Burst: 10})
	if err != nil {
		t.Fatal(err)
	}
	rl := c.core.GetRateLimiter()
	if rl == nil {
		t.Fatal("the core client has no rate limiter")
	}
	for name, g := range map[string]*rest.RESTClient{"policy": c.policy, "authentication": c.authentication,
		"authorization": c.authorization, "apps": c.apps, "batch": c.batch} {
		if g.GetRateLimiter() != rl {
			t.Errorf("the %s client has a rate limiter of its own", name)
		}
	}
	if _, err := NewForConfig(&rest.Config{Host: "https://127.0.0.1:1", QPS: 5}); err == nil {
		t.Error("a QPS without a burst was accepted")
	}
}
