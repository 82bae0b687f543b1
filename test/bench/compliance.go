package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/reprieve-dev/reprieve/test/fakes/gcpmeta"
	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// gcpWindow is how long GCP gives a preempted VM; the agent's GCP provider plans with it.
const gcpWindow = 30 * time.Second

// Side names of the compliance comparison.
const (
	sideReprieve = "reprieve + kube-controller-manager"
	sidePlatform = "taint + kube-controller-manager only"
)

// complianceMix is the workload of one node: a realistic spread of tolerations of the
// interruption taint (most pods tolerate nothing, as the taint is not one Kubernetes adds
// defaults for) and of grace periods, with every 11th pod under a PodDisruptionBudget that
// allows no disruption. The spread is deterministic, so both nodes and every run get the same.
func complianceMix(n int) []scenario.Pod {
	tolerations := []int64{-2, -2, 0, 10, 30, 60, 120, 300, 600, scenario.Forever, -2} // -2: none
	graces := []int64{5, 10, 15, 30, 30, 60, 120, 300}
	pods := make([]scenario.Pod, n)
	for i := range pods {
		tol := tolerations[i%len(tolerations)]
		grace := graces[(i*3+i/len(tolerations))%len(graces)]
		p := scenario.Pod{Kind: scenario.Plain, Grace: &grace, PDB: i%11 == 5}
		if tol != -2 {
			p.Tolerate = &tol
		}
		p.Name = fmt.Sprintf("p%03d-tol-%s-grace-%ds", i, strings.TrimSuffix(p.Toleration(), "s"), grace)
		pods[i] = p
	}
	return pods
}

// podOutcome is what happened to one pod of a compliance run, relative to the notice.
type podOutcome struct {
	Pod scenario.Pod
	// Evicted is when the pod got its deletionTimestamp; End when it was gone, or (Projected)
	// when it would be: its promised deletionTimestamp, or for a pod not yet evicted when
	// watching stopped, upstream's eviction time plus its grace.
	Evicted, End time.Time
	Projected    bool
	// NeverEvicted: tolerates the taint forever, or reprieve never evicted it.
	NeverEvicted bool
	// GraceGiven is the last grace the API server showed.
	GraceGiven int64
}

// sideResult is one side of one window.
type sideResult struct {
	Name      string
	Pods      []podOutcome
	Evictable int // pods that do not tolerate the taint forever
	Gone      int // of those, gone by the deadline
	FullGrace int // of those, gone by the deadline with their whole grace
	Forever   int
	// WorstLate is max(end - deadline) over evictable pods (negative: all were early).
	WorstLate time.Duration
	Never     int // evictable pods neither evicted nor projected
}

// complianceRun is one window, both sides.
type complianceRun struct {
	Window   string
	Length   time.Duration
	Notice   time.Time // when the notice became visible, and node B was tainted
	Deadline time.Time // the machine is reclaimed
	Margin   time.Duration
	// AgentTaintAt is when the agent's taint carried timeAdded.
	AgentTaintAt time.Time
	Sides        [2]sideResult
	Chart        string
}

func (b *bench) compliance(ctx context.Context, rep *report) error {
	if err := b.env.StartControllerManager(ctx); err != nil {
		return err
	}
	defer b.env.StopControllerManager()
	for _, w := range b.o.Windows {
		r, err := b.complianceWindow(ctx, w)
		if err != nil {
			return err
		}
		r.Chart = filepath.Join(b.o.SVGDir, "benchmarks-compliance-"+w+".svg")
		if err := writeTimelines(r.Chart, r); err != nil {
			return err
		}
		rep.Compliance = append(rep.Compliance, r)
	}
	return nil
}

// complianceWindow runs one window: node A with reprieve, node B with the taint alone, the
// same workload, the notice at the same instant, kube-controller-manager acting on both.
func (b *bench) complianceWindow(ctx context.Context, window string) (*complianceRun, error) {
	r := &complianceRun{Window: window, Margin: b.o.SafetyMargin}
	switch window {
	case "aws":
		r.Length = b.o.AWSWindow
	case "gcp":
		r.Length = gcpWindow
	default:
		return nil, fmt.Errorf("unknown window %q (aws, gcp)", window)
	}
	pods := complianceMix(b.o.Pods)
	base := b.name("cmp-" + window)
	nsA, nsB := base+"-a", base+"-b"
	obsA, err := b.nodeWithPods(ctx, nsA, nsA, pods)
	if err != nil {
		return nil, err
	}
	defer obsA.Stop()
	obsB, err := b.nodeWithPods(ctx, nsB, nsB, pods)
	if err != nil {
		return nil, err
	}
	defer obsB.Stop()
	watchA, err := watchTaint(ctx, b.env.Client, nsA)
	if err != nil {
		return nil, err
	}
	defer watchA.Stop()

	// The notice comes at a whole second, as timeAdded is stored in whole seconds.
	r.Notice = time.Now().Add(b.o.NoticeLead).Truncate(time.Second).Add(time.Second)
	r.Deadline = r.Notice.Add(r.Length)
	var args []string
	var post func()
	switch window {
	case "aws":
		// amazon-ec2-metadata-mock shows the notice from r.Notice on, with the deadline fixed.
		mock, endpoint, err := testenv.StartIMDSMock(ctx, b.logDir, "--imdsv2",
			"--mock-trigger-time="+r.Notice.UTC().Format(time.RFC3339),
			"spot", "--action=terminate", "--time="+r.Deadline.UTC().Format(time.RFC3339))
		if err != nil {
			return nil, err
		}
		defer func() { _ = mock.Stop() }()
		args = []string{"--provider=aws", "--aws-imds-endpoint=" + endpoint}
		post = func() {}
	case "gcp":
		srv := gcpmeta.New()
		url, err := srv.Start("127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("starting the GCP metadata server: %w", err)
		}
		defer func() { _ = srv.Close() }()
		args = []string{"--provider=gcp", "--gcp-metadata-endpoint=" + strings.TrimPrefix(url, "http://")}
		post = func() { srv.Set(gcpmeta.PathPreempted, "TRUE") }
	}
	agentProc, _, err := b.startAgent(ctx, nsA, append(args, "--safety-margin="+b.o.SafetyMargin.String())...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = agentProc.Stop() }()
	if time.Until(r.Notice) < 0 {
		// The agent was not ready for the notice: its reaction (in the report) includes that.
		b.o.Logf("compliance: the agent became ready %s after the notice; a longer lead would help", -time.Until(r.Notice))
	}
	if err := sleepUntil(ctx, r.Notice); err != nil {
		return nil, err
	}
	post()
	if err := setTaint(ctx, b.env.Client, nsB, r.Notice); err != nil {
		return nil, err
	}
	ch, err := watchA.Next(ctx, true, 15*time.Second)
	if err != nil {
		return nil, fmt.Errorf("node A: %w\n%s", err, agentProc.LogTail(20))
	}
	r.AgentTaintAt = ch.At
	// Watch until the machine is gone, and a little longer to see pods that end right then.
	if err := sleepUntil(ctx, r.Deadline.Add(2*time.Second)); err != nil {
		return nil, err
	}
	recsA, recsB := obsA.Records(), obsB.Records()
	r.Sides[0] = outcomes(sideReprieve, pods, recsA, r, false)
	r.Sides[1] = outcomes(sidePlatform, pods, recsB, r, true)
	for _, ns := range []string{nsA, nsB} {
		if err := deleteAll(ctx, b.env.Client, ns); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// outcomes scores one side. upstream projects, for pods not yet evicted when watching stopped,
// when kube-controller-manager would evict them (notice + tolerationSeconds).
func outcomes(name string, pods []scenario.Pod, recs map[string]scenario.Record, r *complianceRun, upstream bool) sideResult {
	s := sideResult{Name: name, WorstLate: -24 * time.Hour}
	for _, p := range pods {
		rec := recs[p.Name]
		o := podOutcome{Pod: p, Evicted: rec.DeletedAt, GraceGiven: rec.LastGrace}
		forever := p.Tolerate != nil && *p.Tolerate == scenario.Forever
		switch {
		case !rec.GoneAt.IsZero():
			o.End = rec.GoneAt
		case !rec.DeletionTimestamp.IsZero():
			o.End, o.Projected = rec.DeletionTimestamp, true
		case forever:
			o.NeverEvicted = true
		case upstream:
			due := r.Notice
			if p.Tolerate != nil && *p.Tolerate > 0 {
				due = due.Add(time.Duration(*p.Tolerate) * time.Second)
			}
			o.Evicted, o.End, o.Projected = due, due.Add(time.Duration(p.GraceSeconds())*time.Second), true
			o.GraceGiven = p.GraceSeconds()
		default:
			o.NeverEvicted = true
		}
		s.Pods = append(s.Pods, o)
		if forever {
			s.Forever++
			continue
		}
		s.Evictable++
		if o.NeverEvicted {
			s.Never++
			continue
		}
		if late := o.End.Sub(r.Deadline); late > s.WorstLate {
			s.WorstLate = late
		}
		if !o.Projected && !o.End.After(r.Deadline) {
			s.Gone++
			if o.GraceGiven == p.GraceSeconds() {
				s.FullGrace++
			}
		}
	}
	sort.SliceStable(s.Pods, func(i, j int) bool {
		a, b := s.Pods[i], s.Pods[j]
		if a.NeverEvicted != b.NeverEvicted {
			return !a.NeverEvicted
		}
		return a.Evicted.Before(b.Evicted)
	})
	return s
}
