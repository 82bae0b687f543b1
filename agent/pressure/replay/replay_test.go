package replay

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

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
// kubelet's rule gives the pod where it fits after reprieve's threshold (every falling series but
// synthetic-leak-64g, where a 120 s pod's grace cannot fit in the 66 s from reprieve's derived
// threshold to the kubelet's: precision first, it goes with 3 s at the last reading that leaves
// them, docs/pressure.md).
func TestReplayFallingSeriesKeepTheirGrace(t *testing.T) {
	cut := map[string]bool{"synthetic-leak-64g": true}
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
			if !cut[s.Name] && r.Whole != r.Kubelet {
				t.Errorf("%d of the kubelet's %d evictions made first with the whole grace, want all", r.Whole, r.Kubelet)
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
