package replay

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Result is how one replay went, against its label.
type Result struct {
	Series *Series
	// Actions are reprieve's evictions and grace cuts, in order.
	Actions []Action
	// Unwanted counts the pods reprieve evicted that the kubelet did not: on a healthy series,
	// every one (goal 0).
	Unwanted int
	// Kubelet counts the kubelet's evictions (the label); of those, Whole reprieve made first
	// with the grace the kubelet's rule gives the pod (its own at a hard threshold,
	// min(evictionMaxPodGracePeriod, its own) at a soft one; a terminating pod's cut so that it
	// ends before the kubelet's eviction); Cut it made first with less, CutBy the seconds
	// short of that in all; Missed not at all (the kubelet came first).
	Kubelet, Whole, Cut, Missed int
	CutBy                       time.Duration
	// Leads are, for each of the kubelet's evictions reprieve made first, how long before the
	// kubelet's reprieve evicted the pod: the timeliness beside Unwanted's precision.
	Leads []time.Duration
	// Tainted is how long the node carried a pressure taint of reprieve's.
	Tainted time.Duration
}

// score compares reprieve's actions with the kubelet's evictions of the label. A pod reprieve
// evicted at t with grace g ends at t + g; the kubelet would have evicted it at its label's
// time k, so it had min(g, k - t) of grace from reprieve before the kubelet's own cut, and none
// when t >= k.
func score(s *Series, actions []Action, tainted time.Duration) *Result {
	res := &Result{Series: s, Actions: actions, Tainted: tainted, Kubelet: len(s.KubeletEvictions)}
	first := map[string]Action{}
	var order []string
	for _, a := range actions {
		if _, ok := first[a.Pod]; !ok {
			first[a.Pod] = a
			order = append(order, a.Pod)
		}
	}
	labelled := map[string]KubeletEviction{}
	for _, e := range s.KubeletEvictions {
		if _, ok := labelled[e.Pod]; !ok {
			labelled[e.Pod] = e
		}
	}
	for _, pod := range order {
		if _, ok := labelled[pod]; !ok {
			res.Unwanted++
		}
	}
	for _, e := range s.KubeletEvictions {
		a, ok := first[e.Pod]
		k := time.Duration(e.AtMs) * time.Millisecond
		if !ok || a.At >= k {
			res.Missed++
			continue
		}
		res.Leads = append(res.Leads, k-a.At)
		// The kubelet's rule: the pod's own grace at a hard threshold, the soft eviction's at a
		// soft one; a terminating pod (cut, not evicted) has its grace cut by the kubelet too,
		// so ending before the kubelet's eviction is the whole of what it can have.
		want := a.PodGrace
		if e.Soft {
			want = time.Duration(e.Grace) * time.Second
		}
		got := min(a.Grace, k-a.At)
		switch {
		case a.Delete && a.At+a.Grace <= k, got >= want:
			res.Whole++
		default:
			res.Cut++
			res.CutBy += want - got
		}
	}
	return res
}

// Kind is "healthy" or "falling".
func (r *Result) Kind() string {
	if r.Series.Healthy() {
		return "healthy"
	}
	return "falling"
}

// Row is r as a row of the replay table (Header).
func (r *Result) Row() string {
	var acts []string
	for _, a := range r.Actions {
		verb := ""
		if a.Delete {
			verb = " cut"
		}
		acts = append(acts, fmt.Sprintf("%s%s at %.0f s with %.0f/%.0f s", a.Pod, verb, a.At.Seconds(), a.Grace.Seconds(), a.PodGrace.Seconds()))
	}
	what := strings.Join(acts, "; ")
	if what == "" {
		what = "none"
	}
	var kub []string
	for _, e := range r.Series.KubeletEvictions {
		kub = append(kub, fmt.Sprintf("%s at %.0f s", e.Pod, float64(e.AtMs)/1000))
	}
	label := strings.Join(kub, "; ")
	if label == "" {
		label = "none"
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %d | %d | %d (%.0f s) | %d | %s | %s | %s |", r.Series.Name, r.Series.Origin, r.Kind(),
		fmtDuration(r.Series.Duration()), r.Unwanted, r.Whole, r.Cut, r.CutBy.Seconds(), r.Missed, fmtLeads(r.Leads), fmtDuration(r.Tainted),
		label+" / "+what)
}

// Header is the replay table's header.
const Header = "| series | origin | kind | length | evictions the kubelet would not make | the kubelet's, made first with the whole grace | made first, grace cut (seconds cut) | missed (the kubelet first) | ahead of the kubelet | tainted | the kubelet / reprieve |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|"

// Totals adds results up.
type Totals struct {
	Series, Healthy, Falling    int
	Unwanted, HealthyUnwanted   int
	Kubelet, Whole, Cut, Missed int
	CutBy, HealthyTainted       time.Duration
	Leads                       []time.Duration
}

// Total adds rs up.
func Total(rs []*Result) Totals {
	var t Totals
	for _, r := range rs {
		t.Series++
		if r.Series.Healthy() {
			t.Healthy++
			t.HealthyUnwanted += r.Unwanted
			t.HealthyTainted += r.Tainted
		} else {
			t.Falling++
		}
		t.Unwanted += r.Unwanted
		t.Kubelet += r.Kubelet
		t.Whole += r.Whole
		t.Cut += r.Cut
		t.Missed += r.Missed
		t.CutBy += r.CutBy
		t.Leads = append(t.Leads, r.Leads...)
	}
	return t
}

// Row is t as the table's last row.
func (t Totals) Row() string {
	return fmt.Sprintf("| **all %d** (%d healthy, %d falling) | | | | %d (%d on healthy series) | %d of %d | %d (%.0f s) | %d | %s | %s on healthy series | |",
		t.Series, t.Healthy, t.Falling, t.Unwanted, t.HealthyUnwanted, t.Whole, t.Kubelet, t.Cut, t.CutBy.Seconds(), t.Missed,
		t.LeadRange(), fmtDuration(t.HealthyTainted))
}

// fmtLeads writes each lead in whole seconds, "-" for none.
func fmtLeads(ls []time.Duration) string {
	if len(ls) == 0 {
		return "-"
	}
	var out []string
	for _, l := range ls {
		out = append(out, fmt.Sprintf("%.0f s", l.Seconds()))
	}
	return strings.Join(out, ", ")
}

// LeadRange writes the least, the median and the most of t's leads, "-" for none.
func (t Totals) LeadRange() string {
	ls := t.Leads
	if len(ls) == 0 {
		return "-"
	}
	s := slices.Sorted(slices.Values(ls))
	return fmt.Sprintf("%.0f s to %.0f s (median %.0f s)", s[0].Seconds(), s[len(s)-1].Seconds(), s[len(s)/2].Seconds())
}

func fmtDuration(d time.Duration) string {
	if d >= time.Minute {
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%.0fs", d.Seconds())
}
