package agent

import (
	"context"
	"errors"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/providers/providertest"
)

// Tests for issue 20: restarts, partial answers and slow writes must not bend the deadline. Each
// one failed on the shape before it (one Agent under one mutex, state rebuilt from whatever
// answers the process had seen).

const (
	srcSpot      = "spot/instance-action"
	srcRebalance = "events/recommendations/rebalance"
	srcScheduled = "events/maintenance/scheduled"
)

func awsSources(answered ...string) *providertest.SourcesFake {
	f := providertest.NewWithSources("aws", srcSpot, srcRebalance, srcScheduled)
	for _, s := range answered {
		f.SetAnswered(s, true)
	}
	return f
}

// restarted returns a harness for a new agent process on the node first left, at now, with p as
// its provider and pods on the node.
func restarted(t *testing.T, first *harness, now time.Time, p providers.Provider, pods ...runtime.Object) *harness {
	t.Helper()
	node := first.node().DeepCopy()
	node.ResourceVersion = ""
	h := newHarness(t, nil, append([]runtime.Object{node}, pods...)...)
	h.clock.SetTime(now)
	h.build(p)
	return h
}

// TestRestartWithAPartialAnswerKeepsTheInterruption (case 1): restarted while the rebalance source
// answers and the spot source fails, the agent keeps the taint with its timeAdded, the deadline
// annotation and the load-balancer label; every countdown stays where the first agent put it.
// Only the spot source's own positive "none" withdraws it.
func TestRestartWithAPartialAnswerKeepsTheInterruption(t *testing.T) {
	deadline := t0.Add(120 * time.Second)
	spotN := providers.Notice{Provider: "aws", Source: srcSpot, Kind: providers.KindSpotInterruption, ID: "spot-1",
		NoticeTime: t0, Deadline: deadline, Action: "terminate"}
	rebal := providers.Notice{Provider: "aws", Source: srcRebalance, Kind: providers.KindRebalanceRecommendation, ID: "r-1", NoticeTime: t0}
	first := newHarness(t, nil, testNode())
	p1 := awsSources(srcSpot, srcRebalance, srcScheduled)
	first.build(p1)
	p1.Set(spotN, rebal)
	first.step()
	before := first.node()
	if len(before.Spec.Taints) != 2 || before.Annotations[record.AnnotationInterruption] == "" {
		t.Fatalf("first agent: taints %+v, record %q", before.Spec.Taints, before.Annotations[record.AnnotationInterruption])
	}

	// Six seconds later a new process: the rebalance and scheduled sources answer, the spot
	// source fails.
	p2 := awsSources(srcRebalance, srcScheduled)
	p2.Set(rebal)
	p2.SetError(errors.New("reading spot/instance-action: 500 Internal Server Error"))
	h := restarted(t, first, t0.Add(6*time.Second), p2, testPod("tol10", 5, spotToleration(secs(10))))
	h.step()
	after := h.node()
	spot := taintOf(after, "cloud")
	if spot == nil || !spot.TimeAdded.Equal(taintOf(before, "cloud").TimeAdded) {
		t.Fatalf("interruption taint after the restart = %+v, want it kept with timeAdded %v", spot, taintOf(before, "cloud").TimeAdded)
	}
	if after.Annotations[record.AnnotationReclaimDeadline] != before.Annotations[record.AnnotationReclaimDeadline] || after.Labels[record.LabelExcludeFromLB] != "true" {
		t.Fatalf("annotations %v labels %v after the restart", after.Annotations, after.Labels)
	}
	if v := h.a.exec.View(); !v.Window.Deadline.Equal(deadline) {
		t.Fatalf("restarted agent plans with deadline %v, want %v", v.Window.Deadline, deadline)
	}
	if d := h.a.exec.SyncPod(h.ctx, "ns/tol10"); d != 4*time.Second {
		t.Errorf("tolerating 10 s: requeue %v, want 4 s (counted from the first agent's timeAdded)", d)
	}

	// The spot source answers again, with the notice as this process first sees it: nothing
	// moves and nothing is rewritten.
	p2.SetAnswered(srcSpot, true)
	again := spotN
	again.NoticeTime = t0.Add(7 * time.Second)
	p2.Set(again, rebal)
	h.clock.Step(time.Second)
	patches := len(h.actions("patch", "nodes", ""))
	h.step()
	if n := len(h.actions("patch", "nodes", "")); n != patches {
		t.Errorf("the spot source's answer rewrote the node (%d patches)", n-patches)
	}
	// Its positive "none" withdraws it.
	p2.Set(rebal)
	h.step()
	if taintOf(h.node(), "cloud") != nil {
		t.Error("the interruption taint stayed after the spot source answered without it")
	}
}

// azurePreempted is a first agent on Azure that has written the record of a Preempt event
// posted at t0 with deadline.
func azurePreempted(t *testing.T, deadline time.Time) *harness {
	t.Helper()
	preempt := providers.Notice{Provider: "azure", Source: "scheduledevents", Kind: providers.KindPreemption, ID: "evt-1",
		NoticeTime: t0, Deadline: deadline, Action: "Preempt"}
	first := newHarness(t, func(c *config.Config) { c.Provider = "azure" }, testNode())
	p1 := providertest.NewWithSources("azure", "scheduledevents")
	p1.SetAnswered("scheduledevents", true)
	first.build(p1)
	p1.Set(preempt)
	first.step()
	return first
}

// TestRestartWhileAzureFirstCallIsOutstanding (case 2): while Azure's first Scheduled Events
// call is outstanding the provider reports nothing and no error; that is unknown, not "no
// notice": the taint and the annotation stay.
func TestRestartWhileAzureFirstCallIsOutstanding(t *testing.T) {
	deadline := t0.Add(60 * time.Second)
	first := azurePreempted(t, deadline)
	before := first.node()

	pending := providertest.NewWithSources("azure", "scheduledevents") // answered: false
	h := restarted(t, first, t0.Add(10*time.Second), pending)
	h.step()
	after := h.node()
	if taintOf(after, "cloud") == nil || after.Annotations[record.AnnotationReclaimDeadline] != before.Annotations[record.AnnotationReclaimDeadline] {
		t.Fatalf("taints %+v annotations %v while the first call is outstanding: want both kept", after.Spec.Taints, after.Annotations)
	}
	if v := h.a.exec.View(); !v.Window.Deadline.Equal(deadline) {
		t.Fatalf("deadline %v while the first call is outstanding, want %v", v.Window.Deadline, deadline)
	}
}

// TestRestartKeepsAFirstSeenDeadline (case 3): a GCP value has no time of its own; its deadline
// counts from when an agent first saw it. A restarted agent counts from the record's first-seen
// time, not from its own: 56 min into a one-hour maintenance notice the deadline stays at the
// hour (not 1h56m, beyond --maintenance-lead), and 10 s into a preemption it stays at 30 s.
func TestRestartKeepsAFirstSeenDeadline(t *testing.T) {
	for _, tc := range []struct {
		name      string
		kind      providers.Kind
		source    string
		lead      time.Duration
		restartAt time.Duration
	}{
		{"maintenance", providers.KindScheduledMaintenance, "instance/maintenance-event", time.Hour, 56 * time.Minute},
		{"preemption", providers.KindPreemption, "instance/preempted", 30 * time.Second, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := func(at time.Time, id string) providers.Notice {
				return providers.Notice{Provider: "gcp", Source: tc.source, Kind: tc.kind, ID: id, NoticeTime: at,
					Deadline: at.Add(tc.lead), Action: "terminate", FromFirstSeen: true}
			}
			cfg := func(c *config.Config) { c.Provider = "gcp" }
			first := newHarness(t, cfg, testNode())
			p1 := providertest.NewWithSources("gcp", tc.source)
			p1.SetAnswered(tc.source, true)
			first.build(p1)
			// The first agent sees the value at t0; for a maintenance an hour out it is far
			// ahead until the lead, so the test moves to 56 min before its restart.
			p1.Set(seen(t0, "id-first"))
			first.step()
			first.clock.SetTime(t0.Add(tc.restartAt - time.Second))
			first.step()
			before := first.node()
			if taintOf(before, "cloud") == nil {
				t.Fatalf("first agent: no interruption taint at %v", tc.restartAt-time.Second)
			}

			// The new process first sees the value now: its ID and deadline count from now.
			now := t0.Add(tc.restartAt)
			p2 := providertest.NewWithSources("gcp", tc.source)
			p2.SetAnswered(tc.source, true)
			p2.Set(seen(now, "id-second"))
			h := restarted(t, first, now, p2)
			h.step()
			if v := h.a.exec.View(); !v.Window.Deadline.Equal(t0.Add(tc.lead)) {
				t.Fatalf("deadline after the restart %v, want %v (the first sight plus %v)", v.Window.Deadline, t0.Add(tc.lead), tc.lead)
			}
			after := h.node()
			if taintOf(after, "cloud") == nil || after.Annotations[record.AnnotationReclaimDeadline] != before.Annotations[record.AnnotationReclaimDeadline] {
				t.Fatalf("taints %+v annotations %v after the restart: want the interruption kept", after.Spec.Taints, after.Annotations)
			}
		})
	}
}

// TestEvictionsDoNotWaitForTheNodeWrite (case 4): a node PATCH held by a slow admission webhook
// or a struggling API server holds back neither the plan nor the evictions.
func TestEvictionsDoNotWaitForTheNodeWrite(t *testing.T) {
	h := newHarness(t, nil, testNode(), testPod("now", 5))
	// The fake clientset runs one reaction at a time: a held PATCH would hold an eviction sent
	// through it too, which the API server does not do. Evictions go around it here.
	var evicted []string
	var mu sync.Mutex
	h.evictFn = func(_ context.Context, ev *policyv1.Eviction) error {
		mu.Lock()
		defer mu.Unlock()
		evicted = append(evicted, ev.Name)
		return nil
	}
	h.build(h.prov)
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		once.Do(func() { close(held) })
		<-release
		return false, nil, nil
	})
	defer close(release)
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	go h.a.writer.Run(ctx)
	h.prov.Set(providerNotice("spot-1", t0.Add(40*time.Second)))
	h.a.intr.PollOnce(h.ctx)
	h.a.intr.Reconcile(h.ctx)
	<-held // the writer's PATCH is in flight and held
	d := h.a.exec.SyncPod(h.ctx, "ns/now")
	mu.Lock()
	defer mu.Unlock()
	if d != 0 || len(evicted) != 1 {
		t.Fatalf("while the node PATCH is held: requeue %v, evictions %v; want the untolerating pod evicted at once", d, evicted)
	}
}

// TestStopMidWindowSummarizes (case 6): SIGTERM in the middle of a window: the agent works to the
// window's end and gives the window's summary before it stops.
func TestStopMidWindowSummarizes(t *testing.T) {
	h := newHarness(t, nil, testNode(), testPod("stays", 5, spotToleration(secs(3600))))
	h.notice(t0.Add(20 * time.Second)) // window end t0+15s
	h.drainEvents()
	parent, cancel := context.WithCancel(h.ctx)
	cancel() // the signal
	stopped := make(chan struct{})
	workDone := make(chan struct{})
	defer close(workDone)
	// The linger's own clock: the harness's is shared with the work queue.
	clk := clocktesting.NewFakeClock(t0)
	h.clock.SetTime(t0.Add(15 * time.Second)) // what the executor's summary reads
	go h.a.lingerOnStop(parent, clk, func() { close(stopped) }, workDone)
	for {
		select {
		case <-stopped:
		default:
			if !clk.HasWaiters() {
				goruntime.Gosched()
				continue
			}
			clk.Step(time.Second)
			continue
		}
		break
	}
	if clk.Now().Before(t0.Add(15 * time.Second)) {
		t.Fatalf("stopped at %v, before the window's end", clk.Now())
	}
	evs := h.drainEvents()
	if !hasEvent(evs, "Warning InterruptionHandled") || !hasEvent(evs, "Warning MissedDeadline") {
		t.Fatalf("events at the stop %q: want the window's summary and the missed deadline", evs)
	}
}

// TestStopWaitsForTheVolumeCount (issue 50, case 6): SIGTERM mid-window, and at the window's
// end the node still lists a volume of a pod reprieve planned with the volume rule: the kubelet
// is due to publish its release only by the deadline, so the agent lingers (within
// --stop-grace) until the release comes or the deadline does, and the summary counts it then.
func TestStopWaitsForTheVolumeCount(t *testing.T) {
	const vol = v1.UniqueVolumeName("kubernetes.io/csi/ebs.csi.aws.com^vol-db")
	for _, c := range []struct {
		name     string
		released time.Duration // after t0; 0: never
		stopAt   time.Duration
		want     string
	}{
		{name: "released at D-3s", released: 37 * time.Second, stopAt: 37 * time.Second, want: "1 released"},
		{name: "still listed at D", stopAt: 40 * time.Second, want: "1 still in use"},
	} {
		t.Run(c.name, func(t *testing.T) {
			node := testNode()
			node.Status.VolumesInUse = []v1.UniqueVolumeName{vol}
			db := testPod("db", 5, spotToleration(secs(600)))
			db.Spec.Volumes = []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data-db"}}}}
			h := newHarness(t, func(c *config.Config) { c.VolumeRelease = "16s" }, node, db)
			h.notice(t0.Add(40 * time.Second)) // window end t0+35s
			h.a.exec.SyncPod(h.ctx, "ns/db")   // planned with the volume rule: its volumes are read
			h.drainEvents()
			parent, cancel := context.WithCancel(h.ctx)
			cancel() // the signal
			stopped := make(chan struct{})
			workDone := make(chan struct{})
			defer close(workDone)
			clk := clocktesting.NewFakeClock(t0.Add(30 * time.Second))
			h.clock.SetTime(t0.Add(35 * time.Second))
			go h.a.lingerOnStop(parent, clk, func() { close(stopped) }, workDone)
			for done := false; !done; {
				select {
				case <-stopped:
					done = true
				default:
					if !clk.HasWaiters() {
						goruntime.Gosched()
						continue
					}
					if c.released > 0 && !clk.Now().Before(t0.Add(c.released)) {
						h.a.exec.ObserveVolumes(nil, clk.Now())
					}
					clk.Step(100 * time.Millisecond)
				}
			}
			if got := clk.Now().Sub(t0); got < c.stopAt || got > c.stopAt+time.Second {
				t.Errorf("stopped at T+%v, want at T+%v", got, c.stopAt)
			}
			evs := h.drainEvents()
			found := false
			for _, e := range evs {
				found = found || strings.Contains(e, "InterruptionHandled") && strings.Contains(e, c.want)
			}
			if !found {
				t.Errorf("events at the stop %q: want the window's summary with %q", evs, c.want)
			}
		})
	}
}

// TestStopThenTheDeadlineMovesLater (case 7): after SIGTERM, a deadline that moves later, past
// --stop-grace, stops the agent at once instead of keeping it past its pod's grace.
func TestStopThenTheDeadlineMovesLater(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.StopGrace = 60 * time.Second }, testNode())
	h.notice(t0.Add(40 * time.Second))
	parent, cancel := context.WithCancel(h.ctx)
	cancel()
	stopped := make(chan struct{})
	workDone := make(chan struct{})
	defer close(workDone)
	clk := clocktesting.NewFakeClock(t0)
	go h.a.lingerOnStop(parent, clk, func() { close(stopped) }, workDone)
	for range 3 {
		for !clk.HasWaiters() {
			select {
			case <-stopped:
				t.Fatal("stopped before the window's end with the deadline within --stop-grace")
			default:
				goruntime.Gosched()
			}
		}
		clk.Step(time.Second)
	}
	// The deadline moves later, to 9 minutes out (within --maintenance-lead, past --stop-grace).
	h.notice(t0.Add(9 * time.Minute))
	for {
		select {
		case <-stopped:
			return
		default:
			if clk.HasWaiters() {
				clk.Step(time.Second)
			}
			goruntime.Gosched()
			if clk.Now().After(t0.Add(2 * time.Minute)) {
				t.Fatalf("still lingering at %v for a window ending %v, past --stop-grace", clk.Now(), h.a.exec.View().Window.End())
			}
		}
	}
}

func taintOf(n *v1.Node, key string) *v1.Taint {
	for i := range n.Spec.Taints {
		if n.Spec.Taints[i].Key == key {
			return &n.Spec.Taints[i]
		}
	}
	return nil
}

var _ = record.AnnotationInterruption

// TestPlatformSignalAloneAndItsWithdrawal (issue 21 item 3): GKE's impending-termination taint
// alone taints the node and plans the pods; once the metadata service reports a spot notice too,
// removing the signal withdraws only what it raised.
func TestPlatformSignalAloneAndItsWithdrawal(t *testing.T) {
	added := metav1.NewTime(t0)
	node := testNode(v1.Taint{Key: "cloud.google.com/impending-node-termination", Effect: v1.TaintEffectNoSchedule, TimeAdded: &added})
	node.Spec.ProviderID = "gce://p/us-central1-a/" + nodeName // GKE's signals are read on GKE's nodes only (issue 39 item 5)
	h := newHarness(t, nil, node, testPod("now", 5))
	h.step()
	if taintOf(h.node(), "cloud") == nil {
		t.Fatal("the platform signal alone did not taint the node")
	}
	if v := h.a.exec.View(); !v.Window.Deadline.Equal(t0.Add(30 * time.Second)) {
		t.Fatalf("deadline %v, want first seen + 30 s", v.Window.Deadline)
	}
	// The cloud's own notice, later, and the signal goes away.
	h.prov.Set(providerNotice("spot-1", t0.Add(2*time.Minute)))
	n := h.node()
	n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t v1.Taint) bool { return t.Key == "cloud.google.com/impending-node-termination" })
	if _, err := h.client.CoreV1().Nodes().Update(h.ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.syncStores()
	h.step()
	if taintOf(h.node(), "cloud") == nil {
		t.Fatal("withdrawing the signal removed the interruption the metadata service still reports")
	}
	if v := h.a.exec.View(); !v.Window.Deadline.Equal(t0.Add(2 * time.Minute)) {
		t.Fatalf("deadline %v after the signal went, want the spot notice's %v", v.Window.Deadline, t0.Add(2*time.Minute))
	}
}

// pollSeen is a provider whose Poll first calls seen: what the agent had planned by the time it
// asked the cloud.
type pollSeen struct {
	*providertest.SourcesFake
	seen func()
}

func (p *pollSeen) Poll(ctx context.Context) ([]providers.Notice, error) {
	p.seen()
	return p.SourcesFake.Poll(ctx)
}

// TestRestartPlansFromTheRecordBeforeAskingTheCloud (issue 52): a new process on a node whose
// record holds a notice plans from it before its first call to the cloud, which the cloud may
// hold open for seconds (Azure's first Scheduled Events call): a pod the record makes due must
// not wait for that answer. Through Run, as the process starts.
func TestRestartPlansFromTheRecordBeforeAskingTheCloud(t *testing.T) {
	deadline := t0.Add(60 * time.Second)
	first := azurePreempted(t, deadline)

	planned := make(chan time.Time, 1)
	var h *harness
	p := &pollSeen{SourcesFake: providertest.NewWithSources("azure", "scheduledevents"), seen: func() {
		select {
		case planned <- h.a.exec.View().Window.Deadline:
		default:
		}
	}}
	h = restarted(t, first, t0.Add(10*time.Second), p)
	// Stopped at once, without working on to the window's end on the fake clock.
	h.a.cfg.StopGrace = 0
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.a.Run(ctx) }()
	select {
	case got := <-planned:
		if !got.Equal(deadline) {
			t.Errorf("the window when the new process first asked the cloud: deadline %v; want the record's %v, planned before the answer", got, deadline)
		}
	case err := <-done:
		t.Fatalf("the agent stopped before it asked the cloud: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}

	// A node without a record is not planned before the answer.
	var fresh *harness
	freshPlanned := make(chan bool, 1)
	fp := &pollSeen{SourcesFake: providertest.NewWithSources("azure", "scheduledevents"), seen: func() {
		select {
		case freshPlanned <- fresh.a.exec.View().Window.HasDeadline():
		default:
		}
	}}
	fresh = newHarness(t, func(c *config.Config) { c.Provider = "azure" }, testNode())
	fresh.build(fp)
	ctx, cancel = context.WithCancel(context.Background())
	go func() { done <- fresh.a.Run(ctx) }()
	if has := <-freshPlanned; has {
		t.Error("a node without a record had a window before the first answer")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestRestartEvictsWhileTheFirstCallIsHeld (issue 52): the pods the record makes due go while
// the new process's first call to the cloud is held open. Planning early is not enough: the
// executor's workers must run. CI's make test saw the restarted agent plan a pod due at T+5 at
// T+3.5 and send it at T+6.5, the moment its first Scheduled Events call gave up (3 s): the
// workers started only after that call.
func TestRestartEvictsWhileTheFirstCallIsHeld(t *testing.T) {
	deadline := t0.Add(60 * time.Second)
	first := azurePreempted(t, deadline)

	evicted := make(chan string, 10)
	// Outcome of the held call: what was evicted while it was held, or that nothing was within
	// the bound (a failure bound, not a synchronisation: the eviction needs no clock step).
	held := make(chan string, 1)
	p := &pollSeen{SourcesFake: providertest.NewWithSources("azure", "scheduledevents"), seen: func() {
		select {
		case name := <-evicted:
			held <- name
		case <-time.After(10 * time.Second):
			held <- ""
		}
	}}
	h := restarted(t, first, t0.Add(10*time.Second), p, testPod("due", 5))
	// Read at each eviction: set after the build.
	h.evictFn = func(_ context.Context, ev *policyv1.Eviction) error {
		evicted <- ev.Name
		return nil
	}
	h.a.cfg.StopGrace = 0
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.a.Run(ctx) }()
	select {
	case name := <-held:
		if name != "due" {
			t.Errorf("while the first call was held, evicted %q; want the pod the record makes due (due) evicted before the answer", name)
		}
	case err := <-done:
		t.Fatalf("the agent stopped before it asked the cloud: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
