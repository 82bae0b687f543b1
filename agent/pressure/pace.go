package pressure

import (
	"time"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// Pace keeps, per signal, how the readings and the estimate of the time to the hard threshold
// went lately: the longest gap between two readings over a window, and the largest fall of the
// estimate beyond the time that went by between them (the trend steepening, or a reading below
// the line) over the last minSamples readings, as a share of where the estimate should have
// been. They are what can go by before the next reading, which Decide counts ahead.
//
// The jumps of the last readings only, those the trend's short fit is made of: over the whole
// window the onset of a fall (the estimate coming down from hours to seconds as the trend forms)
// would count as a jump of nearly all of it for the whole window. Among the last readings it
// still does, and would make every pod due at once: the lead counts half the estimate at most
// (Input.Lead, MaxJumpShare). The gaps over the whole window: a machine busy enough to read late
// once will again; the lead counts them up to what the loop lets a reading take (MaxGap), a
// longer one is a stall.
//
// The share, not the seconds: a slope off by some share puts the estimate off by that share of
// it, so a jump of 5 s 27 s from the hard threshold is one of under 2 s 10 s from it, where the
// pod is due. Counted in seconds, a jump seen far away would make a pod due seconds early.
type Pace struct {
	// Window is how far back steps count (the trend's window).
	Window time.Duration
	last   map[kubelet.Signal]estimate
	steps  map[kubelet.Signal][]step
}

type estimate struct {
	at  time.Time
	ttl time.Duration
}

// step is one reading after the one before: the time between them, and how much further the
// estimate fell than that, as a share of the estimate before less that time (negative when it
// fell less, or rose; zero when either was Never or the one before was already due now).
type step struct {
	at   time.Time
	gap  time.Duration
	jump float64
}

// NewPace returns an empty pace over window.
func NewPace(window time.Duration) *Pace {
	return &Pace{Window: window, last: map[kubelet.Signal]estimate{}, steps: map[kubelet.Signal][]step{}}
}

// Add records that s was read at now (the loop's clock, not the source's measurement: a cached
// reading is one more reading, its estimate aged by the time) and that its time to the hard
// threshold was then ttl. steeper says the trend's slope at this reading is a significantly
// steeper fall than at the last one (Estimate.SteeperThan): only then does the estimate's fall beyond the
// time count as a jump. Otherwise it is the noise of the estimate (issue 47: with ±10 MiB of
// reading noise on a flat signal, every swing of the fit counted as a jump of half the estimate,
// and a 120 s pod 1.5 GiB above the threshold of a 64 GiB node went at the 13th reading). It
// forgets steps older than the window, never the newest.
func (p *Pace) Add(now time.Time, s kubelet.Signal, ttl time.Duration, steeper bool) {
	prev, ok := p.last[s]
	p.last[s] = estimate{at: now, ttl: ttl}
	if !ok || !now.After(prev.at) {
		return
	}
	st := step{at: now, gap: now.Sub(prev.at)}
	if want := prev.ttl - st.gap; steeper && prev.ttl != Never && ttl != Never && want > 0 {
		st.jump = float64(want-ttl) / float64(want)
	}
	ss := append(p.steps[s], st)
	cut := 0
	for cut < len(ss)-1 && now.Sub(ss[cut].at) > p.Window {
		cut++
	}
	p.steps[s] = append(ss[:0], ss[cut:]...)
}

// Of returns the longest gap between two readings of s over the window, and the jump to expect
// of an estimate of ttl at the next one: the largest share it jumped by over the last
// minSamples readings (never below zero), of ttl. Zero for both before two readings; no jump
// for Never.
func (p *Pace) Of(s kubelet.Signal, ttl time.Duration) (gap, jump time.Duration) {
	ss := p.steps[s]
	var share float64
	for i, st := range ss {
		gap = max(gap, st.gap)
		if i >= len(ss)-minSamples {
			share = max(share, st.jump)
		}
	}
	if ttl == Never {
		return gap, 0
	}
	return gap, time.Duration(share * float64(ttl))
}
