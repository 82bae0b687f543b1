package e2e

import (
	"context"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/reprieve-dev/reprieve/test/fakes/gcpmeta"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestLifecycleUpgradeMidWindowKeepsCountdowns upgrades the chart during a GCP preemption window
// (30 s from the first sighting, the countdown a new process could lose): the agent of the first
// render runs, the window starts, and the second render (another image tag and log format: a new
// pod template, which the DaemonSet rolls out) replaces it as the chart's update strategy does,
// one node at a time and never two agents on a node (maxUnavailable 1, no surge): SIGTERM to the
// old agent, which exits within the pod's grace, then the new one starts. Twice: with the
// agent's default --stop-grace the old agent carries the window to its end before it exits
// ("within-stop-grace"); with a window longer than --stop-grace (1 s here, as an Azure or
// maintenance window longer than the pod's grace) it exits at once and the new agent resumes
// the window from the node's record ("beyond-stop-grace"). Either way the interruption record
// (the taint's timeAdded, the deadline, the notices with their first sighting) is not touched by
// the rollout, no taint is removed, and each pod is evicted at the time the first agent planned
// from the first sighting, not from the new agent's.
func TestLifecycleUpgradeMidWindowKeepsCountdowns(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		extra []string
	}{{"within-stop-grace", nil}, {"beyond-stop-grace", []string{"--stop-grace=1s"}}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			upgradeMidWindow(t, "lc-up-"+c.name, c.extra)
		})
	}
}

func upgradeMidWindow(t *testing.T, ns string, extra []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := ns + "-node"

	// The two releases' DaemonSets: what changes is the pod template, so every agent restarts.
	v1DS, _ := renderDaemonSet(t, "upgrade v1", "--set", "cloud=gcp")
	v2DS, _ := renderDaemonSet(t, "upgrade v2", "--set", "cloud=gcp,image.tag=v2.0.0,logFormat=json")
	if reflect.DeepEqual(v1DS.Spec.Template, v2DS.Spec.Template) {
		t.Fatal("the two renders have the same pod template; want an upgrade that rolls the DaemonSet")
	}
	if u := v2DS.Spec.UpdateStrategy; u.RollingUpdate == nil || u.RollingUpdate.MaxUnavailable == nil || u.RollingUpdate.MaxUnavailable.IntValue() != 1 ||
		(u.RollingUpdate.MaxSurge != nil && u.RollingUpdate.MaxSurge.IntValue() != 0) {
		t.Errorf("update strategy %+v; want a rolling update of one node at a time without surge (never two agents on a node)", u)
	}
	grace := time.Duration(*v1DS.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	logFormat := func(ds *v1.PodTemplateSpec) string {
		for _, e := range ds.Spec.Containers[0].Env {
			if e.Name == "REPRIEVE_LOG_FORMAT" {
				return e.Value
			}
		}
		t.Fatal("the DaemonSet sets no REPRIEVE_LOG_FORMAT")
		return ""
	}

	taint, obs := observedNode(ctx, t, ns, node, []scenario.Pod{
		{Name: "tol-12", Kind: scenario.Plain, Tolerate: ptr64(12), Grace: ptr64(1)},
		{Name: "latest", Kind: scenario.Plain, Tolerate: ptr64(600), Grace: ptr64(5)},
	})
	srv := gcpmeta.New()
	url, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	args := append([]string{"--kubeconfig=" + agentKubeconfig, "--provider=gcp", "--gcp-metadata-endpoint=" + strings.TrimPrefix(url, "http://")}, extra...)
	old, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node, append(args, "--log-format="+logFormat(&v1DS.Spec.Template))...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = old.Stop() }()
	srv.Set(gcpmeta.PathPreempted, "TRUE")
	n := waitRecord(ctx, t, node, 30*time.Second, taint, gcpmeta.PathPreempted)
	before := recordOf(n, taint)
	T := before.TimeAdded
	D, err := time.Parse(time.RFC3339, before.Deadline)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("record before the upgrade: %+v (deadline T%+.0fs)", before, D.Sub(T).Seconds())

	// The rollout reaches this node 6 s into the window.
	sleepUntil(ctx, t, T.Add(6*time.Second))
	watch := watchRecord(ctx, node, taint, before)
	stopped := time.Now()
	// As the kubelet stops the old pod: SIGTERM, and SIGKILL only past its grace.
	if err := old.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := old.Wait(grace)
	t.Logf("the old agent exited at T%+.2fs", time.Since(T).Seconds())
	if err != nil || code != 0 {
		t.Errorf("the old agent: exit %d, %v within the pod's grace %v; want 0 after SIGTERM\n%s", code, err, grace, old.LogTail(20))
	}
	upgraded, _, err := scenario.StartReprieve(ctx, reprieveBin, logDir, node+"-v2", append(args, "--node-name="+node, "--log-format="+logFormat(&v2DS.Spec.Template))...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = upgraded.Stop() }()
	ready := time.Now()
	latest := lastStart(D.Add(-margin), 5*time.Second)
	eventually(ctx, time.Until(latest)+10*time.Second, func() bool {
		r := obs.Records()
		return !r["tol-12"].DeletedAt.IsZero() && !r["latest"].DeletedAt.IsZero()
	})
	watch.check(t, T, before)
	t.Logf("old agent stopped at T%+.2fs, the upgraded one ready at T%+.2fs (its own first sight + 30 s would be T%+.2fs)",
		stopped.Sub(T).Seconds(), ready.Sub(T).Seconds(), ready.Add(30*time.Second).Sub(T).Seconds())
	evictedAt(ctx, t, obs, ns, "tol-12", T.Add(12*time.Second), T, false, old, upgraded)
	evictedAt(ctx, t, obs, ns, "latest", latest, T, true, old, upgraded)
	noTaintRemoved(ctx, t, node, taint, stopped)
	if log := upgraded.LogTail(200); !strings.Contains(log, `"msg"`) {
		t.Errorf("the upgraded agent does not log JSON (the second render's logFormat):\n%s", log)
	}
}
