package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/record"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/test/fakes/azureevents"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// cloudPods is the mixed workload without a PDB (the AWS test covers PDBs): no toleration,
// short and long tolerationSeconds, forever, the default grace, a DaemonSet pod.
func cloudPods() []scenario.Pod {
	var out []scenario.Pod
	for _, p := range scenario.Mixed() {
		if !p.PDB && p.Kind != scenario.Mirror && p.Name != "grace-longer-than-window" {
			out = append(out, p)
		}
	}
	return out
}

// assertFollowsPlan checks each pod against the agent's plan, for any cloud: pods left alone are
// untouched; the others are evicted as the API server received it at their plan (or, for pods
// already due then, when the agent wrote its taint), within a second plus the time the agent's
// other requests were in the server's hands (timing.checkSent), with the grace the window
// allows, and gone before deadline - margin.
func assertFollowsPlan(t *testing.T, res *scenario.SpotResult) {
	t.Helper()
	end := res.Window.End()
	var names []string
	for _, row := range res.Rows {
		if !row.Planned.IsZero() && !row.Record.DeletedAt.IsZero() {
			names = append(names, row.Pod)
		}
	}
	tm, knowable := spotTiming(t, res, names...)
	evicted := 0
	for _, row := range res.Rows {
		rec := row.Record
		if row.Planned.IsZero() {
			if !rec.DeletedAt.IsZero() {
				t.Errorf("pod %s (%s): deleted at %v", row.Pod, row.Note, rec.DeletedAt)
			}
			continue
		}
		evicted++
		if rec.DeletedAt.IsZero() {
			t.Errorf("pod %s: never evicted, plan %v", row.Pod, row.Planned)
			continue
		}
		sent := tm.checkSent(t, row.Pod, row.Planned, res.TimeAdded, knowable, row.ByDeadline)
		// What fitted as the request left, with the agent's queueing margin, as
		// TestSpotInterruption checks it: from the server's receipt, a forced DELETE after an
		// eviction cut at its bound (a loaded run) wanted 9 s where 7 s fitted (issue 52).
		want := tm.graceFitted(t, row.Pod, row.Grace, tm.carriedAt(row.Pod, rec.Grace, sent), end)
		tolerance := int64(1)
		if want == row.Grace {
			tolerance = 0
		}
		if absDiff(rec.Grace, want) > tolerance {
			t.Errorf("pod %s: grace %ds, want %ds (±%d): what fitted as the request left, with the agent's queueing margin", row.Pod, rec.Grace, want, tolerance)
		}
		tm.checkInTime(t, row.Pod, rec.DeletionTimestamp, end)
	}
	if evicted == 0 {
		t.Error("no pod was planned for eviction")
	}
	if got := res.Node.Labels[v1.LabelNodeExcludeBalancers]; got != "true" {
		t.Errorf("load-balancer label = %q", got)
	}
}

func runCloud(ctx context.Context, t *testing.T, name string, cloud scenario.Cloud, window time.Duration, args ...string) *scenario.SpotResult {
	t.Helper()
	res, err := scenario.RunSpot(ctx, scenario.SpotOptions{
		Env: env, ReprieveBin: reprieveBin, Namespace: name, Node: name + "-node", Pods: cloudPods(),
		NoticeDelay: 3 * time.Second, Window: window, SafetyMargin: margin,
		LogDir: logDir, Kubeconfig: agentKubeconfig, Cloud: cloud, ExtraArgs: args,
	})
	if err != nil {
		t.Fatal(err)
	}
	logTable(t, res)
	return res
}

// TestGCPPreemption: preempted=TRUE through hanging GETs; the machine goes 30 s later. The
// taint must be on the node within a second of the value changing.
func TestGCPPreemption(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res := runCloud(ctx, t, "gcp", scenario.GCP{}, 30*time.Second)
	if lag := res.TaintSeenAt.Sub(res.NoticePostedAt); res.NoticePostedAt.IsZero() || lag > time.Second {
		t.Errorf("taint seen %v after the notice (posted %v), want under 1s", lag, res.NoticePostedAt)
	} else {
		t.Logf("notice to taint seen: %v", lag)
	}
	if d := res.Deadline.Sub(res.NoticePostedAt); d < 28*time.Second || d > 31*time.Second {
		t.Errorf("deadline %v after the notice, want about 30s", d)
	}
	assertFollowsPlan(t, res)
}

// TestAzurePreemption: a Preempt event from Scheduled Events, NotBefore 45 s after the notice.
func TestAzurePreemption(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res := runCloud(ctx, t, "azure", scenario.Azure{}, 45*time.Second)
	if d := res.Deadline.Sub(res.NoticePostedAt); d < 43*time.Second || d > 46*time.Second {
		t.Errorf("deadline %v after the notice, want NotBefore, about 45s", d)
	}
	assertFollowsPlan(t, res)
}

// TestAzureApprovalAndCancellation: with --azure-approve-events, reprieve approves the event
// once the node is drained; when the event then disappears from the document (finished or
// cancelled), reprieve removes what it added.
func TestAzureApprovalAndCancellation(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, node = "azure-approve", "azure-approve-node"
	setupNode(ctx, t, ns, node, nil)
	interruption, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	if err := scenario.Create(ctx, env.Client, ns, node, interruption, []scenario.Pod{{Name: "evictee", Kind: scenario.Plain, Grace: ptr64(2)}}); err != nil {
		t.Fatal(err)
	}
	srv := azureevents.New(node)
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	rp, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, "--kubeconfig="+agentKubeconfig,
		"--provider=azure", "--azure-imds-endpoint="+url, "--azure-resource-name="+node, "--azure-approve-events")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.Stop() }()

	id := srv.AddEvent(azureevents.Event{EventType: azureevents.EventTypePreempt, Resources: []string{node},
		NotBefore: time.Now().Add(60 * time.Second).Truncate(time.Second), DurationInSeconds: -1})
	waitNode(ctx, t, node, "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, interruption.Key, interruption.Effect) })
	waitFor(ctx, t, "the approval of "+id, func() bool {
		for _, a := range srv.Approvals() {
			if a == id {
				return true
			}
		}
		return false
	})
	if p, err := env.Client.CoreV1().Pods(ns).Get(ctx, "evictee", metav1.GetOptions{}); err == nil {
		t.Errorf("approved while pod %s is still there (phase %s)", p.Name, p.Status.Phase)
	}
	// The event is done and leaves the document: reprieve undoes its taint, label, annotation.
	srv.RemoveEvent(id)
	n := waitNode(ctx, t, node, "the undo", func(n *v1.Node) bool { return !hasTaint(n, interruption.Key, interruption.Effect) })
	if _, ok := n.Labels[v1.LabelNodeExcludeBalancers]; ok {
		t.Errorf("load-balancer label left: %v", n.Labels)
	}
	if _, ok := n.Annotations[record.AnnotationReclaimDeadline]; ok {
		t.Errorf("deadline annotation left: %v", n.Annotations)
	}
	evs, err := env.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	approved := false
	for _, e := range evs.Items {
		approved = approved || (e.Reason == events.ReasonEventApproved && strings.Contains(e.Message, id))
	}
	if !approved {
		t.Errorf("no %s event naming %s", events.ReasonEventApproved, id)
	}
}
