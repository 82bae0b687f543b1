package main

import (
	"math"
	"slices"
	"time"
)

// Which pods a window could never have saved, given the seats the server had.
//
// The model: every pod of the pool is due at the notice t0 and asks for one eviction, whose
// acceptance at a leaves the pod min(grace, end - a) of grace; the pod keeps its whole grace
// (its budget) when the eviction is accepted by its last safe moment L = end - grace, and is
// gone in time at all when it is accepted by end - 1 s (a 1 s grace, the agent's last chance).
// The server accepts at most C evictions a second for the whole fleet, whoever sends them.
// Serving one eviction is a unit job on one machine of speed C, all released at t0.
//
// The best any order could do, first for the pods gone in time, then for the budgets kept:
//
//   - at most floor(C x (end - 1 s - t0)) pods are gone in time, whatever the order;
//   - the largest set of pods whose budget can be kept is what earliest-deadline-first by L
//     finds when it skips every pod it would serve past its L (for unit jobs released
//     together, Moore and Hodgson's algorithm reduces to this: every job has the same length,
//     so dropping the late one is as good as dropping any);
//   - those are served first, back to back from t0, and the skipped pods fill the slots left
//     before end - 1 s, with their grace cut. So the pods lost, if any, can all be pods whose
//     budget the window could never have met.
//
// A pod is therefore "feasible at C" when it is in that set. Pods of one grace share L, so the
// set is defined by its count per grace, which is what feasibleAt returns. A run's pods lost
// though feasible are, per grace, the lost pods beyond the infeasible ones.

// feasibleAt returns, per grace, how many of the pods (their graces) keep their whole budget
// in the best order at c evictions a second, and how many can be gone in time at all.
func feasibleAt(graces []int64, window time.Duration, c float64) (perGrace map[int64]int, inTime int) {
	perGrace = map[int64]int{}
	if c <= 0 || window <= 0 {
		return perGrace, 0
	}
	sorted := slices.Clone(graces)
	// Earliest L = end - grace first: the longest grace first.
	slices.SortFunc(sorted, func(a, b int64) int { return int(b - a) })
	served := 0
	for _, g := range sorted {
		l := window - time.Duration(g)*time.Second // the pod's L, from t0
		if float64(served+1)/c <= l.Seconds() {
			perGrace[g]++
			served++
		}
	}
	last := (window - time.Second).Seconds()
	if last <= 0 {
		return perGrace, 0
	}
	return perGrace, min(len(graces), int(math.Floor(c*last)))
}

// lostThoughFeasible is, summed over the graces, the pods lost beyond the ones whose budget
// could never have been met: lost[g] - (pods[g] - feasible[g]), where positive.
func lostThoughFeasible(pods, lost, feasible map[int64]int) int {
	n := 0
	for g, l := range lost {
		if extra := l - (pods[g] - feasible[g]); extra > 0 {
			n += extra
		}
	}
	return n
}

// acceptRate is the evictions a second the fleet got accepted. When some pod's eviction was
// not accepted by end, the server was saturated the whole window (its queue never ran dry), so
// it is the pods accepted by end over the window; when every pod was accepted by end, it is
// those over the time to the last acceptance, a lower bound of the capacity.
func acceptRate(accepted []time.Time, notice, end time.Time) float64 {
	var n int
	var last time.Time
	for _, a := range accepted {
		if a.IsZero() || a.After(end) {
			continue
		}
		n++
		if a.After(last) {
			last = a
		}
	}
	if n < len(accepted) {
		last = end
	}
	d := last.Sub(notice).Seconds()
	if n == 0 || d <= 0 {
		return 0
	}
	return float64(n) / d
}
