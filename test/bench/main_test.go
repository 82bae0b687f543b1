package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// TestSmoke runs every measurement of the benchmark at tiny sizes, so that `make test` keeps
// the program working; the figures mean nothing at these sizes.
func TestSmoke(t *testing.T) {
	if _, err := testenv.ToolsBin(); err != nil {
		if os.Getenv("REPRIEVE_E2E_REQUIRED") == "1" {
			t.Fatalf("end-to-end tools missing and REPRIEVE_E2E_REQUIRED=1: %v", err)
		}
		t.Skipf("skipping: %v (set REPRIEVE_E2E_REQUIRED=1 to make this a failure)", err)
	}
	if testing.Short() {
		t.Skip("skipping in -short mode")
	}
	dir := t.TempDir()
	o := smokeOptions(dir)
	// Built (or taken from $REPRIEVE_BIN) before the smoke run's clock starts: a cold build
	// alone can take minutes beside the other test binaries' compiles.
	var err error
	if o.Bin, err = scenario.BuildReprieve(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	// The pool restarts kube-apiserver twice (APF on, then off again): about 30 s more.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	o.Logf = t.Logf
	begin := time.Now()
	if err := run(ctx, o); err != nil {
		t.Fatal(err)
	}
	t.Logf("smoke run took %s", time.Since(begin).Round(time.Millisecond))
	md, err := os.ReadFile(o.Out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## 1. Deadline compliance", "## 2. Eviction throughput", "## 3. Reaction time",
		"## 4. Footprint", "## 5. Fleet scale", "## 6. A pool reclaimed at once", "## 7. Pressure", "benchmarks-compliance-aws.svg"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the report lacks %q:\n%s", want, md)
		}
	}
	svg, err := os.ReadFile(filepath.Join(dir, "benchmarks-compliance-aws.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(svg), "<svg") {
		t.Errorf("the chart is not an SVG: %.200s", svg)
	}
}

// smokeOptions shrinks every measurement to seconds.
func smokeOptions(dir string) options {
	o := defaultOptions()
	o.Out = filepath.Join(dir, "benchmarks.md")
	o.SVGDir = dir
	o.Runs = 1
	o.Pods = 11
	o.AWSWindow = 5 * time.Second
	o.Windows = []string{"aws"}
	o.SafetyMargin = 2 * time.Second
	o.NoticeLead = 3 * time.Second
	o.Burst = []int{5}
	o.BurstDue = 2 * time.Second
	o.Notices = 2
	o.Idle = time.Second
	o.Settle = time.Second
	o.FootprintWindow = 2 * time.Second
	o.Fleet = []int{2}
	o.FleetPods = 2
	o.FleetIdle = time.Second
	o.FleetWindow = 2 * time.Second
	o.PoolNodes = 2
	o.PoolPods = 3
	o.PoolWindow = 8 * time.Second
	o.PoolSeats = []int{12}
	o.PoolBaselineSeats = []int{12}
	o.PoolNTHSeats = nil // minutes of its own; measured by the full run
	// The guard's install runs on the reprieve side itself; without it and with the chart's
	// flowControl level are the same install changed by a value, measured by the full run.
	o.PoolNoGuardSeats, o.PoolFlowControlSeats = nil, nil
	o.ReplayMax = 5 * time.Minute
	o.Command = "go test ./test/bench (smoke)"
	return o
}
