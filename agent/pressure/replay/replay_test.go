package replay

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/pressure"
	"github.com/reprieve-dev/reprieve/kubelet"
)

// corpus is every series, the recorded ones in testdata and the synthetic ones.
func corpus(t *testing.T) []*Series {
	t.Helper()
	ss, err := Corpus("testdata")
	if err != nil {
		t.Fatal(err)
	}
	return ss
}

// Issue 47, the healthy half of the replay: on every series where the kubelet evicted nobody,
// reprieve as the chart runs it evicts nobody either. The falling series are held to the same:
// reprieve evicts no pod the kubelet left alone there. `make bench` prints the whole table
// (test/bench, docs/benchmarks.md).
func TestReplayEvictsNothingTheKubeletWouldNot(t *testing.T) {
	for _, s := range corpus(t) {
		t.Run(s.Name, func(t *testing.T) {
			r, err := Run(context.Background(), s, DefaultOptions())
			if err != nil {
				t.Fatal(err)
			}
			t.Log(r.Row())
			if r.Unwanted != 0 {
				t.Errorf("%d evictions the kubelet would not make: %+v", r.Unwanted, r.Actions)
			}
		})
	}
}

// The falling half: each of the kubelet's evictions made first by reprieve, with the grace the
// kubelet's rule gives the pod wherever it fits after reprieve's threshold is crossed, in
// hindsight and at the pace the fall had then (wholeFits). It does not in synthetic-leak-64g,
// where a 120 s pod's grace cannot fit in the 66 s from reprieve's derived threshold to the
// kubelet's, nor in realnode-leak, where the test's threshold, 600 MiB above the kubelet's, was
// 8 s of the fall when crossed (the machine's own memory fell with the hog's, 70 MB/s, and slowed
// after): precision first, such a pod goes at the last reading that leaves it 3 s, or with what
// fits (docs/pressure.md); main made the same 2 of 3 s there.
func TestReplayFallingSeriesKeepTheirGrace(t *testing.T) {
	for _, s := range corpus(t) {
		if s.Healthy() {
			continue
		}
		t.Run(s.Name, func(t *testing.T) {
			r, err := Run(context.Background(), s, DefaultOptions())
			if err != nil {
				t.Fatal(err)
			}
			t.Log(r.Row())
			if r.Missed != 0 {
				t.Errorf("%d of the kubelet's evictions not made first", r.Missed)
			}
			fits := wholeFits(t, s)
			if r.Whole < fits {
				t.Errorf("%d of the kubelet's %d evictions made first with the whole grace, want the %d where it fits after reprieve's threshold", r.Whole, r.Kubelet, fits)
			}
		})
	}
}

// The timeliness-first rule (CutEarly) gives the 120 s pod of synthetic-leak-64g more grace, and
// evicts on the first cycle of the sawtooth: what precision first trades (docs/benchmarks.md).
func TestReplayCutEarlyTradesPrecision(t *testing.T) {
	byName := map[string]*Series{}
	for _, s := range corpus(t) {
		byName[s.Name] = s
	}
	o := DefaultOptions()
	precise, err := Run(context.Background(), byName["synthetic-leak-64g"], o)
	if err != nil {
		t.Fatal(err)
	}
	o.CutEarly = true
	early, err := Run(context.Background(), byName["synthetic-leak-64g"], o)
	if err != nil {
		t.Fatal(err)
	}
	if early.CutBy >= precise.CutBy || early.Missed != 0 {
		t.Fatalf("cut early: %s; precision first: %s; want less grace cut early", early.Row(), precise.Row())
	}
}

// A series survives Save and Load, and the files in testdata are named after their series.
func TestSeriesRoundTrip(t *testing.T) {
	ss, err := Synthetic()
	if err != nil {
		t.Fatal(err)
	}
	s := ss[0]
	p := filepath.Join(t.TempDir(), s.Name+".json.gz")
	if err := s.Save(p); err != nil {
		t.Fatal(err)
	}
	got, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != s.Name || len(got.Readings) != len(s.Readings) || got.Readings[7].Node[kubelet.MemoryAvailable] != s.Readings[7].Node[kubelet.MemoryAvailable] {
		t.Fatalf("loaded %s with %d readings, want %s with %d", got.Name, len(got.Readings), s.Name, len(s.Readings))
	}
	bad := *s
	bad.KubeletEvictions = []KubeletEviction{{Pod: "nobody"}}
	if err := bad.Validate(); err == nil {
		t.Fatal("a label naming no pod of the series is valid")
	}
}

// The kubelet's model labels the two-pod series as the kubelet ranks: the leaking pod, which
// uses more than the large steady one where the threshold is met, alone.
func TestKubeletEvictionsRanksAtThePass(t *testing.T) {
	ss, err := Synthetic()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ss, func(s *Series) bool { return s.Name == "synthetic-two-pods-64g" })
	got := ss[i].KubeletEvictions
	if len(got) != 1 || got[0].Pod != "leak" || got[0].Grace != 1 {
		t.Fatalf("labels %+v, want leak alone with 1 s", got)
	}
	if at := time.Duration(got[0].AtMs) * time.Millisecond; at < 120*time.Second || at > 140*time.Second {
		t.Fatalf("leak evicted at %v, want where the fall meets 1Gi, about 133 s", at)
	}
}

// wholeFits counts the kubelet's evictions of s whose pod's grace (the kubelet's rule's), the
// safety margin, the request's allowance and a reading fit between the first reading under
// reprieve's threshold for that signal and the kubelet's eviction, both in hindsight (the
// kubelet's eviction's time) and as the reading saw it (foresight: the fall's pace then).
func wholeFits(t *testing.T, s *Series) int {
	t.Helper()
	kc, err := kubelet.ParseConfig([]byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n" + s.Kubelet))
	if err != nil {
		t.Fatal(err)
	}
	explicit, err := kubelet.ParseThresholds(s.Thresholds)
	if err != nil {
		t.Fatal(err)
	}
	th := pressure.ThresholdsFrom(kc, explicit, DefaultOptions().Headroom, nil)
	o := DefaultOptions()
	n := 0
	for _, e := range s.KubeletEvictions {
		grace := time.Duration(e.Grace) * time.Second
		if !e.Soft {
			for _, p := range s.Pods {
				if p.Name == e.Pod {
					grace = time.Duration(p.Grace) * time.Second
				}
			}
		}
		for i, r := range s.Readings {
			obs := kubelet.Observations{}
			for sig, v := range r.Node {
				obs[sig] = kubelet.Observation{Available: v[0], Capacity: v[1]}
			}
			crossed, hard := false, int64(0)
			for _, l := range th.Levels(obs) {
				if l.Signal == e.Signal && l.Met(false) {
					crossed, hard = true, l.Hard
				}
			}
			if crossed {
				need := grace + o.SafetyMargin + 250*time.Millisecond + o.Interval
				at := time.Duration(r.AtMs) * time.Millisecond
				if time.Duration(e.AtMs)*time.Millisecond-at >= need && (e.Soft || foresight(s, i, e.Signal, hard) >= need) {
					n++
				}
				break
			}
		}
	}
	return n
}

// foresight is the time the signal's fall would take from reading i to the kubelet's hard
// threshold hard, at the slower of its paces over the last five readings and over the trend window:
// what a predictor could know when its threshold was crossed (on the real node's leak, 8 s at
// 70 MB/s, though the fall then slowed and the kubelet came 11 s later).
func foresight(s *Series, i int, sig kubelet.Signal, hard int64) time.Duration {
	j := i
	for j > 0 && s.Readings[i].AtMs-s.Readings[j-1].AtMs <= DefaultOptions().TrendWindow.Milliseconds() {
		j--
	}
	b := s.Readings[i]
	fall := math.Inf(1)
	for _, k := range []int{max(i-5, 0), j} {
		if a := s.Readings[k]; k < i {
			fall = min(fall, float64(a.Node[sig][0]-b.Node[sig][0])/float64(b.AtMs-a.AtMs)*1000)
		}
	}
	if math.IsInf(fall, 1) || fall <= 0 || hard <= 0 {
		return pressure.Never
	}
	return time.Duration(float64(b.Node[sig][0]-hard) / fall * float64(time.Second))
}

// Issue 47's own cases, by name, as the issue counts them: the 800 MiB step kept 1.8 GiB above
// the threshold, the collector's sawtooth and an hour of ±10 MiB jitter evict nothing (main
// evicted all three pods on the first two, 27 on the third); of a leaking pod and a larger
// steady one, the leaking pod alone is evicted, once, before the kubelet and with its grace.
// (The NoSchedule taint may stand on these: they lie within reprieve's derived threshold, the
// kubelet's plus the headroom; the benchmark prints how long.)
func TestReplayIssueCases(t *testing.T) {
	byName := map[string]*Series{}
	for _, s := range corpus(t) {
		byName[s.Name] = s
	}
	for _, tc := range []struct {
		series string
		want   []string
	}{
		{"synthetic-step-64g", nil},
		{"synthetic-sawtooth-64g", nil},
		{"synthetic-jitter-64g-1h", nil},
		{"synthetic-two-pods-64g", []string{"leak"}},
		{"realnode-step-kept", nil},
		{"realnode-gc-sawtooth", nil},
		{"realnode-jitter", nil},
	} {
		t.Run(tc.series, func(t *testing.T) {
			s := byName[tc.series]
			if s == nil {
				t.Fatalf("no series %s in the corpus", tc.series)
			}
			r, err := Run(context.Background(), s, DefaultOptions())
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range r.Actions {
				got = append(got, a.Pod)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("reprieve's actions %+v, want evictions of %v", r.Actions, tc.want)
			}
			if tc.want != nil && (r.Missed != 0 || r.Whole != len(tc.want)) {
				t.Fatalf("%d missed, %d with the whole grace of %d, want all made first whole", r.Missed, r.Whole, len(tc.want))
			}
		})
	}
}

// score counts, beside what reprieve evicted that the kubelet would not, how far ahead of the
// kubelet it evicted each pod both evicted; a pod the kubelet evicted first has no lead.
func TestScoreLeads(t *testing.T) {
	s := &Series{Name: "t", KubeletEvictions: []KubeletEviction{
		{Pod: "a", AtMs: 100_000, Grace: 1}, {Pod: "b", AtMs: 100_000, Grace: 1}, {Pod: "c", AtMs: 50_000, Grace: 1},
	}}
	r := score(s, []Action{
		{Pod: "a", At: 60 * time.Second, Grace: 30 * time.Second, PodGrace: 30 * time.Second},
		{Pod: "b", At: 95 * time.Second, Grace: 3 * time.Second, PodGrace: 30 * time.Second},
		{Pod: "c", At: 70 * time.Second, Grace: 30 * time.Second, PodGrace: 30 * time.Second},
		{Pod: "d", At: 70 * time.Second, Grace: 30 * time.Second, PodGrace: 30 * time.Second},
	}, 0)
	if !slices.Equal(r.Leads, []time.Duration{40 * time.Second, 5 * time.Second}) {
		t.Fatalf("leads %v, want [40s 5s]", r.Leads)
	}
	if r.Whole != 1 || r.Cut != 1 || r.CutBy != 27*time.Second || r.Missed != 1 || r.Unwanted != 1 {
		t.Fatalf("whole %d, cut %d (%v), missed %d, unwanted %d; want 1, 1 (27s), 1, 1", r.Whole, r.Cut, r.CutBy, r.Missed, r.Unwanted)
	}
	if got := Total([]*Result{r}).LeadRange(); got != "5 s to 40 s (median 40 s)" {
		t.Fatalf("lead range %q", got)
	}
}
