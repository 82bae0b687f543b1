package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestRealnodeChart draws a synthetic pair of runs and checks what the chart must show; a file
// without samples is refused with its name.
func TestRealnodeChart(t *testing.T) {
	dir := t.TempDir()
	run := func(name, by string, sigterm float64) scenario.PressureRun {
		r := scenario.PressureRun{Name: name, EvictedBy: by, HardMiB: 1000}
		for i := range 20 {
			r.Samples = append(r.Samples, scenario.PressureSample{At: float64(i), AvailableMiB: 1400 - 25*float64(i)})
		}
		r.Moments = []scenario.PressureMoment{{What: "SIGTERM in the hog", At: sigterm}}
		return r
	}
	tl := &scenario.PressureTimelines{Measured: "2026-12-01T23:45:27Z", Machine: "2 cores", Signals: []scenario.PressureSignal{{
		Signal: "nodefs.available", OwnAboveMiB: 250,
		Runs: []scenario.PressureRun{
			run("with reprieve", "EvictionByEvictionAPI: Eviction API: evicting", 12),
			run("without reprieve", "TerminationByKubelet: The node was low on resource: ephemeral-storage.", 18),
		},
	}}}
	in := filepath.Join(dir, "pressure-nodefs.available.json")
	if err := scenario.WritePressureTimelines(in, tl); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, realnodeChartName)
	if err := writeRealnodeChart(out, []string{in}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "nodefs.available on the real node", "evicted by reprieve, Eviction API", "evicted by the kubelet", "hard threshold (evictionHard)", "SIGTERM"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the chart lacks %q", want)
		}
	}

	// A case of a signal already drawn, against the kubelet's soft threshold, is told apart.
	tl.Signals[0].Case, tl.Signals[0].Threshold = "a soft threshold held 15 s", "soft"
	if err := scenario.WritePressureTimelines(in, tl); err != nil {
		t.Fatal(err)
	}
	if err := writeRealnodeChart(out, []string{in}); err != nil {
		t.Fatal(err)
	}
	if b, err = os.ReadFile(out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"nodefs.available on the real node (a soft threshold held 15 s)", "soft threshold (evictionSoft)", "above the kubelet&#39;s soft threshold"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the soft case's chart lacks %q", want)
		}
	}

	tl.Signals[0].Runs[1].Samples = nil
	bad := filepath.Join(dir, "bad.json")
	if err := scenario.WritePressureTimelines(bad, tl); err != nil {
		t.Fatal(err)
	}
	if err := writeRealnodeChart(out, []string{bad}); err == nil || !strings.Contains(err.Error(), "without reprieve: no samples") || !strings.Contains(err.Error(), "bad.json") {
		t.Errorf("a run without samples: %v, want an error naming the file and the run", err)
	}
}
