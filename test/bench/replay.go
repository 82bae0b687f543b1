package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/reprieve-dev/reprieve/agent/pressure/replay"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// replayVariant is one way of running the pressure loop over the corpus.
type replayVariant struct {
	Name, What string
	Options    replay.Options
	Results    []*replay.Result
	Totals     replay.Totals
	Took       time.Duration
}

// replayReport is the pressure replay's measurement (issue 47): every series of the corpus
// through the real pressure loop, as the chart runs it and as the two choices it makes would
// otherwise go.
type replayReport struct {
	Variants []*replayVariant
	Skipped  int
}

// replayPressure runs the corpus (agent/pressure/replay: the real node's recorded series and
// the synthetic ones) through the pressure loop: as the chart runs it, then with the
// timeliness-first rule for grace cuts, then without the image filesystem's figures (the host
// source's view of a disk). Series longer than o.ReplayMax are skipped (the smoke test's).
func (b *bench) replayPressure(ctx context.Context, rep *report) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	corpus, err := replay.Corpus(filepath.Join(root, replay.TestdataDir))
	if err != nil {
		return err
	}
	var series []*replay.Series
	skipped := 0
	for _, s := range corpus {
		if b.o.ReplayMax > 0 && s.Duration() > b.o.ReplayMax {
			skipped++
			continue
		}
		series = append(series, s)
	}
	def := replay.DefaultOptions()
	early, anyFall, host := def, def, def
	early.CutEarly = true
	anyFall.AnyFall = true
	host.NoReclaimable = true
	r := &replayReport{Skipped: skipped, Variants: []*replayVariant{
		{Name: "reprieve", What: "as the chart runs it: precision first, a grace cut waits for the last reading that leaves 3 s, a fall must have held a quarter of its horizon", Options: def},
		{Name: "cut early", What: "the timeliness-first rule for grace cuts: a pod whose grace no longer fits goes as soon as it is due, with what fits", Options: early},
		{Name: "any fall", What: "without the persistence rule: a fall counts however new", Options: anyFall},
		{Name: "no image figures", What: "the host source's view of a disk: no imageFs.usedBytes, nothing counted as reclaimable", Options: host},
	}}
	for _, v := range r.Variants {
		begin := time.Now()
		for _, s := range series {
			if err := ctx.Err(); err != nil {
				return err
			}
			res, err := replay.Run(ctx, s, v.Options)
			if err != nil {
				return err
			}
			v.Results = append(v.Results, res)
		}
		v.Took = time.Since(begin)
		v.Totals = replay.Total(v.Results)
		b.o.Logf("replay, %s: %d series in %s: %d evictions the kubelet would not make, %d of the kubelet's %d made first with the whole grace",
			v.Name, len(v.Results), v.Took.Round(time.Millisecond), v.Totals.Unwanted, v.Totals.Whole, v.Totals.Kubelet)
	}
	rep.Replay = r
	return nil
}

func (r *report) replayMD(p printer) {
	if r.Replay == nil || len(r.Replay.Variants) == 0 {
		return
	}
	p("\n### 7. Pressure: the kubelet's evictions, and no others (the replay)\n\n")
	p("Every series of the corpus (`agent/pressure/replay`) through the real pressure loop (its trend, its\n" +
		"decision, the executor, the node writer) on a fake clock: the series recorded on the real node of\n" +
		"`test/realnode` (the kubelet v1.37.2, containerd, real containers), each run once without reprieve so\n" +
		"that its label is what the kubelet itself did, and synthetic ones for what that node cannot make\n" +
		"cheaply (a 64 GiB node, hours of noise, a disk that images fill). A pod reprieve evicts frees what it\n" +
		"used once it has ended. *Healthy*: the kubelet evicted nobody. *Made first, whole grace*: reprieve\n" +
		"evicted the pod the kubelet evicted, with the grace the kubelet's rule gives it (its own at a hard\n" +
		"threshold, `min(evictionMaxPodGracePeriod, its own)` at a soft one), ending before the kubelet's\n" +
		"eviction. *Ahead of the kubelet*: how long before the kubelet's eviction reprieve evicted the pod.\n" +
		"*Tainted*: how long reprieve's pressure taint was on the node (the healthy series sit under\n" +
		"reprieve's threshold by design: the taint is what keeps new pods off, and the kubelet's own condition\n" +
		"comes later). Goal: no eviction the kubelet would not make.\n\n")
	if r.Replay.Skipped > 0 {
		p("%d series longer than this run's -replay-max were left out.\n\n", r.Replay.Skipped)
	}
	p("| variant | series | evictions the kubelet would not make | on healthy series | the kubelet's evictions made first, whole grace | grace cut (seconds) | missed | ahead of the kubelet | tainted on healthy series | took |\n")
	p("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, v := range r.Replay.Variants {
		t := v.Totals
		p("| %s: %s | %d (%d healthy) | %d | %d | %d of %d | %d (%.0f s) | %d | %s | %s | %s |\n", v.Name, v.What, t.Series, t.Healthy,
			t.Unwanted, t.HealthyUnwanted, t.Whole, t.Kubelet, t.Cut, t.CutBy.Seconds(), t.Missed, t.LeadRange(), fmtMin(t.HealthyTainted), v.Took.Round(time.Millisecond))
	}
	p("\nPer series, as the chart runs it:\n\n%s\n", replay.Header)
	for _, res := range r.Replay.Variants[0].Results {
		p("%s\n", res.Row())
	}
	p("%s\n", r.Replay.Variants[0].Totals.Row())
	for _, v := range r.Replay.Variants[1:] {
		var diff []string
		for i, res := range v.Results {
			if base := r.Replay.Variants[0].Results[i]; res.Row() != base.Row() {
				diff = append(diff, res.Row())
			}
		}
		p("\n%s, the series that go otherwise:\n\n", v.Name)
		if len(diff) == 0 {
			p("none.\n")
			continue
		}
		p("%s\n", replay.Header)
		for _, row := range diff {
			p("%s\n", row)
		}
	}
	p("\n")
}

// fmtMin writes d in minutes and seconds.
func fmtMin(d time.Duration) string {
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}
