package main

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// poolGraceMix is the pool scenario's 608 pods: 16 nodes of 38, graces in turn.
func poolGraceMix() []int64 {
	var gs []int64
	for range 16 {
		for j := range 38 {
			gs = append(gs, poolGraces[j%len(poolGraces)])
		}
	}
	return gs
}

// TestFeasibleAt works the pool at 10 evictions a second through by hand: earliest L first,
// skipping a pod that would be served past its L. The 45 s pods' L is before the notice; 50
// slots come before the 30 s pods' L (5 s); the 20 s and 10 s pods all fit; the 5 s pods' L
// (30 s) leaves 300 slots, 58 of them free; the 2 s pods' (33 s) 30 more.
func TestFeasibleAt(t *testing.T) {
	got, inTime := feasibleAt(poolGraceMix(), 35*time.Second, 10)
	want := map[int64]int{30: 50, 20: 96, 10: 96, 5: 58, 2: 30}
	if !maps.Equal(got, want) {
		t.Errorf("feasible per grace = %v, want %v", got, want)
	}
	if inTime != 340 {
		t.Errorf("in time at most = %d, want 340 (10/s over 34 s)", inTime)
	}
	// With seats enough for everyone, only the grace longer than the window is infeasible.
	got, inTime = feasibleAt(poolGraceMix(), 35*time.Second, 1000)
	if got[45] != 0 || got[30] != 112 || got[2] != 96 || inTime != 608 {
		t.Errorf("at 1000/s: %v, %d in time; want every pod but the 45 s ones, 608", got, inTime)
	}
	if got, n := feasibleAt(poolGraceMix(), 35*time.Second, 0); len(got) != 0 || n != 0 {
		t.Errorf("at 0/s: %v, %d; want none", got, n)
	}
}

func TestLostThoughFeasible(t *testing.T) {
	pods := map[int64]int{45: 112, 30: 112, 2: 96}
	feasible := map[int64]int{30: 50, 2: 30}
	// All 112 45 s pods lost: none was feasible. 70 of the 30 s: 62 were infeasible, 8 not.
	// 66 of the 2 s: exactly the infeasible ones.
	if n := lostThoughFeasible(pods, map[int64]int{45: 112, 30: 70, 2: 66}, feasible); n != 8 {
		t.Errorf("lost though feasible = %d, want 8", n)
	}
}

func TestAcceptRate(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	end := t0.Add(35 * time.Second)
	acc := []time.Time{t0.Add(time.Second), t0.Add(2 * time.Second), t0.Add(4 * time.Second)}
	// All accepted, the last 4 s after the notice.
	if r := acceptRate(acc, t0, end); r != 0.75 {
		t.Errorf("rate = %v, want 0.75", r)
	}
	// One never accepted and one after the end: saturated all window, 3 over 35 s.
	acc = append(acc, time.Time{}, end.Add(time.Second))
	if r := acceptRate(acc, t0, end); r != 3.0/35 {
		t.Errorf("rate = %v, want 3/35", r)
	}
	if r := acceptRate(nil, t0, end); r != 0 {
		t.Errorf("rate of none = %v, want 0", r)
	}
}

// TestAPFTimelineRows: one row per priority level and flow schema, with the level's current
// limit beside that schema's executing seats, queued requests and dispatched total; other
// metrics are left out.
func TestAPFTimelineRows(t *testing.T) {
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	l := func(level, schema string) map[string]string {
		return map[string]string{"priority_level": level, "flow_schema": schema}
	}
	var tl apfTimeline
	tl.add(at, []sample{
		{Name: "apiserver_flowcontrol_current_limit_seats", Labels: map[string]string{"priority_level": "workload-high"}, Value: 5},
		{Name: "apiserver_flowcontrol_current_executing_seats", Labels: l("workload-high", "kube-system-service-accounts"), Value: 3},
		{Name: "apiserver_flowcontrol_current_inqueue_requests", Labels: l("workload-high", "kube-system-service-accounts"), Value: 40},
		{Name: "apiserver_flowcontrol_dispatched_requests_total", Labels: l("workload-high", "kube-system-service-accounts"), Value: 900},
		{Name: "apiserver_flowcontrol_current_executing_seats", Labels: l("exempt", "exempt"), Value: 1},
		{Name: "apiserver_request_total", Labels: l("exempt", "exempt"), Value: 1e6},
	})
	want := []apfRow{
		{at: at, level: "exempt", schema: "exempt", executing: 1},
		{at: at, level: "workload-high", schema: "kube-system-service-accounts", limit: 5, executing: 3, queued: 40, sent: 900},
	}
	if !slices.Equal(tl.rows, want) {
		t.Fatalf("rows %+v, want %+v", tl.rows, want)
	}
}

// TestParseMetrics: the Prometheus text as kube-apiserver and reprieve write it, read into the
// samples the bench sums: a counter with escaped label values, a gauge, and a histogram's
// buckets by le as the text spells it (+Inf included), its sum and count.
func TestParseMetrics(t *testing.T) {
	text := `# HELP apiserver_request_total Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="429",verb="POST",component="a \"quoted\" one"} 7
apiserver_request_total{code="201",verb="POST",component=""} 3
# TYPE up gauge
up 1
# TYPE reprieve_evictions_lateness_seconds histogram
reprieve_evictions_lateness_seconds_bucket{le="0.01"} 2
reprieve_evictions_lateness_seconds_bucket{le="0.25"} 5
reprieve_evictions_lateness_seconds_bucket{le="1"} 6
reprieve_evictions_lateness_seconds_bucket{le="+Inf"} 8
reprieve_evictions_lateness_seconds_sum 9.5
reprieve_evictions_lateness_seconds_count 8
`
	samples, err := parseMetrics(text)
	if err != nil {
		t.Fatal(err)
	}
	if got := sum(samples, "apiserver_request_total", map[string]string{"code": "429", "component": `a "quoted" one`}); got != 7 {
		t.Errorf("429s = %v, want 7", got)
	}
	if got := sum(samples, "apiserver_request_total", map[string]string{"code": "!429"}); got != 3 {
		t.Errorf("other answers = %v, want 3", got)
	}
	if got := sum(samples, "up", nil); got != 1 {
		t.Errorf("up = %v, want 1", got)
	}
	h, err := histogram(text, "reprieve_evictions_lateness_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]float64{"0.01": 2, "0.25": 5, "1": 6, "+Inf": 8}; !maps.Equal(h, want) {
		t.Errorf("buckets %v, want %v", h, want)
	}
	if got := sum(samples, "reprieve_evictions_lateness_seconds_count", nil); got != 8 {
		t.Errorf("count = %v, want 8", got)
	}
	if _, err := parseMetrics("not { the format"); err == nil || !strings.Contains(err.Error(), "Prometheus text format") {
		t.Errorf("garbage: err %v, want one naming the format", err)
	}
}
