package agent

import (
	"context"
	"errors"
	goruntime "runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
	"github.com/reprieve-dev/reprieve/agent/plan"
	"github.com/reprieve-dev/reprieve/agent/record"
)

// refuseNodePatches makes the fake API server refuse node patches with the admission policy's
// 403 while refuse is true.
func refuseNodePatches(h *harness, refuse *atomic.Bool) {
	h.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !refuse.Load() {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, nodeName,
			errors.New("ValidatingAdmissionPolicy 'reprieve-node-bound' denied request: reprieve may change only the node its token is bound to (this token is bound to no node)"))
	})
}

// TestNodeWriteRefusals: refused node writes (403) count in a row; at --node-write-refusals the
// agent is not ready and says why; a write that passes resets the count; a timeout or an
// outage does not count either way.
func TestNodeWriteRefusals(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.NodeWriteRefusals = 2 }, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	h.a.ready.Store(true)
	h.a.intr.PollOnce(context.Background()) // every source has answered
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, nodeName, errors.New("no node claim"))
	r := h.a.refusals
	r.Observe(forbidden)
	if !h.a.Ready() {
		t.Fatalf("not ready after one refusal of two: %q", h.a.notReady())
	}
	r.Observe(apierrors.NewTimeoutError("slow", 1))
	r.Observe(forbidden)
	if h.a.Ready() {
		t.Fatal("ready after two refusals in a row (a timeout between them does not count)")
	}
	if why := h.a.notReady(); !strings.Contains(why, "2 node writes refused in a row") || !strings.Contains(why, "no node claim") {
		t.Errorf("notReady() = %q; want the count and the API server's reason", why)
	}
	if got := testutil.ToFloat64(h.a.metrics.NodeWritesRefused); got != 2 {
		t.Errorf("reprieve_node_writes_refused_total = %v, want 2", got)
	}
	if got := testutil.ToFloat64(h.a.metrics.NodeWriteRefusalsInARow); got != 2 {
		t.Errorf("reprieve_node_write_refusals_in_a_row = %v, want 2", got)
	}
	r.Observe(nil)
	if !h.a.Ready() {
		t.Errorf("not ready after a write that passed: %q", h.a.notReady())
	}
	if got := testutil.ToFloat64(h.a.metrics.NodeWriteRefusalsInARow); got != 0 {
		t.Errorf("in a row after a write that passed = %v, want 0", got)
	}

	// 0 never turns the agent not ready; the counter still counts.
	h0 := newHarness(t, nil, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	h0.a.ready.Store(true)
	h0.a.intr.PollOnce(context.Background()) // every source has answered
	for range 5 {
		h0.a.refusals.Observe(forbidden)
	}
	if !h0.a.Ready() {
		t.Errorf("--node-write-refusals=0: not ready: %q", h0.a.notReady())
	}
	if got := testutil.ToFloat64(h0.a.metrics.NodeWritesRefused); got != 5 {
		t.Errorf("--node-write-refusals=0: refused_total = %v, want 5", got)
	}
}

// TestNodeWriteRefusalsFromTaintWrites: the taint writes of an interruption count too, so an
// agent whose token lost its claim after start turns not ready at its next interruption.
func TestNodeWriteRefusalsFromTaintWrites(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.NodeWriteRefusals = 1 }, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}})
	h.a.ready.Store(true)
	h.a.intr.PollOnce(context.Background()) // every source has answered
	var refuse atomic.Bool
	refuse.Store(true)
	refuseNodePatches(h, &refuse)
	h.notice(t0.Add(2 * time.Minute))
	if h.a.Ready() {
		t.Error("ready after the interruption taint's write was refused")
	}
	refuse.Store(false)
	h.step()
	if !h.a.Ready() {
		t.Errorf("not ready after the taint write passed: %q", h.a.notReady())
	}
	if !record.HasTaint(h.node().Spec.Taints, h.a.taints.Interruption) {
		t.Error("the interruption taint is not on the node once writes pass")
	}
}

// TestNodeWriteCheck: the check is a server-side dry run (no change to the node); while it is
// refused it retries with backoff (1 s, 2 s, ...), turning the agent not ready at the limit; once
// it passes the agent is ready, and it checks again every 10 minutes, so that a refusal that
// begins later is counted before the next interruption.
func TestNodeWriteCheck(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, ResourceVersion: "7"}}
	// The NoExecute mode, explicitly (the default is --interruption-eviction=reprieve).
	h := newHarness(t, func(c *config.Config) {
		c.NodeWriteRefusals = 3
		c.InterruptionEviction = string(plan.EvictionKubeControllerManager)
	}, node)
	h.a.ready.Store(true)
	h.a.intr.PollOnce(context.Background()) // every source has answered
	var refuse atomic.Bool
	refuse.Store(true)
	// The API server stores nothing of a dry run (the fake tracker would apply it).
	h.client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if pa, ok := a.(k8stesting.PatchActionImpl); ok && len(pa.PatchOptions.DryRun) > 0 && !refuse.Load() {
			n, err := h.client.Tracker().Get(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, "", nodeName)
			return true, n, err
		}
		return false, nil, nil
	})
	refuseNodePatches(h, &refuse)
	// A clock of its own: the agent's work queue waits on the harness's clock too, and
	// HasWaiters must see only this loop's timer. The check loop runs on a writer of its own
	// on that clock, counting into the agent's refusals.
	clk := clocktesting.NewFakeClock(t0)
	checker := record.NewWriter(record.WriterOptions{Client: kubetest.Wrap(h.client), NodeName: nodeName, Taints: h.a.taints, Clock: clk,
		Nodes: h.a.nodeLister})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); checker.WatchWrites(ctx, h.a.refusals, h.a.writeProbe) }()
	// waitTimer waits until the loop sleeps on the fake clock, then moves the clock by d.
	waitTimer := func(d time.Duration) {
		t.Helper()
		for !clk.HasWaiters() {
			select {
			case <-done:
				t.Fatal("the check loop ended while refused")
			default:
				goruntime.Gosched()
			}
		}
		clk.Step(d)
	}
	waitTimer(time.Second)
	waitTimer(2 * time.Second)
	for !clk.HasWaiters() || testutil.ToFloat64(h.a.metrics.NodeWritesRefused) < 3 {
		goruntime.Gosched()
	}
	if h.a.Ready() {
		t.Error("ready after three refused checks")
	}
	refuse.Store(false)
	waitTimer(4 * time.Second)
	// The fourth check passes; the loop then waits 10 minutes.
	for !clk.HasWaiters() || len(h.actions("patch", "nodes", "")) < 4 {
		goruntime.Gosched()
	}
	if !h.a.Ready() {
		t.Errorf("not ready after the check passed: %q", h.a.notReady())
	}
	refuse.Store(true)
	waitTimer(record.WriteCheckInterval - time.Second)
	if n := len(h.actions("patch", "nodes", "")); n != 4 {
		t.Errorf("%d checks before the 10 minutes are up, want 4", n)
	}
	clk.Step(time.Second)
	for !clk.HasWaiters() || testutil.ToFloat64(h.a.metrics.NodeWriteRefusalsInARow) < 1 {
		goruntime.Gosched()
	}
	cancel()
	<-done
	patches := h.actions("patch", "nodes", "")
	if len(patches) != 5 {
		t.Fatalf("%d node patches, want 5 checks", len(patches))
	}
	for _, p := range patches {
		pa := p.(k8stesting.PatchActionImpl)
		// The check carries what an interruption would write (issue 20, case 10: an empty patch
		// passed a policy that refuses only taint changes), with no resourceVersion precondition.
		if len(pa.PatchOptions.DryRun) != 1 || pa.PatchOptions.DryRun[0] != metav1.DryRunAll ||
			!strings.Contains(string(pa.Patch), `"taints":[{"key":"cloud","value":"spot","effect":"NoExecute"`) ||
			strings.Contains(string(pa.Patch), "resourceVersion") {
			t.Errorf("check patch %q with %+v; want the interruption's taint change with dryRun=All and no resourceVersion", pa.Patch, pa.PatchOptions)
		}
	}
	if n := h.node(); n.ResourceVersion != "7" || len(n.Annotations) != 0 {
		t.Errorf("the node changed under the dry run: %+v", n.ObjectMeta)
	}
}
