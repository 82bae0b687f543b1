package interrupt

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/reprieve-dev/reprieve/providers"
)

// answers holds what the provider's sources said since this process started, one source at a
// time: a source that has not answered positively yet is unknown, not "none", and what the
// node's record holds for it stays in force. It is owned by the loop's mutex.
type answers struct {
	provider string
	// reporter, when the provider has one, says which of its sources have answered.
	reporter providers.SourceReporter
	// ok is set once a poll or a watch update came back without an error: a provider without
	// a SourceReporter is one source, answered from then on.
	ok bool
	// notices is the provider's last report (each failed source keeps its last good answer).
	notices []providers.Notice
	// attempted is set once the provider was asked (for readiness).
	attempted bool
	// lastOK is when a poll or a watch update last came back without an error: the one
	// source's last answer of a provider without AnswerTimes.
	lastOK time.Time
	// times, when the provider has them, says when each source last answered.
	times providers.AnswerTimes
}

func newAnswers(p providers.Provider) *answers {
	a := &answers{provider: p.Name()}
	if r, ok := p.(providers.SourceReporter); ok {
		a.reporter = r
	}
	if t, ok := p.(providers.AnswerTimes); ok {
		a.times = t
	}
	return a
}

// record takes one report of the provider, made at now.
func (a *answers) record(notices []providers.Notice, err error, now time.Time) {
	a.attempted = true
	if err == nil {
		a.ok = true
		a.lastOK = now
	}
	if err != nil && notices == nil && a.notices != nil {
		// A failed poll that reports nothing keeps the previous report.
		return
	}
	a.notices = sourced(notices, a.provider)
}

// answered reports, for every source of the provider, whether it has answered since start.
func (a *answers) answered() map[string]bool {
	if a.reporter != nil {
		m := maps.Clone(a.reporter.Answered())
		if m == nil {
			m = map[string]bool{}
		}
		return m
	}
	return map[string]bool{a.provider: a.ok}
}

// lastAnswers says when each source of the provider last gave a good answer (zero: not since
// start). A provider with AnswerTimes speaks for its sources (those of answered, when it has a
// SourceReporter); any other is one source, answered at the last report without an error.
func (a *answers) lastAnswers() map[string]time.Time {
	if a.times == nil {
		return map[string]time.Time{a.provider: a.lastOK}
	}
	got := a.times.LastAnswers()
	if a.reporter == nil {
		return got // its sources are the ones it names
	}
	out := make(map[string]time.Time, len(got))
	for src := range a.answered() {
		out[src] = got[src]
	}
	return out
}

// sourced fills in the source of notices from providers that name none: the provider itself,
// as one source.
func sourced(ns []providers.Notice, provider string) []providers.Notice {
	out := slices.Clone(ns)
	for i := range out {
		if out[i].Source == "" {
			out[i].Source = provider
		}
	}
	return out
}

// InForce merges the provider's report with the notices the node's record holds: each source
// that has answered since start speaks for itself (its notices, re-anchored on the first-seen
// time the record holds, so that a restart never moves a deadline or a countdown later); a
// source that has not keeps what the record holds for it. A recorded notice whose source is not
// known to the provider (a record written before sources were recorded) stays until every
// source has answered. It is pure.
func InForce(reported []providers.Notice, answered map[string]bool, recorded []providers.Notice) []providers.Notice {
	all := true
	for _, ok := range answered {
		all = all && ok
	}
	var out []providers.Notice
	used := map[int]bool{}
	for _, n := range reported {
		if !answered[n.Source] {
			continue // an unanswered source's last report is what the record holds (below)
		}
		if i := match(n, recorded); i >= 0 {
			used[i] = true
			r := recorded[i]
			// A deadline at the moment this process first saw the notice (an Azure event seen
			// already Started: due at once) is this process's clock too: the record's earlier
			// one stands.
			atFirstSight := !n.Deadline.IsZero() && !n.NoticeTime.IsZero() && !n.Deadline.After(n.NoticeTime.Add(time.Second))
			// A notice restored from the taint and the deadline annotation (the record did not
			// decode) bounds a deadline this process counts from its own first sight: that
			// deadline was first seen by an earlier process (issue 38, case 3).
			restored := r.ID == restoredID && n.FromFirstSeen
			n = n.Reanchor(r.NoticeTime)
			if (atFirstSight || restored) && !r.Deadline.IsZero() && r.Deadline.Before(n.Deadline) {
				n.Deadline = r.Deadline
			}
			if r.Source != "" {
				n.ID = r.ID // the ID the node's record and the events already carry
			}
		}
		out = append(out, n)
	}
	for i, r := range recorded {
		if used[i] {
			continue
		}
		ok, known := answered[r.Source]
		if ok || (!known && all) {
			continue // its source answered without it: withdrawn
		}
		// Unknown: the source has not answered since start. What it said before stands.
		out = append(out, r)
	}
	providers.Sort(out)
	return out
}

// match returns the index in ns of the notice that is n in another process's report: the same
// source and ID; or, for a notice whose ID and deadline count from when a process first saw it
// (FromFirstSeen, as GCP's preempted and maintenance-event values), the same source, kind and
// action; or, for a notice of no known source, the same kind. -1 when none.
func match(n providers.Notice, ns []providers.Notice) int {
	for i, r := range ns {
		if r.Source == n.Source && r.ID == n.ID {
			return i
		}
	}
	for i, r := range ns {
		if (r.FromFirstSeen || n.FromFirstSeen) && r.Source == n.Source && r.Kind == n.Kind && r.Action == n.Action {
			return i
		}
	}
	// A record written before sources were recorded (only the taint and the deadline
	// annotation): the same kind.
	for i, r := range ns {
		if (r.Source == "" || n.Source == "") && r.Kind == n.Kind {
			return i
		}
	}
	// A notice restored from the interruption taint when the record does not decode: its kind
	// is not known (the fallback calls it a spot interruption), so it is any notice that
	// interrupts, or a GPU VM's maintenance would never pair with it.
	for i, r := range ns {
		if r.ID == restoredID && r.Source == "" && r.Interrupts() && n.Interrupts() {
			return i
		}
	}
	return -1
}

// Stale lists, sorted, the sources whose last good answer (last, as LastAnswers gives it) is
// older than bound at now, or that have not answered since start, each with how long it has
// been silent ("no answer since start" for the latter). Empty when every source has answered within bound.
func Stale(last map[string]time.Time, now time.Time, bound time.Duration) []string {
	var out []string
	for _, src := range slices.Sorted(maps.Keys(last)) {
		t := last[src]
		switch {
		case t.IsZero():
			out = append(out, src+" (no answer since start)")
		case now.Sub(t) > bound:
			out = append(out, fmt.Sprintf("%s (last answer %s ago)", src, now.Sub(t).Round(time.Second)))
		}
	}
	return out
}
