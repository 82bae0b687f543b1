package aws

import (
	"maps"
	"net/http"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/providers"
)

var (
	_ providers.SourceReporter = (*Provider)(nil)
	_ providers.AnswerTimes    = (*Provider)(nil)
)

// TestAnswered: each path is answered on its own, once IMDS gave it a 200 that parsed or a 404
// (nothing pending). A path that only failed is unknown, whatever the others said: a
// rebalance answer after a restart says nothing of spot/instance-action (issue 20, case 1).
func TestAnswered(t *testing.T) {
	e := newPollEnv(t)
	want := func(step string, spot, rebalance, scheduled bool) {
		t.Helper()
		w := map[string]bool{PathSpotInstanceAction: spot, PathRebalance: rebalance, PathScheduledEvents: scheduled}
		if got := e.p.Answered(); !maps.Equal(got, w) {
			t.Errorf("%s: Answered() = %v, want %v", step, got, w)
		}
	}
	want("before any poll", false, false, false)

	// The token PUT fails: no source was asked.
	e.imds.set(imdsTokenPath, http.StatusInternalServerError, "Internal Server Error")
	if _, err := e.poll(t); err == nil {
		t.Fatal("poll without a token: no error")
	}
	want("token refused", false, false, false)
	e.imds.script(imdsTokenPath) // the fake's own token handler again

	// The partial answer of the issue: rebalance answers, spot/instance-action fails.
	e.imds.setFile(PathRebalance, "rebalance.json")
	e.imds.set(PathSpotInstanceAction, http.StatusInternalServerError, "Internal Server Error")
	e.imds.setFile(PathScheduledEvents, "scheduled_bad_time.json") // 200 that does not parse
	if _, err := e.poll(t); err == nil {
		t.Fatal("partial answer: no error")
	}
	want("rebalance answered, spot 500, scheduled undatable", false, true, false)

	// 404 is a positive "none".
	e.imds.notFound(PathSpotInstanceAction)
	e.imds.setFile(PathScheduledEvents, "scheduled_active.json")
	if _, err := e.poll(t); err != nil {
		t.Fatal(err)
	}
	want("spot 404, scheduled parsed", true, true, true)

	// Answered is since the provider was created: a later failure does not take it back (Poll
	// keeps that source's last good answer).
	e.clk.Step(time.Second)
	e.imds.set(PathSpotInstanceAction, http.StatusServiceUnavailable, "Service Unavailable")
	if _, err := e.poll(t); err == nil {
		t.Fatal("spot 503: no error")
	}
	want("spot 503 after a 404", true, true, true)

	// The map is a copy.
	e.p.Answered()[PathRebalance] = false
	want("after editing a returned map", true, true, true)

	// Readiness goes by when each path last answered: spot/instance-action's last good answer
	// is the poll before its 503, the others' the poll at its time.
	last := e.p.LastAnswers()
	if !last[PathSpotInstanceAction].Equal(e.clk.Now().Add(-time.Second)) || !last[PathRebalance].Equal(e.clk.Now()) || !last[PathScheduledEvents].Equal(e.clk.Now()) {
		t.Errorf("LastAnswers() = %v at %v: want spot/instance-action a second earlier, the others now", last, e.clk.Now())
	}
}

// TestNoticeSourceAndFirstSeen: every notice names the path that raised it; only a hibernation
// moved to its first sighting has a deadline counted from NoticeTime.
func TestNoticeSourceAndFirstSeen(t *testing.T) {
	e := newPollEnv(t)
	e.imds.setFile(PathSpotInstanceAction, "spot_terminate.json")
	e.imds.setFile(PathRebalance, "rebalance.json")
	e.imds.setFile(PathScheduledEvents, "scheduled_active.json")
	ns, err := e.poll(t)
	checkErr(t, err, "")
	got := map[providers.Kind]providers.Notice{}
	for _, n := range ns {
		got[n.Kind] = n
	}
	for kind, src := range map[providers.Kind]string{
		providers.KindSpotInterruption:        PathSpotInstanceAction,
		providers.KindRebalanceRecommendation: PathRebalance,
		providers.KindScheduledMaintenance:    PathScheduledEvents,
	} {
		n, ok := got[kind]
		if !ok {
			t.Fatalf("no %s notice in %q", kind, summaries(ns))
		}
		if n.Source != src {
			t.Errorf("%s: Source = %q, want %q", kind, n.Source, src)
		}
		if n.FromFirstSeen {
			t.Errorf("%s: FromFirstSeen, but the payload gives its deadline", kind)
		}
	}

	h := newPollEnv(t)
	h.imds.set(PathSpotInstanceAction, http.StatusOK, `{"action": "hibernate", "time": "`+t0.Add(2*time.Minute).Format(time.RFC3339)+`"}`)
	ns, err = h.poll(t)
	checkErr(t, err, "")
	if len(ns) != 1 || !ns[0].FromFirstSeen || ns[0].Source != PathSpotInstanceAction {
		t.Fatalf("hibernate: got %+v, want one notice from %s with FromFirstSeen", ns, PathSpotInstanceAction)
	}
	// Another process saw it 20 s earlier: the deadline is that sighting, not this one.
	if r := ns[0].Reanchor(t0.Add(-20 * time.Second)); !r.Deadline.Equal(t0.Add(-20 * time.Second)) {
		t.Errorf("reanchored hibernation deadline %s, want the earlier sighting %s", rfc3339(r.Deadline), rfc3339(t0.Add(-20*time.Second)))
	}

	past := newPollEnv(t)
	past.imds.set(PathSpotInstanceAction, http.StatusOK, `{"action": "hibernate", "time": "`+t0.Add(-5*time.Second).Format(time.RFC3339)+`"}`)
	if ns, err := past.poll(t); err != nil || len(ns) != 1 || ns[0].FromFirstSeen {
		t.Errorf("hibernate with a time already past: got %+v, %v; want the document's deadline, not FromFirstSeen", ns, err)
	}
}
