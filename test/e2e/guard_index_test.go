package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/guard"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// watchCutter is an HTTPS proxy between the guard and the API server that can take the guard's
// lists and watches away, as a network partition or an API server that drops its watches does,
// while single reads still pass: what the guard's index lives through (issue 46).
type watchCutter struct {
	URL    string
	CAPEM  []byte
	srv    *http.Server
	mu     sync.Mutex
	down   bool
	cancel map[*http.Request]context.CancelFunc
}

func startWatchCutter(t *testing.T) *watchCutter {
	t.Helper()
	target, err := url.Parse(env.Host)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.CAData)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true}
	rp.FlushInterval = -1
	certPEM, certFile, keyFile := selfSignedPair(t, t.TempDir())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &watchCutter{URL: "https://" + ln.Addr().String(), CAPEM: certPEM, cancel: map[*http.Request]context.CancelFunc{}}
	w.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		// A list or a watch: a GET of a collection (no name after the resource).
		seg := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		collection := r.Method == http.MethodGet && (r.URL.Query().Get("watch") != "" || seg[len(seg)-1] == "pods")
		if !collection {
			rp.ServeHTTP(rw, r)
			return
		}
		w.mu.Lock()
		if w.down {
			w.mu.Unlock()
			http.Error(rw, "cut by the test", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		w.cancel[r] = cancel
		w.mu.Unlock()
		defer func() { w.mu.Lock(); delete(w.cancel, r); w.mu.Unlock(); cancel() }()
		rp.ServeHTTP(rw, r.WithContext(ctx))
	})}
	go func() { _ = w.srv.ServeTLS(ln, certFile, keyFile) }()
	t.Cleanup(func() { _ = w.srv.Close() })
	return w
}

// cut ends every list and watch in flight and refuses new ones (503) while down.
func (w *watchCutter) cut(down bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.down = down
	if down {
		for _, c := range w.cancel {
			c()
		}
	}
}

// kubeconfig is kubeconfig's user, through the proxy.
func (w *watchCutter) kubeconfig(t *testing.T, kubeconfig string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server, c.CertificateAuthorityData, c.CertificateAuthority = w.URL, w.CAPEM, ""
	}
	path := filepath.Join(t.TempDir(), "guard-via-cutter.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestEvictionGuardIndex runs the guard, wired as the chart wires it, with its API server behind a
// proxy that can take its lists and watches away, and checks what its index of pods answers: a
// pod it knows is judged without a read; while its watch is down it stays ready, judges the pods
// it knows from memory, and reads a pod created meanwhile (a pod created a moment ago); once the
// watch is back it knows that pod too. A pod deleted and re-created under its name on another
// node is never evicted through its predecessor's UID, and its own UID is judged by its own node.
func TestEvictionGuardIndex(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, sa, nodeA, nodeB = "evindex", "reprieve-evindex", "evindex-a", "evindex-b"
	c := env.Client
	kubeA := boundAgents(ctx, t, ns, sa, nodeA, nodeB)
	clientA := clientFor(t, kubeA)
	agentB, err := c.CoreV1().Pods(ns).Get(ctx, "agent-"+nodeB, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeB, err := env.BoundServiceAccountKubeconfig(ctx, ns, sa, agentB)
	if err != nil {
		t.Fatal(err)
	}
	clientB := clientFor(t, kubeB)
	cutter := startWatchCutter(t)
	startEvictionGuardVia(ctx, t, sa, ns, func(kc string) string { return cutter.kubeconfig(t, kc) })
	host := guardHost(ctx, t, sa, ns)
	lookups := func(from string) float64 {
		t.Helper()
		return guardMetric(t, host, `reprieve_guard_pod_lookups_total{from="`+from+`"}`)
	}
	get := func(name string) *v1.Pod {
		t.Helper()
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	create := func(node string, names ...string) {
		t.Helper()
		var pods []scenario.Pod
		for _, n := range names {
			pods = append(pods, scenario.Pod{Name: n, Kind: scenario.Plain, Tolerate: ptr64(3600), Grace: ptr64(1)})
		}
		if err := scenario.Create(ctx, c, ns, node, taint, pods); err != nil {
			t.Fatal(err)
		}
	}
	// dryRun is the agent's eviction as the guard sees it, without ending the pod.
	dryRun := func(cl kubernetes.Interface, p *v1.Pod, uid types.UID) error {
		return evict(ctx, cl, ns, p.Name, ptr64(1), &uid, true)
	}
	// inIndex says whether the guard judged p from its index: no GET for it (only this test's
	// agents call this guard). The index holds every test's pods, so its size tells nothing.
	inIndex := func(p *v1.Pod) bool {
		t.Helper()
		api := lookups(guard.FromAPI)
		_ = dryRun(clientA, p, p.UID)
		return lookups(guard.FromAPI) == api
	}
	if guardMetric(t, host, "reprieve_guard_index_synced") != 1 {
		t.Fatal("the guard is ready with its index not synced")
	}

	// Known pods: judged from the index, no read.
	onA, onB := get("victim-"+nodeA), get("victim-"+nodeB)
	waitFor(ctx, t, "the index to hold the victims", func() bool { return inIndex(onA) && inIndex(onB) })
	api0 := lookups(guard.FromAPI)
	if err := dryRun(clientA, onA, onA.UID); err != nil {
		t.Errorf("node A's agent evicting its own node's pod: %v; want it allowed", err)
	}
	if err := dryRun(clientA, onB, onB.UID); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), guardDeniedText) {
		t.Errorf("node A's agent evicting node B's pod: %v; want the guard's 403", err)
	}
	if got := lookups(guard.FromAPI); got != api0 {
		t.Errorf("pods read with a GET: %v, then %v; want the index to answer for pods it holds", api0, got)
	}
	if lookups(guard.FromIndex) < 2 {
		t.Errorf("pods found in the index: %v; want both reviews", lookups(guard.FromIndex))
	}

	// The watch down: the index keeps what it had, the guard stays ready, a new pod is read.
	cutter.cut(true)
	waitFor(ctx, t, "the guard's list or watch to fail", func() bool {
		return guardMetric(t, host, "reprieve_guard_index_list_watch_errors_total") > 0
	})
	resp, err := attacker("127.0.0.1", 1).Get("https://" + host + guard.PathReadyz)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz with the watch down: %d; want 200 (what the index knows stays true)", resp.StatusCode)
	}
	create(nodeA, "fresh-a")
	create(nodeB, "fresh-b")
	freshA, freshB := get("fresh-a"), get("fresh-b")
	index0, api0 := lookups(guard.FromIndex), lookups(guard.FromAPI)
	if err := dryRun(clientA, onA, onA.UID); err != nil {
		t.Errorf("with the watch down, node A's agent evicting a pod the index holds: %v; want it allowed", err)
	}
	if err := dryRun(clientA, freshA, freshA.UID); err != nil {
		t.Errorf("with the watch down, node A's agent evicting a pod created meanwhile on A: %v; want it allowed (read)", err)
	}
	if err := dryRun(clientA, freshB, freshB.UID); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), guardDeniedText) {
		t.Errorf("with the watch down, node A's agent evicting a pod created meanwhile on B: %v; want the guard's 403 (read)", err)
	}
	if got := lookups(guard.FromIndex) - index0; got != 1 {
		t.Errorf("with the watch down, %v pods found in the index; want 1 (the one it held)", got)
	}
	if got := lookups(guard.FromAPI) - api0; got != 2 {
		t.Errorf("with the watch down, %v pods read; want 2 (the two created meanwhile)", got)
	}

	// The watch back: the index catches up and answers for the new pods too.
	cutter.cut(false)
	waitFor(ctx, t, "the index to hold the pods created while its watch was down", func() bool { return inIndex(freshA) && inIndex(freshB) })
	if err := dryRun(clientA, freshA, freshA.UID); err != nil {
		t.Errorf("with the watch back, evicting fresh-a: %v; want it allowed", err)
	}

	// Re-created under its name on another node, with a new UID.
	create(nodeA, "again")
	first := get("again")
	waitFor(ctx, t, "the index to hold the first again", func() bool { return inIndex(first) })
	if err := c.CoreV1().Pods(ns).Delete(ctx, "again", metav1.DeleteOptions{GracePeriodSeconds: ptr64(0)}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the first again gone", func() bool {
		_, err := c.CoreV1().Pods(ns).Get(ctx, "again", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	create(nodeB, "again")
	second := get("again")
	if first.UID == second.UID || second.Spec.NodeName != nodeB {
		t.Fatalf("the re-created pod: UID %s on %s; want a new UID on %s", second.UID, second.Spec.NodeName, nodeB)
	}
	// Node A's agent with the old pod's UID, for real: refused, by the guard (the index no longer
	// holds that UID and the read finds another) or by the API server's precondition (409).
	err = evict(ctx, clientA, ns, "again", ptr64(1), &first.UID, false)
	if err == nil || !(apierrors.IsForbidden(err) || apierrors.IsConflict(err)) {
		t.Errorf("node A's agent evicting the re-created pod with its predecessor's UID: %v; want 403 or 409", err)
	}
	if err := dryRun(clientA, second, second.UID); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), guardDeniedText) {
		t.Errorf("node A's agent evicting the re-created pod with its own UID: %v; want the guard's 403 (it is on B)", err)
	}
	if err := dryRun(clientB, second, second.UID); err != nil {
		t.Errorf("node B's agent evicting the re-created pod on B: %v; want it allowed", err)
	}
	if p := get("again"); p.UID != second.UID || p.DeletionTimestamp != nil {
		t.Errorf("the re-created pod is %s, deleting %v; want %s untouched", p.UID, p.DeletionTimestamp, second.UID)
	}
}

// TestEvictionGuardRBAC checks on the real API server what the guard's ClusterRole grants and to
// whom: its ServiceAccount may get, list and watch every namespace's pods (its index) and do
// nothing else with them; the agent's token gains none of it (a bound token of the agent's,
// with the shipped role): it still cannot read a pod by name, and the list and watch it may make
// come from its own role's rule, which no binding of the guard's grants.
func TestEvictionGuardRBAC(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, sa, nodeA, nodeB = "evrbac", "reprieve-evrbac", "evrbac-a", "evrbac-b"
	c := env.Client
	kubeA := boundAgents(ctx, t, ns, sa, nodeA, nodeB)
	startEvictionGuard(ctx, t, sa, ns)
	guardUser, agentUser := "system:serviceaccount:"+ns+":"+sa+"-guard", "system:serviceaccount:"+ns+":"+sa
	review := func(user string, a authorizationv1.ResourceAttributes) *authorizationv1.SubjectAccessReviewStatus {
		t.Helper()
		r, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}, ResourceAttributes: &a}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return &r.Status
	}
	pods := func(verb, sub string) authorizationv1.ResourceAttributes {
		return authorizationv1.ResourceAttributes{Verb: verb, Resource: "pods", Subresource: sub}
	}
	for _, verb := range []string{"get", "list", "watch"} {
		if s := review(guardUser, pods(verb, "")); !s.Allowed {
			t.Errorf("the guard may not %s pods in every namespace: %s; want it allowed (its index)", verb, s.Reason)
		}
	}
	for _, a := range []authorizationv1.ResourceAttributes{pods("delete", ""), pods("patch", ""), pods("create", "eviction"), pods("patch", "status"),
		pods("deletecollection", ""), {Verb: "list", Resource: "secrets"}, {Verb: "get", Resource: "nodes"}, {Verb: "create", Resource: "pods"}} {
		if s := review(guardUser, a); s.Allowed {
			t.Errorf("the guard may %s %s/%s: %s; want it refused", a.Verb, a.Resource, a.Subresource, s.Reason)
		}
	}
	// The agent's identity: the guard's role adds nothing to it.
	if s := review(agentUser, pods("get", "")); s.Allowed {
		t.Errorf("the agent may get pods by name: %s; want it refused (the guard's role is the guard's alone)", s.Reason)
	}
	for _, verb := range []string{"list", "watch"} {
		s := review(agentUser, pods(verb, ""))
		if strings.Contains(s.Reason, "eviction-guard") {
			t.Errorf("the agent's %s of pods is allowed through the guard's binding: %s", verb, s.Reason)
		}
		t.Logf("the agent's %s of pods (its own role's rule, for its node's pods; RBAC cannot bind a field selector): allowed %v, %s", verb, s.Allowed, s.Reason)
	}
	// And with the tokens themselves.
	guardKube, err := env.ServiceAccountKubeconfig(ctx, ns, sa+"-guard")
	if err != nil {
		t.Fatal(err)
	}
	guardClient := clientFor(t, guardKube)
	if _, err := guardClient.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: guard.IndexSelector, Limit: 1}); err != nil {
		t.Errorf("the guard's token listing the cluster's bound pods: %v; want it allowed", err)
	}
	victim, err := c.CoreV1().Pods(ns).Get(ctx, "victim-"+nodeB, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := guardClient.CoreV1().Pods(ns).Delete(ctx, victim.Name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the guard's token deleting a pod: %v; want 403", err)
	}
	if err := evict(ctx, guardClient, ns, victim.Name, ptr64(1), &victim.UID, true); !apierrors.IsForbidden(err) {
		t.Errorf("the guard's token evicting a pod: %v; want 403", err)
	}
	if _, err := clientFor(t, kubeA).CoreV1().Pods(ns).Get(ctx, victim.Name, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent's token reading a pod by name: %v; want 403", err)
	}
}
