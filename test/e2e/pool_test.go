package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// TestPoolReclaimedAtOnce (issue 24, the small version of `make bench`'s pool scenario): four
// nodes of a pool get their notice at the same instant, and their four agents evict through a
// kube-apiserver with API Priority and Fairness on and 6 seats (4 + 2 in flight), so that the
// agents' priority level (workload-high: the agents' ServiceAccount is in kube-system) has about
// one seat. The window leaves slack (the longest grace is 12 s of a 30 s window), so that the
// test checks the order of the requests, not the machine's speed: no pod ends after D - margin,
// and on every node the most urgent pods (the longest grace, so the nearest last safe moment)
// were evicted before the least urgent (class against class).
//
// It measures timing against a shared API server's seats: not parallel. It starts its own API
// server on the environment's etcd (APF must be on, and the shared one runs without it).
func TestPoolReclaimedAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	begin := time.Now()
	apf, err := env.StartAPIServer(ctx, "pool", &testenv.APF{MaxRequestsInflight: 4, MaxMutatingRequestsInflight: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = apf.Process().Stop() })
	kubeconfig := repoint(t, agentKubeconfig, apf.Host)

	const (
		nodes   = 4
		perNode = 24
		win     = 35 * time.Second
		margin  = 5 * time.Second
	)
	// Four classes of urgency, the same on every node: the longest grace has the nearest last
	// safe moment (D - margin - grace). The order needs only distinct last safe moments; every
	// pod is due at the notice, and the test waits until the last is gone, a longest grace after
	// it (18 s before issue 52).
	graces := []int64{12, 8, 4, 2}
	ns := "pool"
	interruption, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	names := make([]string, nodes)
	var wg sync.WaitGroup
	errs := make([]error, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("pool-n%d", i)
	}
	setupNode(ctx, t, ns, names[0], nil)
	for i := 1; i < nodes; i++ {
		if _, err := env.CreateNode(ctx, names[i], nil); err != nil {
			t.Fatal(err)
		}
	}
	grace := map[string]int64{}
	for i, node := range names {
		pods := make([]scenario.Pod, perNode)
		for j := range pods {
			g := graces[j%len(graces)]
			pods[j] = scenario.Pod{Name: fmt.Sprintf("n%d-g%02d-%02d", i, g, j), Kind: scenario.Plain, Grace: ptr64(g)}
			grace[pods[j].Name] = g
		}
		// Not scenario.Instant: the agents' first requests wait for the new API server until
		// about 21 s after its start whenever they come, and kwok's spread keeps the first
		// agent's start out of that wait (started earlier, its first read timed out).
		wg.Go(func() { errs[i] = scenario.Create(ctx, env.Client, ns, node, interruption, pods) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	obs, err := scenario.Observe(ctx, env.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(obs.Stop)
	// The agents stop together: an agent asked to stop during an interruption carries out its
	// plan until the window's end (or its 5 s stop grace), and one after the other they took up
	// to 5 s each once the test was done (issue 52).
	var agents []*testenv.Process
	t.Cleanup(func() {
		var stops sync.WaitGroup
		for _, p := range agents {
			stops.Go(func() { _ = p.Stop() })
		}
		stops.Wait()
	})
	addrs := make([]string, nodes)
	for i, node := range names {
		p, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+kubeconfig, "--provider=none",
			"--safety-margin="+margin.String())
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, p)
		addrs[i] = addr
	}

	// The notice on every node at the same instant (--provider none reads the annotation).
	deadline := time.Now().Add(win).Truncate(time.Second)
	end := deadline.Add(-margin)
	for _, node := range names {
		setDeadline(ctx, t, node, deadline.UTC().Format(time.RFC3339))
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Until(end.Add(3*time.Second)), true, func(context.Context) (bool, error) {
		recs := obs.Records()
		for name := range grace {
			if recs[name].GoneAt.IsZero() {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Logf("waiting for every pod to go: %v", err)
	}
	recs := obs.Records()

	var late []string
	for name := range grace {
		r := recs[name]
		if r.GoneAt.IsZero() || r.GoneAt.After(end) || r.DeletionTimestamp.After(end) {
			late = append(late, fmt.Sprintf("%s (grace %d s): deletionTimestamp %s, gone %s", name, grace[name],
				r.DeletionTimestamp.Sub(end), r.GoneAt.Sub(end)))
		}
	}
	slices.Sort(late)
	if len(late) > 0 {
		t.Errorf("%d of %d pods missed D - margin (times relative to it):\n%s", len(late), len(grace), strings.Join(late, "\n"))
	}
	// The order, node by node: the most urgent class (the longest grace) was evicted before the
	// least urgent, class against class (the median of each). Not pod against pod: the first
	// requests of a notice are granted as the executor's workers reach the gate, before it holds
	// every waiter to order (CI saw the last pod of the longest grace, then 18 s, 0.1-0.3 s after
	// the first 2 s one, with no request throttled); the executor before the gate sent the 2 s
	// pods first, by 0.6-1.2 s.
	median := func(ts []time.Time) time.Time {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		return ts[len(ts)/2]
	}
	for i := range names {
		var urgent, lax []time.Time
		for name, g := range grace {
			if !strings.HasPrefix(name, fmt.Sprintf("n%d-", i)) || recs[name].DeletedAt.IsZero() {
				continue
			}
			switch g {
			case graces[0]:
				urgent = append(urgent, recs[name].DeletedAt)
			case graces[len(graces)-1]:
				lax = append(lax, recs[name].DeletedAt)
			}
		}
		if len(urgent) == 0 || len(lax) == 0 {
			t.Errorf("node %s: %d %d s pods and %d %d s pods seen evicted", names[i], len(urgent), graces[0], len(lax), graces[len(graces)-1])
			continue
		}
		if mu, ml := median(urgent), median(lax); !mu.Before(ml) {
			t.Errorf("node %s: the %d s pods' median eviction came %s after the %d s pods': the least urgent went first",
				names[i], graces[0], mu.Sub(ml), graces[len(graces)-1])
		}
	}

	// What it cost: the agents' requests by result, and APF's view.
	// (grace_shortened counts an accepted eviction a second time: not a request.)
	var sent, failed float64
	for _, a := range addrs {
		if m, err := scenario.Scrape(a); err == nil {
			sent += sumMetric(m, "reprieve_evictions_requests_total") - sumMetric(m, `reprieve_evictions_requests_total{result="grace_shortened"}`)
			failed += sumMetric(m, `reprieve_evictions_requests_total{result="failed"}`)
		}
	}
	var rejected, waited float64
	if m, err := apf.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx); err == nil {
		rejected = sumMetric(string(m), "apiserver_flowcontrol_rejected_requests_total")
		waited = sumMetric(string(m), "apiserver_flowcontrol_request_wait_duration_seconds_sum")
	}
	checkFlowSchema(ctx, t, apf, kubeconfig)
	t.Logf("%d pods on %d nodes at 6 seats: %.0f eviction and delete requests (%.2f per pod), %.0f throttled or cut at their queue bound; "+
		"APF rejected %.0f requests (all clients) and held them %.1f s in its queues in all; the test took %s",
		len(grace), nodes, sent, sent/float64(len(grace)), failed, rejected, waited, time.Since(begin).Round(time.Second))
}

// checkFlowSchema creates the chart's PriorityLevelConfiguration and FlowSchema
// (flowControl.enabled) on the APF server and checks, from the headers APF adds to every
// answer, that the agent's evictions run on that level and its other requests do not.
func checkFlowSchema(ctx context.Context, t *testing.T, apf *testenv.APIServer, agentKubeconfig string) {
	t.Helper()
	var level string
	for _, obj := range manifestObjects(t, "flowControl", render(t, "reprieve", "--set", "flowControl.enabled=true",
		"--show-only", "templates/flowcontrol.yaml")) {
		res := schema.GroupVersionResource{Group: "flowcontrol.apiserver.k8s.io", Version: "v1", Resource: "flowschemas"}
		if obj.GetKind() == "PriorityLevelConfiguration" {
			res.Resource = "prioritylevelconfigurations"
		}
		dyn, err := dynamic.NewForConfig(apf.Config)
		if err != nil {
			t.Fatal(err)
		}
		created, err := dyn.Resource(res).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating the chart's %s: %v", obj.GetKind(), err)
		}
		t.Cleanup(func() {
			_ = dyn.Resource(res).Delete(context.WithoutCancel(ctx), created.GetName(), metav1.DeleteOptions{})
		})
		if obj.GetKind() == "PriorityLevelConfiguration" {
			level = string(created.GetUID())
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", agentKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// APF answers with the UID of the priority level it ran the request on
	// (X-Kubernetes-PF-PriorityLevel-UID, set by the filter in
	// k8s.io/apiserver/pkg/server/filters/priority-and-fairness.go).
	levelOf := func(method, path, body string) string {
		req, err := http.NewRequestWithContext(ctx, method, cfg.Host+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID")
	}
	eviction := `{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"none","namespace":"pool"}}`
	// The FlowSchema takes effect once APF's configuration controller has read it.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return levelOf(http.MethodPost, "/api/v1/namespaces/pool/pods/none/eviction", eviction) == level, nil
	}); err != nil {
		t.Fatalf("the agent's eviction does not run on the chart's priority level %s: %v", level, err)
	}
	if got := levelOf(http.MethodGet, "/api/v1/namespaces/pool/pods?limit=1", ""); got == level || got == "" {
		t.Errorf("the agent's list of pods ran on level %q, want another (workload-high): only evictions, deletes and node patches move", got)
	}
}

// repoint writes a copy of kubeconfig whose clusters point at host (another API server of the
// same control plane: the same CA and credentials).
func repoint(t *testing.T, kubeconfig, host string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = host
	}
	out := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatal(err)
	}
	return out
}
