package gcp

import (
	"context"
	"maps"
	"net/http"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/reprieve-dev/reprieve/providers"
)

var (
	_ providers.SourceReporter = (*Provider)(nil)
	_ providers.AnswerTimes    = (*Provider)(nil)
)

func wantAnswered(t *testing.T, p *Provider, step string, preempted, maintenance, upcoming bool) {
	t.Helper()
	want := map[string]bool{PathPreempted: preempted, PathMaintenanceEvent: maintenance, PathUpcomingMaintenance: upcoming}
	if got := p.Answered(); !maps.Equal(got, want) {
		t.Errorf("%s: Answered() = %v, want %v", step, got, want)
	}
}

// TestAnsweredPoll: each notice path is answered on its own. A 404 on preempted or
// maintenance-event is a wrong endpoint (errNotDefined), not "no notice": no answer. A 404 on
// upcoming-maintenance is GCE's "none scheduled": an answer.
func TestAnsweredPoll(t *testing.T) {
	s := startFake(t, map[string]string{PathMaintenanceEvent: ""}) // maintenance-event 404
	// 403, not 503: the library retries a 5xx for seconds, and the kind of failure does not
	// matter here.
	s.SetError(PathPreempted, http.StatusForbidden, 100)
	p := newProvider(t, s, clocktesting.NewFakePassiveClock(t0))
	wantAnswered(t, p, "before any poll", false, false, false)

	if _, err := p.Poll(context.Background()); err == nil {
		t.Fatal("poll with preempted failing: no error")
	}
	wantAnswered(t, p, "preempted 403, maintenance-event 404, upcoming 404", false, false, true)

	s.SetError(PathPreempted, 0, 0)
	s.Set(PathMaintenanceEvent, "<html>oops</html>") // malformed: no answer
	if _, err := p.Poll(context.Background()); err == nil {
		t.Fatal("malformed maintenance-event: no error")
	}
	wantAnswered(t, p, "preempted FALSE, maintenance-event malformed", true, false, true)

	s.Set(PathMaintenanceEvent, "REBOOT_ON_HOST_MAINTENANCE") // a value GCE added: recorded
	if _, err := p.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantAnswered(t, p, "every source answered", true, true, true)

	// Since creation: a later failure keeps the answer (and Poll the last good value).
	s.SetError(PathPreempted, http.StatusForbidden, 100)
	if _, err := p.Poll(context.Background()); err == nil {
		t.Fatal("preempted 403: no error")
	}
	wantAnswered(t, p, "preempted fails again", true, true, true)
}

// TestLastAnswers: each source's last good answer, for readiness. A hanging GET that returns
// the same value is an answer too: the watch publishes only changes, so without the time the
// agent would take a quiet VM for a blind one.
func TestLastAnswers(t *testing.T) {
	s := startFake(t, nil)
	clk := clocktesting.NewFakePassiveClock(t0)
	p := newProvider(t, s, clk)
	if got := p.LastAnswers(); !got[PathPreempted].IsZero() || len(got) != 3 {
		t.Errorf("before any poll: LastAnswers() = %v, want three zero times", got)
	}
	if _, err := p.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(t0.Add(time.Minute))
	s.SetError(PathPreempted, http.StatusForbidden, 100)
	if _, err := p.Poll(context.Background()); err == nil {
		t.Fatal("preempted 403: no error")
	}
	got := p.LastAnswers()
	if !got[PathPreempted].Equal(t0) || !got[PathMaintenanceEvent].Equal(t0.Add(time.Minute)) || !got[PathUpcomingMaintenance].Equal(t0.Add(time.Minute)) {
		t.Errorf("LastAnswers() = %v: want preempted at t0 (its last good answer), the others a minute later", got)
	}
}

// TestAnsweredWatch: Watch's hanging GETs report answers as Poll's reads do, per path.
func TestAnsweredWatch(t *testing.T) {
	s := startFake(t, nil)
	s.SetError(PathMaintenanceEvent, http.StatusForbidden, 1<<30)
	p := newProvider(t, s, clocktesting.NewFakePassiveClock(t0))
	w := startWatch(t, p)
	w.rec.next(t, "the first update, with the failing source", func(u update) bool { return u.err != nil })
	wantAnswered(t, p, "maintenance-event failing", true, false, true)

	s.SetError(PathMaintenanceEvent, 0, 0)
	s.Set(PathPreempted, PreemptedTrue)
	w.rec.next(t, "the preemption, and no error", func(u update) bool { return hasKind(providers.KindPreemption)(u) })
	wantAnswered(t, p, "every source answered", true, true, true)
}

// TestNoticeSourceAndFirstSeen: every notice names its path; the deadlines GCE gives no time
// for (preempted + 30 s, TERMINATE without a window + the notice) are marked FromFirstSeen, and
// a restart that knows the first sighting puts them back: 10 s into a preemption the deadline
// stays T+30 s, not T+40 s (issue 20, case 3).
func TestNoticeSourceAndFirstSeen(t *testing.T) {
	type want struct {
		source        string
		fromFirstSeen bool
	}
	tests := []struct {
		name   string
		values map[string]string
		want   map[string]want // by action
	}{
		{"preempted", map[string]string{PathPreempted: PreemptedTrue},
			map[string]want{actionPreempt: {PathPreempted, true}}},
		{"terminate without a window", map[string]string{PathMaintenanceEvent: MaintenanceTerminate},
			map[string]want{actionTerminateMaintenance: {PathMaintenanceEvent, true}}},
		{"terminate with a window", withWindow(map[string]string{PathMaintenanceEvent: MaintenanceTerminate, PathOnHostMaintenance: "TERMINATE"}, "2026-11-29T10:50:00Z"),
			map[string]want{actionTerminateMaintenance: {PathMaintenanceEvent, false}, "upcoming-maintenance scheduled pending": {PathUpcomingMaintenance, false}}},
		{"migrate", map[string]string{PathMaintenanceEvent: MaintenanceMigrate},
			map[string]want{actionMigrateMaintenance: {PathMaintenanceEvent, false}}},
		{"unknown maintenance value", map[string]string{PathMaintenanceEvent: "REBOOT_ON_HOST_MAINTENANCE"},
			map[string]want{"reboot-on-host-maintenance": {PathMaintenanceEvent, false}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startFake(t, tc.values)
			p := newProvider(t, s, clocktesting.NewFakePassiveClock(t0))
			ns, err := p.Poll(context.Background())
			checkErr(t, err, "")
			if len(ns) != len(tc.want) {
				t.Fatalf("got %q, want %d notices", summaries(ns), len(tc.want))
			}
			for _, n := range ns {
				w, ok := tc.want[n.Action]
				if !ok {
					t.Fatalf("unexpected notice %s", summary(n))
				}
				if n.Source != w.source || n.FromFirstSeen != w.fromFirstSeen {
					t.Errorf("%s: Source %q, FromFirstSeen %v; want %q, %v", n.Action, n.Source, n.FromFirstSeen, w.source, w.fromFirstSeen)
				}
			}
		})
	}

	// The restart of case 3: the previous process saw preempted=TRUE at t0, this one starts 10 s
	// later.
	s := startFake(t, map[string]string{PathPreempted: PreemptedTrue})
	p := newProvider(t, s, clocktesting.NewFakePassiveClock(t0.Add(10*time.Second)))
	ns, err := p.Poll(context.Background())
	checkErr(t, err, "")
	if len(ns) != 1 || !ns[0].Deadline.Equal(t0.Add(40*time.Second)) {
		t.Fatalf("got %q, want this process's own deadline, 10:00:40", summaries(ns))
	}
	if r := ns[0].Reanchor(t0); !r.Deadline.Equal(t0.Add(preemptGrace)) || !r.NoticeTime.Equal(t0) {
		t.Errorf("reanchored: %s, want deadline 10:00:30 noticed 10:00:00", summary(r))
	}
}
