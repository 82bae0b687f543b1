package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/record"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestRestartMidInterruption kills the agent (SIGKILL) once the pods due at the taint are
// evicted and starts a new one: the remaining pods leave on their original plan (counted from
// the taint's timeAdded, not from the restart), nothing is evicted twice, and a SIGTERM then
// stops the agent cleanly with the node's state intact.
func TestRestartMidInterruption(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "restart", "restart-node"
	setupNode(ctx, t, ns, node, nil)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	var pods []scenario.Pod
	for i := range 3 {
		pods = append(pods, scenario.Pod{Name: fmt.Sprintf("now-%d", i), Kind: scenario.Plain, Grace: ptr64(1)})
	}
	later := map[string]time.Duration{"later-15": 15 * time.Second, "later-20": 20 * time.Second, "later-25": 25 * time.Second}
	for name, d := range later {
		pods = append(pods, scenario.Pod{Name: name, Kind: scenario.Plain, Tolerate: ptr64(int64(d / time.Second)), Grace: ptr64(1)})
	}
	obs := createObserved(ctx, t, ns, node, taint, pods)
	args := []string{"--kubeconfig=" + agentKubeconfig, "--provider=none"}
	first, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Stop() }()
	deadline := time.Now().Add(60 * time.Second).UTC().Truncate(time.Second)
	setDeadline(ctx, t, node, deadline.Format(time.RFC3339))
	n := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	timeAdded := taintOf(n, taint).TimeAdded.Time

	waitFor(ctx, t, "the pods due at once evicted", func() bool {
		recs := obs.Records()
		for i := range 3 {
			if recs[fmt.Sprintf("now-%d", i)].DeletedAt.IsZero() {
				return false
			}
		}
		return true
	})
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	restartedAt := time.Now()
	second, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node+"-2", append(args, "--node-name="+node)...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = second.Stop() }()

	waitFor(ctx, t, "the tolerating pods evicted", func() bool {
		recs := obs.Records()
		for name := range later {
			if recs[name].DeletedAt.IsZero() {
				return false
			}
		}
		return true
	})
	// The countdown runs from timeAdded, not from the restart.
	t.Logf("restarted at T%+.2fs", restartedAt.Sub(timeAdded).Seconds())
	for name, d := range later {
		evictedAt(ctx, t, obs, ns, name, timeAdded.Add(d), timeAdded, false, first, second)
	}
	if got := taintOf(getNode(ctx, t, node), taint).TimeAdded.Time; !got.Equal(timeAdded) {
		t.Errorf("timeAdded changed across the restart: %v, was %v", got, timeAdded)
	}
	// The new agent evicted exactly the three pods left (the others were already terminating
	// or gone, and a terminating pod is never evicted again).
	text, err := scenario.Scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, `reprieve_evictions_requests_total{result="evicted"} 3`) {
		t.Errorf("the restarted agent's evictions: %s", grep(text, "reprieve_evictions_requests_total"))
	}

	// SIGTERM in the middle of the window: the agent finishes the window (issue 12 item 7),
	// then stops cleanly; the node keeps the taint, the deadline and a readable ownership
	// record, so the next agent takes over.
	stopped := time.Now()
	if err := second.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// It stops within 5 s of the window's end, or of the SIGTERM when the window has ended
	// already: beside a cold build the checks above once took the test 12 s past the window's
	// end, and a bound of the window's end alone was negative (issue 52).
	if code, err := second.Wait(max(time.Until(deadline.Add(-margin)), 0) + 5*time.Second); err != nil || code != 0 {
		t.Fatalf("SIGTERM: exit %d, %v", code, err)
	}
	t.Logf("stopped %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	n = getNode(ctx, t, node)
	if !hasTaint(n, taint.Key, taint.Effect) || n.Annotations[record.AnnotationReclaimDeadline] == "" || !strings.Contains(n.Annotations[record.AnnotationOwned], `"cloud:NoExecute"`) {
		t.Errorf("node state after SIGTERM: taints %+v annotations %v", n.Spec.Taints, n.Annotations)
	}
}

// TestConcurrentWriters: while reprieve taints and untaints its node, another client keeps
// rewriting the node's taints, labels and annotations with read-modify-write updates, as the
// node lifecycle controller and other agents do. No write of either side may drop the other's
// taint, and reprieve's own taint must be present exactly once.
func TestConcurrentWriters(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const node = "writers-node"
	if _, err := env.CreateNode(ctx, node, nil); err != nil {
		t.Fatal(err)
	}
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	// The other writer: every few milliseconds, replace its own taint with a new value and
	// bump a label and an annotation, through Update with the resourceVersion it read. It stops
	// between writes, never by cancelling one in flight: a write cancelled after the API server
	// applied it would be on the node but not counted as the last one that succeeded.
	stop := make(chan struct{})
	stopWriter := func() { close(stop) }
	var wg sync.WaitGroup
	var writes atomic.Int64
	var conflicts, lastOK int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-ctx.Done(): // the test failed or timed out
				return
			default:
			}
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				n, err := env.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
				if err != nil {
					return err
				}
				var taints []v1.Taint
				for _, t := range n.Spec.Taints {
					if t.Key != "writer.example.com/gen" {
						taints = append(taints, t)
					}
				}
				n.Spec.Taints = append(taints, v1.Taint{Key: "writer.example.com/gen", Value: fmt.Sprint(i), Effect: v1.TaintEffectNoSchedule})
				n.Labels["writer.example.com/gen"] = fmt.Sprint(i)
				if n.Annotations == nil {
					n.Annotations = map[string]string{}
				}
				n.Annotations["writer.example.com/gen"] = fmt.Sprint(i)
				_, err = env.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
				if apierrors.IsConflict(err) {
					conflicts++
				}
				return err
			})
			if err == nil {
				writes.Add(1)
				lastOK = i
			}
		}
	}()

	// Reprieve's side: set and withdraw the deadline during the writes, three times and then
	// until the other writer has made minWrites: each round takes reprieve a poll or two,
	// whatever the machine's load, while the other writer's pace is the API server's and this
	// process's share of two cores (9 writes in three rounds once, beside 30 other tests).
	const minWrites, maxRounds = 10, 20
	for round := 0; round < 3 || writes.Load() < minWrites && round < maxRounds; round++ {
		deadline := time.Now().Add(5 * time.Minute).UTC().Truncate(time.Second).Format(time.RFC3339)
		setDeadline(ctx, t, node, deadline)
		waitNode(ctx, t, node, fmt.Sprintf("the taint (round %d)", round), func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
		setDeadline(ctx, t, node, "")
		waitNode(ctx, t, node, fmt.Sprintf("the undo (round %d)", round), func(n *v1.Node) bool { return !hasTaint(n, taint.Key, taint.Effect) })
	}
	deadline := time.Now().Add(5 * time.Minute).UTC().Truncate(time.Second).Format(time.RFC3339)
	setDeadline(ctx, t, node, deadline)
	waitNode(ctx, t, node, "the final taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	stopWriter()
	wg.Wait()
	t.Logf("the other writer made %d writes (%d conflicts) while reprieve wrote", writes.Load(), conflicts)
	if writes.Load() < minWrites {
		t.Fatalf("only %d concurrent writes in %d rounds: the test did not contend", writes.Load(), maxRounds)
	}

	n := getNode(ctx, t, node)
	count, writer := 0, 0
	for _, tt := range n.Spec.Taints {
		switch tt.Key {
		case taint.Key:
			count++
		case "writer.example.com/gen":
			writer++
		}
	}
	if count != 1 {
		t.Errorf("reprieve's taint present %d times, want exactly once: %+v", count, n.Spec.Taints)
	}
	// Nothing of the other writer was dropped or rolled back by a reprieve write: its last
	// successful write is what the node holds.
	last := fmt.Sprint(lastOK)
	if writer != 1 || taintOf(n, v1.Taint{Key: "writer.example.com/gen", Effect: v1.TaintEffectNoSchedule}).Value != last ||
		n.Labels["writer.example.com/gen"] != last || n.Annotations["writer.example.com/gen"] != last {
		t.Errorf("the other writer's last write (%s) is not what the node holds: taints %+v, label %q, annotation %q",
			last, n.Spec.Taints, n.Labels["writer.example.com/gen"], n.Annotations["writer.example.com/gen"])
	}
}

func getNode(ctx context.Context, t *testing.T, name string) *v1.Node {
	t.Helper()
	n, err := env.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func taintOf(n *v1.Node, want v1.Taint) v1.Taint {
	for _, t := range n.Spec.Taints {
		if t.Key == want.Key && t.Effect == want.Effect {
			return t
		}
	}
	return v1.Taint{TimeAdded: &metav1.Time{}}
}

// TestAPIServerOutage stops kube-apiserver (etcd stays up) before the spot notice and brings it
// back 20 s later. reprieve keeps polling the cloud and does not exit; when the server answers it
// applies the taint with the timeAdded of the notice (no countdown restarts), evicts what is
// due at once, shortens the grace of a pod whose latest start passed during the outage so that
// it still ends before the window's end, evicts the rest on plan, and logs what was late.
//
// The server that goes down is the agent's own: a second kube-apiserver on the shared etcd,
// with the same certificates and credentials, which the test stops and starts again on the
// same address. The agent sees what it would see of a restarted control plane (connections
// refused, then a server whose watch cache starts anew); kwok and the other tests keep the
// first server, so this test runs beside them.
func TestAPIServerOutage(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const ns, node = "outage", "outage-node"
	setupNode(ctx, t, ns, node, nil)
	server, err := env.StartPeerAPIServer(ctx, "kube-apiserver-outage")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = server.Stop() }()
	kubeconfig := repoint(t, agentKubeconfig, server.Host)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	pods := []scenario.Pod{
		{Name: "due-at-once", Kind: scenario.Plain, Grace: ptr64(2)},
		{Name: "latest-passed", Kind: scenario.Plain, Tolerate: ptr64(10), Grace: ptr64(25)},
		{Name: "after-outage", Kind: scenario.Plain, Tolerate: ptr64(30), Grace: ptr64(2)},
	}
	obs := createObserved(ctx, t, ns, node, taint, pods)

	const noticeDelay, window, outage = 8 * time.Second, 40 * time.Second, 20 * time.Second
	cloud, err := scenario.AWS{}.Start(ctx, node, logDir, noticeDelay, window)
	if err != nil {
		t.Fatal(err)
	}
	defer cloud.Stop()
	rp, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, append([]string{
		"--kubeconfig=" + kubeconfig, "--safety-margin=5s"}, cloud.Args...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	if err := server.Stop(); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	// The notice arrives while the server is down; the agent must keep polling and stay up.
	waitFor(ctx, t, "the notice in the agent's metrics", func() bool {
		text, err := scenario.Scrape(addr)
		return err == nil && strings.Contains(text, `reprieve_notices_received_total{kind="spot-interruption",provider="aws"} 1`)
	})
	noticeSeen := time.Now()
	select {
	case <-time.After(time.Until(down.Add(outage))):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if rp.Exited() {
		t.Fatalf("reprieve exited during the outage: %s\n%s", rp.ExitDescription(), rp.LogTail(30))
	}
	if err := server.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	up := time.Now()

	n := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	timeAdded := taintOf(n, taint).TimeAdded.Time
	if d := noticeSeen.Sub(timeAdded); d < -time.Second || d > 3*time.Second {
		t.Errorf("timeAdded %v, notice seen at %v: the taint must carry the time of the notice, not of the write", timeAdded, noticeSeen)
	}
	deadline, err := time.Parse(time.RFC3339, n.Annotations[record.AnnotationReclaimDeadline])
	if err != nil {
		t.Fatal(err)
	}
	end := deadline.Add(-5 * time.Second)
	waitFor(ctx, t, "every pod evicted", func() bool {
		recs := obs.Records()
		for _, p := range pods {
			if recs[p.Name].DeletedAt.IsZero() {
				return false
			}
		}
		return true
	})
	// When the agent's own server received each request (its audit log: timing_test.go).
	tm := auditTiming(ctx, t, server, ns, agentUser, []string{rp.LogPath()}, "due-at-once", "latest-passed", "after-outage")
	// Planned from timeAdded, and sent then, or once the server first answers the agent after
	// its restart, if that came later: a loaded run's server answered the agent from 0.3 s past
	// the plan (403s while its authorizer loaded, 4 s before its readiness; issue 52).
	back, ok := tm.firstAnswer(agentUser, down, "after-outage")
	if !ok {
		t.Fatal("the restarted API server's audit log has no request of the agent")
	}
	// The server is of use once it takes the agent's writes: its first accepted answer to the
	// agent, or its readiness (up), whichever came first; not its first answer, which may be a
	// 403 while its authorizer loads.
	usable := up
	if a, ok := tm.firstAccepted(agentUser, down); ok && a.Before(usable) {
		usable = a
	}
	if least := end.Add(-plan.MinGrace - plan.KubeletReaction - plan.RequestAllowance); usable.After(least) {
		// The test bed's restart, not the agent: under a build beside make test the peer
		// server took 39 s to come back from a 20 s outage, after the window's end; in
		// another run it answered the agent 403 from T+33.7 s, held what it then received
		// for 5 s, and first took a write at T+39 s.
		t.Skipf("the restarted API server first took the agent's writes at T%+.1fs (ready at T%+.1fs, first answer at T%+.1fs), after T%+.1fs, when the least grace could still end by the window's end (T%+.1fs): nothing is left to test",
			usable.Sub(timeAdded).Seconds(), up.Sub(timeAdded).Seconds(), back.Sub(timeAdded).Seconds(), least.Sub(timeAdded).Seconds(), end.Sub(timeAdded).Seconds())
	}
	if a, _ := tm.first("due-at-once"); a.Received.After(up.Add(3 * time.Second)) {
		t.Errorf("due-at-once: its eviction reached the API server %v after the server came back, want within 3s", a.Received.Sub(up))
	}
	// Its latest start (window end - 25 s) passed during the outage: evicted on the server's
	// return with the grace that is left, computed when the request leaves, and received by
	// the server in time for it to end by the window's end.
	recs := obs.Records()
	if r := recs["latest-passed"]; r.Grace >= 25 {
		t.Errorf("latest-passed: deleted at T%+.2fs with grace %ds; want a shortened grace ending by the window's end T%+.0fs",
			r.DeletedAt.Sub(timeAdded).Seconds(), r.Grace, end.Sub(timeAdded).Seconds())
	}
	tm.checkInTime(t, "latest-passed", recs["latest-passed"].DeletionTimestamp, end)
	tm.checkSent(t, "after-outage", timeAdded.Add(30*time.Second), time.Time{}, back, false)
	// The log says what was late, and the summary and the missed-deadline metric agree.
	summary := waitHandled(ctx, t, node, end)
	if log := rp.LogTail(400); !strings.Contains(log, "Eviction is late") {
		t.Errorf("no 'Eviction is late' log line for the evictions the outage delayed")
	}
	var present int
	if _, err := fmt.Sscanf(summary.Message[strings.LastIndex(summary.Message, "), ")+3:], "%d still present", &present); err != nil {
		t.Fatalf("summary %q: %v", summary.Message, err)
	}
	text, err := scenario.Scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	// The summary agrees with what the watch saw, whatever the cache held after the outage: a
	// pod gone more than a second before the window's end is not counted, one still there a
	// second after it is. (When the pods go is kwok's doing, like a kubelet's, not reprieve's.)
	recs = obs.Records()
	surelyPresent, surelyGone := 0, 0
	for _, p := range pods {
		switch g := recs[p.Name].GoneAt; {
		case g.IsZero() || g.After(end.Add(time.Second)):
			surelyPresent++
		case g.Before(end.Add(-time.Second)):
			surelyGone++
		}
	}
	if present < surelyPresent || present > len(pods)-surelyGone {
		t.Errorf("summary %q counts %d pods still present; the watch saw %d surely present and %d surely gone at the window's end", summary.Message, present, surelyPresent, surelyGone)
	}
	if want := fmt.Sprintf("reprieve_evictions_missed_deadline_total %d", present); !strings.Contains(text, want) {
		t.Errorf("summary says %d still present; metrics: %s", present, grep(text, "reprieve_evictions_missed_deadline_total"))
	}
	t.Logf("summary: %s", summary.Message)
	t.Logf("outage %v; notice seen %v after the outage began; server back at T%+.1fs; window end T%+.1fs",
		up.Sub(down).Round(time.Millisecond), noticeSeen.Sub(down).Round(time.Millisecond), up.Sub(timeAdded).Seconds(), end.Sub(timeAdded).Seconds())
}

// TestStuckDeletedAndReplacedPods: a pod that a finalizer keeps terminating is evicted once and
// reported as missed at the window's end (event and metric); a pod deleted by someone else
// mid-plan is skipped; a pod replaced under the same name is re-planned from its own
// tolerations; and none of them holds up the others.
func TestStuckDeletedAndReplacedPods(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "stuck", "stuck-node"
	c := env.Client
	setupNode(ctx, t, ns, node, nil)
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	if err := scenario.Create(ctx, c, ns, node, taint, []scenario.Pod{
		{Name: "finalizer", Kind: scenario.Plain, Grace: ptr64(1)},
		{Name: "deleted-by-other", Kind: scenario.Plain, Tolerate: ptr64(15), Grace: ptr64(1)},
		{Name: "replaced", Kind: scenario.Plain, Tolerate: ptr64(10), Grace: ptr64(1)},
		{Name: "on-time", Kind: scenario.Plain, Tolerate: ptr64(8), Grace: ptr64(1)},
	}); err != nil {
		t.Fatal(err)
	}
	// A finalizer that nobody removes: kwok, like a kubelet, cannot finish the pod.
	hold := map[string]any{"metadata": map[string]any{"finalizers": []string{"example.com/hold"}}}
	patchPod(ctx, t, ns, "finalizer", hold)
	defer patchPod(context.Background(), t, ns, "finalizer", map[string]any{"metadata": map[string]any{"finalizers": nil}})

	obs, err := scenario.Observe(ctx, c, ns)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Stop()
	rp, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig, "--provider=none")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()
	// 40 s: the new replaced pod's plan (T+20) must stay clear of its force point (its last
	// safe moment less the request's lead and the queueing margin the agent measured), or the
	// deadline rightly sends it first. With 30 s its last safe moment was T+22 and, beside a
	// cold build, the agent measured a 1.75 s margin: it sent at the force point, T+19.76, and
	// the test read that as early (issue 52).
	deadline := time.Now().Add(40 * time.Second).UTC().Truncate(time.Second)
	setDeadline(ctx, t, node, deadline.Format(time.RFC3339))
	n := waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
	timeAdded := taintOf(n, taint).TimeAdded.Time

	// Someone else deletes one pod, and replaces another under the same name with a longer
	// toleration, before their planned times.
	if err := c.CoreV1().Pods(ns).Delete(ctx, "deleted-by-other", metav1.DeleteOptions{GracePeriodSeconds: ptr64(0)}); err != nil {
		t.Fatal(err)
	}
	// The old pod goes through a finalizer of the test's, which kwok's pod-delete stage leaves
	// alone (testenv.PodDeleteStage): deleted straight, kwok's own delete of it, by name and
	// late under load, once removed the new pod of the same name, which never ran (issue 52).
	// Removing the finalizer from a pod deleted with grace 0 removes the pod in the same write.
	patchPod(ctx, t, ns, "replaced", map[string]any{"metadata": map[string]any{"finalizers": []string{"example.com/replace"}}})
	if err := c.CoreV1().Pods(ns).Delete(ctx, "replaced", metav1.DeleteOptions{GracePeriodSeconds: ptr64(0)}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the old pod terminating", func() bool {
		p, err := c.CoreV1().Pods(ns).Get(ctx, "replaced", metav1.GetOptions{})
		return err == nil && p.DeletionTimestamp != nil
	})
	patchPod(ctx, t, ns, "replaced", map[string]any{"metadata": map[string]any{"finalizers": nil}})
	waitFor(ctx, t, "the old pod gone", func() bool {
		_, err := c.CoreV1().Pods(ns).Get(ctx, "replaced", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if err := scenario.Create(ctx, c, ns, node, taint, []scenario.Pod{{Name: "replaced", Kind: scenario.Plain, Tolerate: ptr64(20), Grace: ptr64(1)}}); err != nil {
		t.Fatal(err)
	}
	end := deadline.Add(-5 * time.Second)
	if summary := waitHandled(ctx, t, node, end); !strings.HasSuffix(summary.Message, ", 1 still present") {
		t.Errorf("summary %q, want the finalizer pod as the one still present", summary.Message)
	}
	// on-time is not held up by the others; the new replaced pod goes at its own plan, T+20
	// (the old one's was T+10).
	evictedAt(ctx, t, obs, ns, "on-time", timeAdded.Add(8*time.Second), timeAdded, false, rp)
	evictedAt(ctx, t, obs, ns, "replaced", timeAdded.Add(20*time.Second), timeAdded, false, rp)
	recs := obs.Records()
	if r := recs["finalizer"]; r.DeletedAt.IsZero() || !r.GoneAt.IsZero() {
		t.Errorf("finalizer pod: deleted %v, gone %v; want evicted and still terminating", r.DeletedAt, r.GoneAt)
	}
	text, err := scenario.Scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "reprieve_evictions_missed_deadline_total 1") {
		t.Errorf("want exactly the finalizer pod counted as missed: %s", grep(text, "reprieve_evictions_missed_deadline_total"))
	}
	evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + events.ReasonMissedDeadline})
	if err != nil || len(evs.Items) != 1 || evs.Items[0].InvolvedObject.Name != "finalizer" {
		t.Errorf("MissedDeadline events: %+v, %v; want one, on the finalizer pod", evs, err)
	}
	if got := strings.Count(rp.LogTail(500), "Evicting pod failed"); got > 0 {
		t.Errorf("%d failed evictions logged: a pod deleted or replaced by someone else must not cause errors", got)
	}
	if r := recs["on-time"]; r.GoneAt.IsZero() || r.GoneAt.After(end) {
		t.Errorf("on-time: gone at %v, after the window's end %v", r.GoneAt, end)
	}
}

func patchPod(ctx context.Context, t *testing.T, ns, name string, patch map[string]any) {
	t.Helper()
	b, err := json.Marshal(patch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("patching pod %s/%s: %v", ns, name, err)
	}
}
