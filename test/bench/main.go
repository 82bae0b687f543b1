// Command bench measures reprieve on the real control plane of the test tree (kube-apiserver on
// etcd, kwok for kubelets, kube-controller-manager where upstream behaviour is the baseline) and
// rewrites docs/benchmarks.md and the charts beside it. `make bench` runs it; it starts and stops
// everything itself. The measurements, in order:
//
//  1. deadline compliance: reprieve against kube-controller-manager's taint eviction alone;
//  2. eviction throughput and precision: a burst due at one instant, and kubectl's drain;
//  3. reaction time: notice at the metadata endpoint to taint on the node;
//  4. footprint: memory, CPU and API requests of one agent, idle and during an interruption;
//  5. fleet scale: many agents against one API server;
//  6. a pool reclaimed at once: many agents evicting together through API Priority and Fairness;
//  7. the pressure replay: recorded and synthetic node series through the real pressure loop,
//     scored against what the kubelet did (issue 47).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// options are the sizes and durations of one run; the flags set them, the smoke test shrinks them.
type options struct {
	// Out is the Markdown file whose generated block is rewritten; SVGDir receives the charts.
	Out, SVGDir string
	// Only names the measurements to run (empty: all).
	Only map[string]bool
	// Runs is how often each timing measurement is repeated (medians are reported).
	Runs int

	// Compliance: Pods per node, the AWS window, which windows, and the agent's safety margin.
	Pods         int
	AWSWindow    time.Duration
	Windows      []string
	SafetyMargin time.Duration
	// NoticeLead is how long after everything is ready the notice appears.
	NoticeLead time.Duration

	// Burst: pod counts, how far after the taint the pods are due, and drain runs.
	Burst     []int
	BurstDue  time.Duration
	DrainRuns int

	// Reaction: notices per cloud.
	Notices int

	// Footprint: the idle window, the settling time after the first sync, and the
	// interruption's window.
	Idle, Settle, FootprintWindow time.Duration

	// Fleet: agent counts, pods per node, idle window and reclaim window.
	Fleet                  []int
	FleetPods              int
	FleetIdle, FleetWindow time.Duration

	// Pool: nodes, pods per node, the reclaim window, the seat counts reprieve is measured at
	// and those the taint-alone baseline is measured at too.
	PoolNodes, PoolPods          int
	PoolWindow                   time.Duration
	PoolSeats, PoolBaselineSeats []int
	// PoolNTHSeats are the seat counts at which aws-node-termination-handler is measured too.
	PoolNTHSeats []int
	// PoolNoGuardSeats and PoolFlowControlSeats are the seat counts at which reprieve is
	// measured as installed but without its eviction guard, and with the chart's flowControl
	// level for the agents' evictions.
	PoolNoGuardSeats, PoolFlowControlSeats []int
	// ReplayMax leaves series longer than this out of the replay (0: none).
	ReplayMax time.Duration

	// PoolTimeline samples the API server's APF gauges every PoolTimeline during each pool
	// run and keeps them beside the logs (0: none; the scrapes cost the server CPU).
	PoolTimeline time.Duration

	// Command is the command line recorded in the report.
	Command string
	// Bin is the reprieve binary to measure; empty builds one before anything is timed.
	Bin string
	// Logf reports progress.
	Logf func(format string, args ...any)
}

// measurements lists the measurement names in the order they run.
var measurements = []string{"compliance", "burst", "reaction", "footprint", "fleet", "pool", "replay"}

func defaultOptions() options {
	return options{
		Out:               "docs/benchmarks.md",
		SVGDir:            "docs",
		Runs:              3,
		Pods:              110,
		AWSWindow:         120 * time.Second,
		Windows:           []string{"aws", "gcp"},
		SafetyMargin:      5 * time.Second,
		NoticeLead:        5 * time.Second,
		Burst:             []int{110, 250},
		BurstDue:          10 * time.Second,
		DrainRuns:         1,
		Notices:           20,
		Idle:              2 * time.Minute,
		Settle:            10 * time.Second,
		FootprintWindow:   45 * time.Second,
		Fleet:             []int{25, 50, 100},
		FleetPods:         30,
		FleetIdle:         30 * time.Second,
		FleetWindow:       30 * time.Second,
		PoolNodes:         16,
		PoolPods:          38,
		PoolWindow:        40 * time.Second,
		PoolSeats:         []int{600, 12, 6},
		PoolBaselineSeats: []int{600, 12},
		PoolNTHSeats:      []int{12},
		// Without the guard beside it at 12 seats; with the chart's flowControl level, by hand
		// (docs/benchmarks.md, issue 46): each run is two minutes more.
		PoolNoGuardSeats: []int{12},
		Command:          "make bench",
		Logf:             func(f string, a ...any) { fmt.Fprintf(os.Stderr, "bench: "+f+"\n", a...) },
	}
}

func main() {
	os.Exit(runMain())
}

func runMain() int {
	o := defaultOptions()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&o.Out, "out", o.Out, "Markdown file whose generated block is rewritten.")
	fs.StringVar(&o.SVGDir, "svg-dir", o.SVGDir, "Folder for the SVG charts.")
	only := fs.String("only", "", "Comma-separated measurements to run ("+strings.Join(measurements, ",")+"); all when empty. The generated block then holds only these: point -out elsewhere to keep docs/benchmarks.md.")
	fs.IntVar(&o.Runs, "runs", o.Runs, "Repetitions of each timing measurement (medians are reported).")
	fs.IntVar(&o.Pods, "pods", o.Pods, "Pods per node in the deadline-compliance workload.")
	fs.DurationVar(&o.AWSWindow, "aws-window", o.AWSWindow, "AWS spot window (notice to reclaim).")
	windows := fs.String("windows", strings.Join(o.Windows, ","), "Reclaim windows for deadline compliance: aws, gcp.")
	fs.DurationVar(&o.SafetyMargin, "safety-margin", o.SafetyMargin, "reprieve's --safety-margin.")
	burst := fs.String("burst", joinInts(o.Burst), "Pod counts of the eviction burst.")
	fs.DurationVar(&o.BurstDue, "burst-due", o.BurstDue, "How long after the taint every burst pod is due.")
	fs.IntVar(&o.DrainRuns, "drain-runs", o.DrainRuns, "Runs of the kubectl drain comparison per size.")
	fs.IntVar(&o.Notices, "notices", o.Notices, "Notices per cloud for the reaction time.")
	fs.DurationVar(&o.Idle, "idle", o.Idle, "How long the footprint measurement watches an idle agent (the issue asks for 10m).")
	fs.DurationVar(&o.FootprintWindow, "footprint-window", o.FootprintWindow, "Reclaim window of the footprint's interruption.")
	fleet := fs.String("fleet", joinInts(o.Fleet), "Agent counts of the fleet measurement.")
	fs.IntVar(&o.FleetPods, "fleet-pods", o.FleetPods, "Pods per node in the fleet.")
	fs.DurationVar(&o.FleetIdle, "fleet-idle", o.FleetIdle, "Idle window per fleet size.")
	fs.DurationVar(&o.FleetWindow, "fleet-window", o.FleetWindow, "Reclaim window of the fleet's interruption.")
	fs.IntVar(&o.PoolNodes, "pool-nodes", o.PoolNodes, "Nodes of the pool reclaimed at once.")
	fs.IntVar(&o.PoolPods, "pool-pods", o.PoolPods, "Evictable pods per node of the pool.")
	fs.DurationVar(&o.PoolWindow, "pool-window", o.PoolWindow, "Reclaim window of the pool.")
	poolSeats := fs.String("pool-seats", joinInts(o.PoolSeats), "API server seats (--max-requests-inflight + --max-mutating-requests-inflight) reprieve is measured at, as the chart installs it; \"\" for none.")
	poolNoGuard := fs.String("pool-noguard-seats", joinInts(o.PoolNoGuardSeats), "Seat counts at which reprieve is measured as installed without its eviction guard too; \"\" for none.")
	poolFlowControl := fs.String("pool-flowcontrol-seats", joinInts(o.PoolFlowControlSeats), "Seat counts at which reprieve is measured as installed with the chart's flowControl level too; \"\" for none.")
	poolBaseline := fs.String("pool-baseline-seats", joinInts(o.PoolBaselineSeats), "Seat counts at which the taint-alone baseline is measured too.")
	poolNTH := fs.String("pool-nth-seats", joinInts(o.PoolNTHSeats), "Seat counts at which aws-node-termination-handler (IMDS mode) is measured too; \"\" for none.")
	fs.DurationVar(&o.PoolTimeline, "pool-timeline", 0, "Sample kube-apiserver's APF gauges at this interval during each pool run, into pool-<side>-<seats>-apf.csv beside the logs (0: none).")
	fs.DurationVar(&o.ReplayMax, "replay-max", o.ReplayMax, "Leave node series longer than this out of the pressure replay (0: none).")
	fs.StringVar(&o.Command, "command", o.Command, "Command line recorded in the report.")
	realnode := fs.String("realnode-chart", "", "Only draw -svg-dir/"+realnodeChartName+" from these comma-separated timeline files of test/realnode (REPRIEVE_REALNODE_FIGURES), and measure nothing.")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *realnode != "" {
		if err := writeRealnodeChart(filepath.Join(o.SVGDir, realnodeChartName), splitList(*realnode)); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			return 1
		}
		return 0
	}
	var errs []error
	var err error
	if o.Only, err = parseOnly(*only); err != nil {
		errs = append(errs, err)
	}
	o.Windows = splitList(*windows)
	if o.Burst, err = parseInts(*burst); err != nil {
		errs = append(errs, fmt.Errorf("-burst: %w", err))
	}
	if o.Fleet, err = parseInts(*fleet); err != nil {
		errs = append(errs, fmt.Errorf("-fleet: %w", err))
	}
	for _, l := range []struct {
		flag string
		val  string
		into *[]int
	}{{"-pool-seats", *poolSeats, &o.PoolSeats}, {"-pool-noguard-seats", *poolNoGuard, &o.PoolNoGuardSeats}, {"-pool-flowcontrol-seats", *poolFlowControl, &o.PoolFlowControlSeats}} {
		if *l.into, err = parseInts(l.val); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", l.flag, err))
		}
	}
	if o.PoolBaselineSeats, err = parseInts(*poolBaseline); err != nil {
		errs = append(errs, fmt.Errorf("-pool-baseline-seats: %w", err))
	}
	if *poolNTH != "" {
		if o.PoolNTHSeats, err = parseInts(*poolNTH); err != nil {
			errs = append(errs, fmt.Errorf("-pool-nth-seats: %w", err))
		}
	} else {
		o.PoolNTHSeats = nil
	}
	for _, s := range poolRounds(o) {
		if s < 3 {
			errs = append(errs, fmt.Errorf("-pool-seats: %d seats: kube-apiserver needs at least 2 read-only and 1 mutating", s))
		}
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 2
	}
	// client-go's throttling notes (the drain comparison waits on purpose) are not the report.
	klog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 1
	}
	return 0
}

// bench is what every measurement shares: the control plane, the agent binary and its
// credentials.
type bench struct {
	o      options
	env    *testenv.Env
	bin    string
	logDir string
	// kubeconfig and token authenticate as the shipped ServiceAccount with the shipped
	// ClusterRole, as the agent runs in a cluster.
	kubeconfig, token string
	seq               int
}

// name returns a fresh name with prefix, so that every run has its own namespace and nodes.
func (b *bench) name(prefix string) string {
	b.seq++
	return fmt.Sprintf("%s-%d", prefix, b.seq)
}

// run starts the control plane, runs the selected measurements and rewrites the report.
func run(ctx context.Context, o options) error {
	begin := time.Now()
	logDir, err := os.MkdirTemp("", "reprieve-bench-")
	if err != nil {
		return fmt.Errorf("creating the log folder: %w", err)
	}
	b := &bench{o: o, logDir: logDir, bin: o.Bin}
	// The replay runs in this process on a fake clock: the binary and the control plane only
	// for the others.
	plane := false
	for _, m := range measurements {
		plane = plane || m != "replay" && (len(o.Only) == 0 || o.Only[m])
	}
	if plane {
		if b.bin == "" {
			if b.bin, err = scenario.BuildReprieve(ctx, logDir); err != nil {
				return err
			}
		}
		// kube-controller-manager runs for the compliance measurement only: elsewhere its
		// taint-eviction-controller would act on the same taints and blur what is measured.
		b.env, err = testenv.Start(ctx, testenv.Options{FastPods: true, LogDir: filepath.Join(logDir, "controlplane")})
		if err != nil {
			return err
		}
		defer b.env.Stop()
		if b.kubeconfig, err = scenario.InstallRBAC(ctx, b.env); err != nil {
			return err
		}
		if b.token, err = tokenOf(b.kubeconfig); err != nil {
			return err
		}
	}
	rep := &report{Options: o}
	if rep.Machine, err = describeMachine(ctx); err != nil && plane {
		return err
	}
	steps := map[string]func(context.Context, *report) error{
		"compliance": b.compliance,
		"burst":      b.burst,
		"reaction":   b.reaction,
		"footprint":  b.footprint,
		"fleet":      b.fleet,
		"pool":       b.pool,
		"replay":     b.replayPressure,
	}
	for _, m := range measurements {
		if len(o.Only) > 0 && !o.Only[m] {
			continue
		}
		start := time.Now()
		o.Logf("%s: starting", m)
		if err := steps[m](ctx, rep); err != nil {
			return fmt.Errorf("%s: %w (logs in %s)", m, err, logDir)
		}
		o.Logf("%s: done in %s", m, time.Since(start).Round(time.Second))
		// Written after every measurement, so that a later failure keeps what was measured.
		rep.Took = time.Since(begin)
		if err := rep.write(o); err != nil {
			return err
		}
	}
	o.Logf("wrote %s in %s; logs in %s", o.Out, rep.Took.Round(time.Second), logDir)
	return nil
}

func parseOnly(s string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, m := range splitList(s) {
		known := false
		for _, k := range measurements {
			known = known || k == m
		}
		if !known {
			return nil, fmt.Errorf("-only: unknown measurement %q (known: %s)", m, strings.Join(measurements, ","))
		}
		out[m] = true
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
