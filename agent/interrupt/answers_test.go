package interrupt

import (
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/providers"
	"github.com/reprieve-dev/reprieve/providers/providertest"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func notice(source, id string, kind providers.Kind, seen time.Time, lead time.Duration, fromFirstSeen bool) providers.Notice {
	return providers.Notice{Provider: "p", Source: source, ID: id, Kind: kind, NoticeTime: seen, Deadline: seen.Add(lead), FromFirstSeen: fromFirstSeen}
}

func TestInForce(t *testing.T) {
	spot := notice("spot", "s1", providers.KindSpotInterruption, t0, 2*time.Minute, false)
	rebal := notice("rebalance", "r1", providers.KindRebalanceRecommendation, t0, 0, false)
	rebal.Deadline = time.Time{}
	preempt := notice("preempted", "first", providers.KindPreemption, t0, 30*time.Second, true)
	legacy := providers.Notice{Provider: "p", Kind: providers.KindSpotInterruption, ID: "restored-from-node", Deadline: t0.Add(time.Minute)}
	for _, tc := range []struct {
		name     string
		reported []providers.Notice
		answered map[string]bool
		recorded []providers.Notice
		want     []string // ID@deadline
	}{
		{name: "unanswered source keeps the record", reported: []providers.Notice{rebal},
			answered: map[string]bool{"spot": false, "rebalance": true}, recorded: []providers.Notice{spot, rebal},
			want: []string{"s1@12:02:00", "r1@"}},
		{name: "answered source withdraws", reported: []providers.Notice{rebal},
			answered: map[string]bool{"spot": true, "rebalance": true}, recorded: []providers.Notice{spot, rebal},
			want: []string{"r1@"}},
		{name: "first-seen deadline re-anchored on the record", answered: map[string]bool{"preempted": true},
			reported: []providers.Notice{notice("preempted", "second", providers.KindPreemption, t0.Add(10*time.Second), 30*time.Second, true)},
			recorded: []providers.Notice{preempt}, want: []string{"first@12:00:30"}},
		{name: "a later first sight of the same value keeps the earlier", answered: map[string]bool{"spot": true},
			reported: []providers.Notice{notice("spot", "s1", providers.KindSpotInterruption, t0.Add(5*time.Second), 115*time.Second, false)},
			recorded: []providers.Notice{spot}, want: []string{"s1@12:02:00"}},
		{name: "a deadline at first sight keeps the record's earlier one", answered: map[string]bool{"scheduledevents": true},
			reported: []providers.Notice{{Provider: "azure", Source: "scheduledevents", ID: "evt", Kind: providers.KindPreemption,
				NoticeTime: t0.Add(20 * time.Second), Deadline: t0.Add(20 * time.Second)}},
			recorded: []providers.Notice{{Provider: "azure", Source: "scheduledevents", ID: "evt", Kind: providers.KindPreemption,
				NoticeTime: t0, Deadline: t0.Add(5 * time.Second)}}, want: []string{"evt@12:00:05"}},
		{name: "a record of no source stays until every source answered", reported: nil,
			answered: map[string]bool{"spot": false, "rebalance": true}, recorded: []providers.Notice{legacy},
			want: []string{"restored-from-node@12:01:00"}},
		{name: "a record of no source goes once all answered", reported: nil,
			answered: map[string]bool{"spot": true, "rebalance": true}, recorded: []providers.Notice{legacy}, want: nil},
		{name: "nothing recorded, nothing answered", answered: map[string]bool{"spot": false}, want: nil},
		// Issue 38, case 3: the record does not decode (a hand edit, a rollback) and the agent
		// restarts 56 minutes into a GPU VM's maintenance, counted from first sight (GCP's
		// maintenance-event). What the taint and the deadline annotation say pairs with it,
		// whatever its kind: its deadline is not moved to an hour from the restart.
		{name: "a notice restored from the taint keeps a first-seen deadline", answered: map[string]bool{"maintenance": true},
			reported: []providers.Notice{notice("maintenance", "maint", providers.KindScheduledMaintenance, t0.Add(56*time.Minute), time.Hour, true)},
			recorded: []providers.Notice{{Provider: "p", Kind: providers.KindSpotInterruption, ID: restoredID, NoticeTime: t0, Deadline: t0.Add(time.Hour)}},
			want:     []string{"maint@13:00:00"}},
		{name: "a restored notice with no countdown anchor still bounds a first-seen deadline", answered: map[string]bool{"maintenance": true},
			reported: []providers.Notice{notice("maintenance", "maint", providers.KindScheduledMaintenance, t0.Add(56*time.Minute), time.Hour, true)},
			recorded: []providers.Notice{legacy}, want: []string{"maint@12:01:00"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := InForce(tc.reported, tc.answered, tc.recorded)
			var ids []string
			for _, n := range got {
				d := ""
				if !n.Deadline.IsZero() {
					d = n.Deadline.UTC().Format("15:04:05")
				}
				ids = append(ids, n.ID+"@"+d)
			}
			if len(ids) != len(tc.want) {
				t.Fatalf("in force %v, want %v", ids, tc.want)
			}
			for i := range ids {
				if ids[i] != tc.want[i] {
					t.Fatalf("in force %v, want %v", ids, tc.want)
				}
			}
		})
	}
}

// TestAnswersOneSource: a provider without a SourceReporter is one source, answered from its
// first report without an error; a failed report that says nothing keeps the previous one.
func TestAnswersOneSource(t *testing.T) {
	a := &answers{provider: "p"}
	if a.answered()["p"] {
		t.Fatal("answered before any report")
	}
	a.record([]providers.Notice{{ID: "x"}}, nil, time.Time{})
	a.record(nil, errTest, time.Time{})
	if !a.answered()["p"] || len(a.notices) != 1 || a.notices[0].Source != "p" {
		t.Fatalf("answered %v notices %+v: want answered, the first report kept under source p", a.answered(), a.notices)
	}
}

type testErr string

func (e testErr) Error() string { return string(e) }

const errTest = testErr("boom")

// timesOnly is a provider that says when its sources last answered (providers.AnswerTimes)
// but is no SourceReporter; timesAndSources is both.
type timesOnly struct {
	providers.Provider
	last map[string]time.Time
}

func (p timesOnly) LastAnswers() map[string]time.Time { return p.last }

type timesAndSources struct{ timesOnly }

func (p timesAndSources) Answered() map[string]bool {
	return map[string]bool{"a": !p.last["a"].IsZero(), "b": !p.last["b"].IsZero()}
}

// TestLastAnswers: a provider without AnswerTimes is one source, answered at its last report
// without an error; one with AnswerTimes speaks for its sources, those of Answered when it has
// a SourceReporter (no phantom source named after the provider).
func TestLastAnswers(t *testing.T) {
	plain := newAnswers(providertest.New("aws"))
	plain.record(nil, errTest, t0)
	plain.record(nil, nil, t0.Add(time.Second))
	plain.record(nil, errTest, t0.Add(2*time.Second))
	if got := plain.lastAnswers(); len(got) != 1 || !got["aws"].Equal(t0.Add(time.Second)) {
		t.Errorf("one source: lastAnswers() = %v, want aws at its last good report", got)
	}
	last := map[string]time.Time{"a": t0, "b": {}, "extra": t0}
	base := timesOnly{Provider: providertest.New("gcp"), last: last}
	if got := newAnswers(base).lastAnswers(); len(got) != 3 || !got["a"].Equal(t0) || !got["b"].IsZero() {
		t.Errorf("AnswerTimes alone: lastAnswers() = %v, want its own three sources", got)
	}
	if got := newAnswers(timesAndSources{base}).lastAnswers(); len(got) != 2 || !got["a"].Equal(t0) || !got["b"].IsZero() {
		t.Errorf("with a SourceReporter: lastAnswers() = %v, want the sources of Answered, a and b", got)
	}
}
