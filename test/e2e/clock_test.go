package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/events"
	"github.com/reprieve-dev/reprieve/agent/record"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reprieve-dev/reprieve/test/fakes/azureevents"
	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestDeadlineOddities: deadlines that are already past, a year away, that move earlier, and two
// notices for the same machine, on the real binary: each handled with one request per pod (no
// eviction storm) and a clear log line.
func TestDeadlineOddities(t *testing.T) {
	t.Parallel()
	taint, _ := config.ParseTaint(config.DefaultConfig().InterruptionTaint)
	cfg := config.DefaultConfig()
	maint, _ := config.ParseTaint(cfg.MaintenanceTaint)
	pods := []scenario.Pod{
		{Name: "due", Kind: scenario.Plain, Grace: ptr64(30)},
		{Name: "tolerates", Kind: scenario.Plain, Tolerate: ptr64(20), Grace: ptr64(2)},
	}
	// start creates the node and pods and starts the agent with --provider none (extra args
	// replace the provider).
	start := func(ctx context.Context, t *testing.T, name string, args ...string) (*scenario.Observer, func(int) string, string) {
		t.Helper()
		setupNode(ctx, t, name, name+"-node", nil)
		if err := scenario.Create(ctx, env.Client, name, name+"-node", taint, pods); err != nil {
			t.Fatal(err)
		}
		obs, err := scenario.Observe(ctx, env.Client, name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(obs.Stop)
		if len(args) == 0 {
			args = []string{"--provider=none"}
		}
		rp, addr, err := scenario.StartReprieve(ctx, reprieveBin, logDir, name+"-node", append([]string{"--kubeconfig=" + agentKubeconfig}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rp.Stop() })
		return obs, rp.LogTail, addr
	}
	// requests returns the eviction and delete requests the agent made, by result.
	requests := func(t *testing.T, addr string) float64 {
		t.Helper()
		text, err := scenario.Scrape(addr)
		if err != nil {
			t.Fatal(err)
		}
		return sumMetric(text, `reprieve_evictions_requests_total{result="evicted"}`) + sumMetric(text, `reprieve_evictions_requests_total{result="forced_delete"}`)
	}

	t.Run("past", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		obs, logTail, addr := start(ctx, t, "past")
		setDeadline(ctx, t, "past-node", time.Now().Add(-10*time.Second).UTC().Format(time.RFC3339))
		waitFor(ctx, t, "both pods evicted", func() bool {
			r := obs.Records()
			return !r["due"].DeletedAt.IsZero() && !r["tolerates"].DeletedAt.IsZero()
		})
		r := obs.Records()
		for _, name := range []string{"due", "tolerates"} {
			// The shortest is the kubelet's own floor, 2 s (plan.MinGrace; issue 38, case 2).
			if r[name].Grace > 2 {
				t.Errorf("%s evicted with grace %ds; a past deadline leaves the shortest (2 s)", name, r[name].Grace)
			}
		}
		if !strings.Contains(logTail(200), "deadline has already passed") {
			t.Error("no log line saying the deadline has passed")
		}
		waitHandled(ctx, t, "past-node", time.Now())
		if got := requests(t, addr); got != 2 {
			t.Errorf("%v accepted eviction or delete requests for 2 pods", got)
		}
	})

	t.Run("a year away", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		obs, logTail, addr := start(ctx, t, "year")
		setDeadline(ctx, t, "year-node", time.Now().AddDate(1, 0, 0).UTC().Format(time.RFC3339))
		n := waitNode(ctx, t, "year-node", "the maintenance taint", func(n *v1.Node) bool { return hasTaint(n, maint.Key, maint.Effect) })
		if hasTaint(n, taint.Key, taint.Effect) {
			t.Errorf("interruption taint for a deadline a year away: %v", n.Spec.Taints)
		}
		// Give the agent three more polls (each one re-plans) to do anything it would do,
		// counted from its metrics rather than slept.
		polls := func() float64 {
			text, err := scenario.Scrape(addr)
			if err != nil {
				t.Fatal(err)
			}
			return sumMetric(text, `reprieve_metadata_polls_total{outcome="ok",provider="none"}`)
		}
		seen := polls()
		waitFor(ctx, t, "three more polls", func() bool { return polls() >= seen+3 })
		if r := obs.Records(); !r["due"].DeletedAt.IsZero() || !r["tolerates"].DeletedAt.IsZero() {
			t.Errorf("pods evicted for a deadline a year away: %+v", r)
		}
		if got := requests(t, addr); got != 0 {
			t.Errorf("%v eviction requests for a deadline a year away", got)
		}
		if !strings.Contains(logTail(200), "Deadline further away than --maintenance-lead") {
			t.Error("no log line for the far deadline")
		}
	})

	t.Run("moves earlier", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		obs, _, addr := start(ctx, t, "earlier")
		setDeadline(ctx, t, "earlier-node", time.Now().Add(90*time.Second).UTC().Format(time.RFC3339))
		waitNode(ctx, t, "earlier-node", "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
		// The cloud corrects itself: the machine goes sooner. "due" is evicted at once either
		// way; "tolerates" (20 s) must now leave by the new window's end, 25 s away.
		deadline := time.Now().Add(30 * time.Second).UTC().Truncate(time.Second)
		setDeadline(ctx, t, "earlier-node", deadline.Format(time.RFC3339))
		end := deadline.Add(-cfg.SafetyMargin)
		waitHandled(ctx, t, "earlier-node", end)
		r := obs.Records()
		for _, name := range []string{"due", "tolerates"} {
			if r[name].GoneAt.IsZero() || r[name].GoneAt.After(end) {
				t.Errorf("%s gone at %v, want by the new window's end %v", name, r[name].GoneAt, end)
			}
		}
		if got := requests(t, addr); got != 2 {
			t.Errorf("%v accepted eviction or delete requests for 2 pods after the deadline moved", got)
		}
	})

	t.Run("two notices", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		srv := azureevents.New("two-node")
		url, err := srv.Start("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		now := time.Now()
		later, sooner := now.Add(50*time.Second).Truncate(time.Second), now.Add(40*time.Second).Truncate(time.Second)
		srv.AddEvent(azureevents.Event{EventType: azureevents.EventTypePreempt, Resources: []string{"two-node"}, NotBefore: later, DurationInSeconds: -1})
		srv.AddEvent(azureevents.Event{EventType: azureevents.EventTypeReboot, Resources: []string{"two-node"}, NotBefore: sooner, DurationInSeconds: -1})
		_, logTail, _ := start(ctx, t, "two", "--provider=azure", "--azure-imds-endpoint="+url, "--azure-resource-name=two-node")
		n := waitNode(ctx, t, "two-node", "the interruption taint", func(n *v1.Node) bool { return hasTaint(n, taint.Key, taint.Effect) })
		if got := n.Annotations[record.AnnotationReclaimDeadline]; got != sooner.UTC().Format(time.RFC3339) {
			t.Errorf("deadline annotation %q, want the earlier notice's %s", got, sooner.UTC().Format(time.RFC3339))
		}
		if c := strings.Count(taintKeys(n), taint.Key+":"); c != 1 {
			t.Errorf("interruption taint %d times for two notices: %v", c, n.Spec.Taints)
		}
		if c := strings.Count(logTail(200), `"Notice received"`); c != 2 {
			t.Errorf("%d 'Notice received' log lines, want one per notice", c)
		}
		// One event per notice, each with its kind's reason: Preempt is a preemption, Reboot a
		// scheduled maintenance. Events are written in the background (the recorder's
		// broadcaster): under load the second came after the taint, so wait for two.
		var evs []string
		_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			evs = noticeEvents(ctx, t, "two-node")
			return len(evs) >= 2, nil
		})
		slices.Sort(evs)
		if len(evs) != 2 || !strings.HasPrefix(evs[0], events.ReasonPreemption+": ") || !strings.HasPrefix(evs[1], events.ReasonScheduledMaintenance+": ") {
			t.Errorf("notice events %q; want one Preemption and one ScheduledMaintenance", evs)
		}
	})
}

func taintKeys(n *v1.Node) string {
	var b strings.Builder
	for _, t := range n.Spec.Taints {
		b.WriteString(t.Key + ":" + string(t.Effect) + " ")
	}
	return b.String()
}
