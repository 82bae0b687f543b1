package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTimelines draws a synthetic run: one pod gone in time, one shortened, one late, one
// projected, one left alone.
func TestTimelines(t *testing.T) {
	notice := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	r := &complianceRun{Window: "gcp", Length: 30 * time.Second, Notice: notice, Deadline: notice.Add(30 * time.Second), Margin: 5 * time.Second}
	pods := complianceMix(11)
	at := func(s float64) time.Time { return notice.Add(time.Duration(s * float64(time.Second))) }
	for i := range r.Sides {
		r.Sides[i] = sideResult{Name: []string{sideReprieve, sidePlatform}[i], Evictable: 10, Gone: 8, FullGrace: 5, Forever: 1}
		r.Sides[i].Pods = []podOutcome{
			{Pod: pods[0], Evicted: at(0.2), End: at(5.2), GraceGiven: pods[0].GraceSeconds()},
			{Pod: pods[1], Evicted: at(0.3), End: at(24), GraceGiven: 1},
			{Pod: pods[2], Evicted: at(1), End: at(61), GraceGiven: pods[2].GraceSeconds()},
			{Pod: pods[3], Evicted: at(10), End: at(70), Projected: true, GraceGiven: pods[3].GraceSeconds()},
			{Pod: pods[9], NeverEvicted: true},
		}
	}
	path := filepath.Join(t.TempDir(), "chart.svg")
	if err := writeTimelines(path, r); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "reclaim deadline", "still there at the deadline", "sans-serif"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the chart lacks %q", want)
		}
	}
}
