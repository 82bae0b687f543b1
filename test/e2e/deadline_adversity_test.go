package e2e

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/test/fakes/faultproxy"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// Issue 12: the deadline promise under adversity, on the real control plane. Each test logs,
// for every pod, when it was evicted (first seen with a deletionTimestamp) and when it was gone,
// relative to the interruption taint's timeAdded (T).

// waitLong is waitFor with a bound of its own (waitFor's is 30 s, shorter than a window).
func waitLong(ctx context.Context, t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// allGone reports whether every named pod has vanished.
func allGone(obs *scenario.Observer, names ...string) bool {
	recs := obs.Records()
	for _, n := range names {
		if recs[n].GoneAt.IsZero() {
			return false
		}
	}
	return true
}

// figures logs and returns each pod's eviction and end relative to T.
func figures(t *testing.T, obs *scenario.Observer, T time.Time, names ...string) map[string]scenario.Record {
	t.Helper()
	recs := obs.Records()
	sort.Strings(names)
	var b strings.Builder
	rel := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return fmt.Sprintf("T%+.2fs", at.Sub(T).Seconds())
	}
	for _, n := range names {
		r := recs[n]
		fmt.Fprintf(&b, "\n  %-12s evicted %s (grace %ds, last %ds)  gone %s", n, rel(r.DeletedAt), r.Grace, r.LastGrace, rel(r.GoneAt))
	}
	t.Logf("pods relative to the taint's timeAdded T:%s", b.String())
	return recs
}

// goneBy checks that each pod ended by end: the end the server set for it, and that it went.
func goneBy(t *testing.T, recs map[string]scenario.Record, end, T time.Time, names ...string) {
	t.Helper()
	t.Logf("window end (D - margin) T%+.2fs", end.Sub(T).Seconds())
	for _, n := range names {
		r := recs[n]
		if r.GoneAt.IsZero() {
			t.Errorf("pod %s never gone; the window ended at T%+.2fs", n, end.Sub(T).Seconds())
			continue
		}
		// By the end the server set for it (deletionTimestamp, what a kubelet and kwok's
		// pod-delete stage act on): the watch sees it gone only after kwok's delete and the
		// event's way here, which took 0.25 s past a deletionTimestamp at the window's end in
		// a loaded run (issue 52). A pod the watch never saw terminating is judged by when it
		// went.
		if at := cmp.Or(r.DeletionTimestamp, r.GoneAt); at.After(end) {
			t.Errorf("pod %s to be gone at T%+.2fs (deletionTimestamp), gone at T%+.2fs: after the window's end T%+.2fs",
				n, r.DeletionTimestamp.Sub(T).Seconds(), r.GoneAt.Sub(T).Seconds(), end.Sub(T).Seconds())
		}
	}
}

// TestAdversityAlreadyTerminating (item 1): a pod that tolerates the interruption taint
// forever is deleted by someone else with a 600 s grace two seconds after a 40 s notice. It is
// leaving: reprieve shortens its grace so that it is gone before D - margin.
func TestAdversityAlreadyTerminating(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "adv-leaving", "adv-leaving-node"
	taint, obs := observedNode(ctx, t, ns, node, []scenario.Pod{
		{Name: "leaving", Kind: scenario.Plain, Tolerate: ptr64(scenario.Forever), Grace: ptr64(600)},
		{Name: "staying", Kind: scenario.Plain, Tolerate: ptr64(scenario.Forever), Grace: ptr64(600)},
	})
	p, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	deadline := time.Now().Add(40 * time.Second).UTC().Truncate(time.Second)
	setDeadline(ctx, t, node, deadline.Format(time.RFC3339))
	n := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	T := taintOf(n, taint).TimeAdded.Time
	time.Sleep(time.Until(T.Add(2 * time.Second))) // the e2e clock is the wall clock: the user deletes at T+2
	if err := env.Client.CoreV1().Pods(ns).Delete(ctx, "leaving", metav1.DeleteOptions{GracePeriodSeconds: ptr64(600)}); err != nil {
		t.Fatal(err)
	}
	end := deadline.Add(-config.DefaultConfig().SafetyMargin)
	waitLong(ctx, t, time.Until(end)+10*time.Second, "the terminating pod gone", func() bool { return allGone(obs, "leaving") })
	recs := figures(t, obs, T, "leaving", "staying")
	goneBy(t, recs, end, T, "leaving")
	if r := recs["leaving"]; r.LastGrace >= 600 {
		t.Errorf("leaving: grace %d s, never shortened", r.LastGrace)
	}
	if r := recs["staying"]; !r.DeletedAt.IsZero() {
		t.Errorf("staying: a pod that tolerates forever and is not leaving was deleted at T%+.2fs", r.DeletedAt.Sub(T).Seconds())
	}
	pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, "leaving", metav1.GetOptions{})
	if err == nil {
		t.Errorf("leaving still present: %v", pod.DeletionTimestamp)
	}
}

// TestAdversitySIGTERMMidWindow (item 7): SIGTERM at T+3 while pods are still due later in the
// window (tolerating 600 s, so due at their latest start E - grace, which only reprieve acts
// on): they are still evicted on time, and the process then exits 0.
func TestAdversitySIGTERMMidWindow(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "adv-sigterm", "adv-sigterm-node"
	taint, obs := observedNode(ctx, t, ns, node, []scenario.Pod{
		{Name: "grace-5", Kind: scenario.Plain, Tolerate: ptr64(600), Grace: ptr64(5)},
		{Name: "grace-15", Kind: scenario.Plain, Tolerate: ptr64(600), Grace: ptr64(15)},
	})
	p, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	deadline := time.Now().Add(40 * time.Second).UTC().Truncate(time.Second)
	setDeadline(ctx, t, node, deadline.Format(time.RFC3339))
	n := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	T := taintOf(n, taint).TimeAdded.Time
	end := deadline.Add(-config.DefaultConfig().SafetyMargin)
	time.Sleep(time.Until(T.Add(3 * time.Second))) // the signal comes at T+3, wall clock
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	signalled := time.Now()
	code, err := p.Wait(time.Until(end) + 15*time.Second)
	exited := time.Now()
	if err != nil || code != 0 {
		t.Fatalf("after SIGTERM: exit %d, %v\n%s", code, err, p.LogTail(20))
	}
	t.Logf("SIGTERM at T%+.2fs, exit 0 at T%+.2fs (window end T%+.2fs)", signalled.Sub(T).Seconds(), exited.Sub(T).Seconds(), end.Sub(T).Seconds())
	waitLong(ctx, t, 30*time.Second, "the pods gone", func() bool { return allGone(obs, "grace-5", "grace-15") })
	recs := figures(t, obs, T, "grace-5", "grace-15")
	// Each at its latest start (the window set its plan), through the SIGTERM.
	for name, g := range map[string]time.Duration{"grace-5": 5 * time.Second, "grace-15": 15 * time.Second} {
		evictedAt(ctx, t, obs, ns, name, lastStart(end, g), T, true, p)
	}
	goneBy(t, recs, end, T, "grace-5", "grace-15")
	if exited.Before(recs["grace-5"].DeletedAt) {
		t.Errorf("exited at T%+.2fs before the last eviction", exited.Sub(T).Seconds())
	}
}

// TestAdversityRestartDuringMetadataOutage (item 2): the agent is killed (SIGKILL) and the
// metadata service fails a few seconds after the notice; a new agent starts while it is still
// down and the service comes back 10 s later. The taint keeps its original timeAdded, the pod
// tolerating 10 s is evicted at T+10, and every pod is gone by D - margin.
func TestAdversityRestartDuringMetadataOutage(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "adv-outage", "adv-outage-node"
	setupNode(ctx, t, ns, node, nil)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	names := []string{"now", "tol-10", "tol-600"}
	obs := createObserved(ctx, t, ns, node, taint, []scenario.Pod{
		{Name: "now", Kind: scenario.Plain, Grace: ptr64(1)},
		{Name: "tol-10", Kind: scenario.Plain, Tolerate: ptr64(10), Grace: ptr64(1)},
		{Name: "tol-600", Kind: scenario.Plain, Tolerate: ptr64(600), Grace: ptr64(5)},
	})
	deadline := time.Now().Add(45 * time.Second).UTC().Truncate(time.Second)
	mock, backend, err := testenv.StartIMDSMock(ctx, logDir, "--imdsv2", "spot", "--action=terminate", "--time="+deadline.Format(time.RFC3339))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mock.Stop() }()
	proxy, err := faultproxy.New(backend)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	addr, err := faultproxy.ReserveAddr()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proxy.Start(addr); err != nil {
		t.Fatal(err)
	}
	args := []string{"--kubeconfig=" + agentKubeconfig, "--provider=aws", "--aws-imds-endpoint=http://" + addr}
	first, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Stop() }()
	n := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	T := taintOf(n, taint).TimeAdded.Time

	time.Sleep(time.Until(T.Add(3 * time.Second))) // wall clock: the faults come at T+3
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	proxy.Set(faultproxy.ServerError)
	// In the outage the new agent is up, not Ready (it cannot see).
	second, addr2, err := scenario.StartReprieveBlind(ctx, reprieveBin, logDir, node+"-2", append(args, "--node-name="+node)...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = second.Stop() }()
	restarted := time.Now()
	time.Sleep(10 * time.Second) // the outage lasts 10 s after the restart
	proxy.Set(faultproxy.Pass)
	back := time.Now()

	end := deadline.Add(-config.DefaultConfig().SafetyMargin)
	waitLong(ctx, t, time.Until(end)+10*time.Second, "every pod gone", func() bool { return allGone(obs, names...) })
	t.Logf("restart at T%+.2fs during the outage, metadata back at T%+.2fs", restarted.Sub(T).Seconds(), back.Sub(T).Seconds())
	recs := figures(t, obs, T, names...)
	goneBy(t, recs, end, T, names...)
	// The countdown runs from the original timeAdded.
	evictedAt(ctx, t, obs, ns, "tol-10", T.Add(10*time.Second), T, false, first, second)
	n = getNode(ctx, t, node)
	if got := taintOf(n, taint); got.TimeAdded == nil || !got.TimeAdded.Time.Equal(T) {
		t.Errorf("timeAdded after the restart = %v, want the original %v", got.TimeAdded, T)
	}
	wantCounted(t, addr2, "the restarted agent's failed polls", `reprieve_metadata_polls_total{outcome="error",provider="aws"}`)
}

// TestAdversityTwoNotices (item 4): notice, cancel, notice on one node, with a
// PodDisruptionBudget that refuses during the first and allows during the second. The first
// notice's refused attempts and backoff (grown to 10 s) must not make the second skip the
// Eviction API: the pod goes through it, and nothing is force-deleted.
func TestAdversityTwoNotices(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "adv-twice", "adv-twice-node"
	setupNode(ctx, t, ns, node, nil)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	// No disruption controller runs here: the budget's status is what the test writes, and
	// until then (observedGeneration 0) the Eviction API refuses with 429.
	obs := createObserved(ctx, t, ns, node, taint, []scenario.Pod{{Name: "guarded", Kind: scenario.Plain, Grace: ptr64(5), PDB: true}})
	p, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()

	first := time.Now().Add(60 * time.Second).UTC().Truncate(time.Second)
	setDeadline(ctx, t, node, first.Format(time.RFC3339))
	n := waitNode(ctx, t, node, "the first taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	T1 := taintOf(n, taint).TimeAdded.Time
	time.Sleep(time.Until(T1.Add(15 * time.Second))) // wall clock: 15 s of refusals, backoff at 10 s
	setDeadline(ctx, t, node, "")
	waitNode(ctx, t, node, "the taint removed", func(n *v1.Node) bool { return !hasTaint(n, taint.Key, taint.Effect) })
	if r := obs.Records()["guarded"]; !r.DeletedAt.IsZero() {
		t.Fatalf("guarded deleted during the first notice at T1%+.2fs", r.DeletedAt.Sub(T1).Seconds())
	}

	pdb, err := env.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "guarded", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 1, CurrentHealthy: 1, DesiredHealthy: 0, ExpectedPods: 1}
	if _, err := env.Client.PolicyV1().PodDisruptionBudgets(ns).UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("letting the budget allow one disruption: %v", err)
	}
	second := time.Now().Add(12 * time.Second).UTC().Truncate(time.Second)
	setDeadline(ctx, t, node, second.Format(time.RFC3339))
	n = waitNode(ctx, t, node, "the second taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	taintSeen := time.Now()
	T2 := taintOf(n, taint).TimeAdded.Time
	end := second.Add(-config.DefaultConfig().SafetyMargin)
	waitLong(ctx, t, time.Until(end)+10*time.Second, "guarded gone", func() bool { return allGone(obs, "guarded") })
	recs := figures(t, obs, T2, "guarded")
	goneBy(t, recs, end, T2, "guarded")
	text, err := scenario.Scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first notice at T1, withdrawn at T1+15s; second taint T2 = T1%+.2fs", T2.Sub(T1).Seconds())
	// At once, by the server's receipt (timing_test.go), not by when the pod was seen deleted:
	// the first notice's backoff (10 s) would hold the eviction seconds past the agent's taint.
	// A loaded run's eviction, received 9 ms after the agent's taint write (0.78 s after the
	// taint's timeAdded, in whole seconds), took the server 1.3 s and was answered with its
	// timeout (504) while it took effect: the watch saw the pod deleted at T2+2.14 s (issue 52).
	tm := auditTiming(ctx, t, env, ns, agentUser, []string{p.LogPath()}, "guarded")
	sent := tm.checkSent(t, "guarded", T2, T2, tm.nodeWritten(node, taintSeen), false)
	// Through the Eviction API, and nothing forced. The agent counts an eviction the server
	// answered with its timeout as failed, though it took effect: the audit log tells.
	if what(sent) != "eviction" || !strings.Contains(text, `reprieve_evictions_requests_total{result="forced_delete"} 0`) ||
		!sent.TimedOut() && !strings.Contains(text, `reprieve_evictions_requests_total{result="evicted"} 1`) {
		t.Errorf("the second notice did not go through the Eviction API: the server took a %s (answered %d); %s",
			what(sent), sent.ResponseStatus.Code, grep(text, "reprieve_evictions_requests_total"))
	}
}

// failingEvictions is an HTTPS proxy in front of the API server that holds every eviction for
// delay and then answers 500, and forwards everything else. It returns a kubeconfig that sends
// the agent's identity (from agentKubeconfig) through it.
func failingEvictions(t *testing.T, delay time.Duration) (kubeconfig string, evictions *atomic.Int32) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(agentKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(env.Host)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(env.CAData)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	rp.FlushInterval = -1 // watches stream
	evictions = &atomic.Int32{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/eviction") {
			evictions.Add(1)
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"etcd timeout (test proxy)","reason":"InternalError","code":500}`)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	for _, c := range cfg.Clusters {
		c.Server = srv.URL
		c.CertificateAuthorityData = nil
		c.InsecureSkipTLSVerify = true
	}
	kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	return kubeconfig, evictions
}

// TestAdversitySlowFailingEvictions (item 3): every eviction hangs 4 s and fails with 500. The
// DELETE that follows must compute its grace when it leaves: a pod with a 33 s grace that
// tolerates 600 s, so that its first eviction leaves at its forced-delete point (latest less
// the lead) in a 40 s window, still ends by D - margin. Before the DELETE, the pod gets
// DisruptionTarget=True (item 8) with the shipped role.
func TestAdversitySlowFailingEvictions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "adv-slow", "adv-slow-node"
	taint, obs := observedNode(ctx, t, ns, node, []scenario.Pod{{Name: "grace-33", Kind: scenario.Plain, Tolerate: ptr64(600), Grace: ptr64(33)}})
	kubeconfig, evictions := failingEvictions(t, 4*time.Second)
	p, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+kubeconfig, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	deadline := time.Now().Add(40 * time.Second).UTC().Truncate(time.Second)
	setDeadline(ctx, t, node, deadline.Format(time.RFC3339))
	n := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	T := taintOf(n, taint).TimeAdded.Time
	var cond *v1.PodCondition
	waitLong(ctx, t, 30*time.Second, "grace-33 deleted", func() bool {
		pod, err := env.Client.CoreV1().Pods(ns).Get(ctx, "grace-33", metav1.GetOptions{})
		if err != nil || pod.DeletionTimestamp == nil {
			return false
		}
		for i := range pod.Status.Conditions {
			if pod.Status.Conditions[i].Type == v1.DisruptionTarget {
				cond = &pod.Status.Conditions[i]
			}
		}
		return true
	})
	if cond == nil || cond.Status != v1.ConditionTrue {
		t.Errorf("the deleted pod has no DisruptionTarget=True condition: %+v\n%s", cond, p.LogTail(20))
	}
	end := deadline.Add(-config.DefaultConfig().SafetyMargin)
	waitLong(ctx, t, time.Until(end)+10*time.Second, "grace-33 gone", func() bool { return allGone(obs, "grace-33") })
	recs := figures(t, obs, T, "grace-33")
	t.Logf("%d eviction requests, each held 4 s and answered 500", evictions.Load())
	if evictions.Load() == 0 {
		t.Error("no eviction went through the failing proxy")
	}
	goneBy(t, recs, end, T, "grace-33")
	// The first DELETE on its own must end the pod in time: a grace computed before the
	// eviction hung would end it 4 s late (a later shortening only hides that).
	if r := recs["grace-33"]; r.DeletedAt.Add(time.Duration(r.Grace) * time.Second).After(end) {
		t.Errorf("the forced delete at T%+.2fs asked for %d s: it ends at T%+.2fs, past the window's end", r.DeletedAt.Sub(T).Seconds(), r.Grace,
			r.DeletedAt.Add(time.Duration(r.Grace)*time.Second).Sub(T).Seconds())
	}
}

// TestAdversityStatusPatchIsNodeBound (item 8): the DisruptionTarget patch needs patch on
// pods/status; the shipped admission policy binds it to the token's node like the deletes: an
// agent may mark a pod on its own node, not one on another node.
func TestAdversityStatusPatchIsNodeBound(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, sa, nodeA, nodeB = "adv-vap", "reprieve-adv-vap", "adv-vap-a", "adv-vap-b"
	c := env.Client
	kubeA := boundAgents(ctx, t, ns, sa, nodeA, nodeB)
	clientA := clientFor(t, kubeA)
	mark := func(pod string) error {
		b, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []v1.PodCondition{{
			Type: v1.DisruptionTarget, Status: v1.ConditionTrue, Reason: "DeletionByReprieve", Message: "test", LastTransitionTime: metav1.Now()}}}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = clientA.CoreV1().Pods(ns).Patch(ctx, pod, types.StrategicMergePatchType, b, metav1.PatchOptions{}, "status")
		return err
	}
	// The policy takes a moment to be in force.
	waitFor(ctx, t, "the policy in force", func() bool {
		err := mark("victim-" + nodeB)
		return err != nil && strings.Contains(err.Error(), "only pods on the node its token is bound to")
	})
	if err := mark("victim-" + nodeB); err == nil || !apierrors.IsForbidden(err) {
		t.Errorf("node A's agent marking a pod on node B: %v, want it refused", err)
	}
	if err := mark("victim-" + nodeA); err != nil {
		t.Errorf("node A's agent marking a pod on node A: %v, want it allowed (RBAC pods/status patch and the policy)", err)
	}
	p, err := c.CoreV1().Pods(ns).Get(ctx, "victim-"+nodeA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, cond := range p.Status.Conditions {
		found = found || (cond.Type == v1.DisruptionTarget && cond.Status == v1.ConditionTrue)
	}
	if !found {
		t.Errorf("victim-%s has no DisruptionTarget=True after the allowed patch: %+v", nodeA, p.Status.Conditions)
	}
}
