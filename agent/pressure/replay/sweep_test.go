package replay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestReplaySweep replays families of synthetic series over a grid of node sizes, distances to
// the kubelet's threshold, reading noise and paces (2520 series, about a minute and a half), and
// prints, per family, how many evictions the kubelet would not make and how the kubelet's
// evictions went; docs/benchmarks.md has the figures. A sawtooth's evictions are split into its
// first cycle, which cannot be told from a fall (docs/pressure.md, Limits), and the later ones.
// It asserts nothing: REPRIEVE_REPLAY_SWEEP=1 runs it as the chart runs reprieve;
// REPRIEVE_REPLAY_SWEEP=cut-early, any-fall or no-image-figures with that choice of
// replay.Options.
func TestReplaySweep(t *testing.T) {
	o := DefaultOptions()
	switch v := os.Getenv("REPRIEVE_REPLAY_SWEEP"); v {
	case "1":
	case "cut-early":
		o.CutEarly = true
	case "any-fall":
		o.AnyFall = true
	case "no-image-figures":
		o.NoReclaimable = true
	default:
		t.Skip("set REPRIEVE_REPLAY_SWEEP=1 for the sweep (about a minute and a half), or to a variant")
	}
	type tally struct{ series, unwanted, kubelet, whole, cut, missed int }
	families := map[string]*tally{}
	order := []string{"jitter", "step", "sawtooth, first cycle", "sawtooth, later cycles", "leak"}
	for _, f := range order {
		families[f] = &tally{}
	}
	run := func(s *Series) *Result {
		ev, err := KubeletEvictions(s)
		if err != nil {
			t.Fatal(err)
		}
		s.KubeletEvictions, s.Origin = ev, "sweep"
		r, err := Run(context.Background(), s, o)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	add := func(f string, r *Result) {
		tl := families[f]
		tl.series++
		tl.unwanted += r.Unwanted
		tl.kubelet += r.Kubelet
		tl.whole += r.Whole
		tl.cut += r.Cut
		tl.missed += r.Missed
		if r.Unwanted > 0 || r.Missed > 0 {
			t.Log(r.Row())
		}
	}
	firstAt := regexp.MustCompile(`/ \S+ at (\d+) s`)
	seed := uint64(100)
	hard := "evictionHard:\n  memory.available: 1Gi\n"
	for _, capGi := range []int64{8, 16, 64} {
		pods, use := issuePods()
		if capGi == 8 {
			use = map[string]int64{"batch": 2 * gib, "web": gib, "cache": gib}
		}
		for _, above := range []int64{300, 500, 800, 1500} {
			for _, jit := range []int64{0, 5, 10, 20, 40} {
				seed++
				add("jitter", run(memorySeries{name: fmt.Sprintf("jitter-%dg-%d-%d", capGi, above, jit), kubelet: hard, capacity: capGi * gib,
					start: gib + above*mib, length: 20 * time.Minute, jitter: jit * mib, pods: pods,
					usage: func(time.Duration) map[string]int64 { return use }, seed: seed}.build()))
				for _, step := range []int64{100, 300, 800} {
					seed++
					add("step", run(memorySeries{name: fmt.Sprintf("step-%dg-%d-%d-%d", capGi, above, jit, step), kubelet: hard, capacity: capGi * gib,
						start: gib + (above+step)*mib, length: 5 * time.Minute, jitter: jit * mib, pods: pods,
						usage: func(t time.Duration) map[string]int64 {
							u := copyUsage(use)
							if t >= time.Minute {
								u["web"] += step * mib
							}
							return u
						}, seed: seed}.build()))
				}
				for _, rate := range []int64{20, 50, 100, 200} {
					for _, dur := range []int64{5, 10, 20, 40} {
						seed++
						r := run(memorySeries{name: fmt.Sprintf("saw-%dg-%d-%d-%d-%d", capGi, above, jit, rate, dur), kubelet: hard, capacity: capGi * gib,
							start: gib + (above+rate*dur)*mib, length: 10 * time.Minute, jitter: jit * mib, pods: pods,
							usage: func(t time.Duration) map[string]int64 {
								u := copyUsage(use)
								if t >= 30*time.Second {
									into := int64((t-30*time.Second)/time.Second) % (dur + 1)
									u["web"] += min(into, dur) * rate * mib
								}
								return u
							}, seed: seed}.build())
						f := "sawtooth, later cycles"
						if m := firstAt.FindStringSubmatch(r.Row()); m != nil {
							if at, _ := strconv.Atoi(m[1]); int64(at) <= 30+dur+2 {
								f = "sawtooth, first cycle"
							}
						}
						add(f, r)
					}
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(9, 9))
	for _, capGi := range []int64{8, 16, 64} {
		for _, rate := range []int64{5, 10, 20, 50, 100, 200} {
			for _, jit := range []int64{0, 10, 30} {
				for _, grace := range []int64{3, 10, 30} {
					start := 7 * gib
					if capGi == 8 {
						start = 5 * gib
					}
					add("leak", run(memorySeries{name: fmt.Sprintf("leak-%dg-%d-%d-%d", capGi, rate, jit, grace), kubelet: hard, capacity: capGi * gib,
						start: start, length: time.Duration((start-gib)/(rate*mib))*time.Second + time.Minute, jitter: jit * mib,
						pods: []Pod{{Name: "leaker", Grace: grace}, {Name: "steady", Grace: 30, Priority: 1000}},
						usage: func(t time.Duration) map[string]int64 {
							l := 500 * mib
							if t >= 20*time.Second {
								l += int64((t-20*time.Second)/time.Second) * rate * mib
							}
							return map[string]int64{"leaker": l, "steady": gib}
						}, seed: rng.Uint64()}.build()))
				}
			}
		}
	}
	fmt.Printf("| family | series | evictions the kubelet would not make | the kubelet's evictions | made first, whole grace | made first, grace cut | missed |\n|---|---|---|---|---|---|---|\n")
	for _, f := range order {
		tl := families[f]
		fmt.Printf("| %s | %d | %d | %d | %d | %d | %d |\n", f, tl.series, tl.unwanted, tl.kubelet, tl.whole, tl.cut, tl.missed)
	}
}
