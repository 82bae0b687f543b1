package pressure

import (
	"math"
	"slices"
	"time"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// Trend keeps each signal's recent readings and tells how fast it falls (Estimate), as issue 47
// asks: a fall that persists, not jitter, a step or a sawtooth.
//
//   - The slope is a least-squares fit over the window (the short-term trend), with the reading
//     noise measured (Estimate.Noise): a slope within the noise is no fall, and the fit over
//     the last minSamples readings replaces the window's only when it is steeper by more than
//     the noise allows (the fall sped up).
//   - A reading that jumps off the trend by more than the noise (and by more than JumpShare of
//     the capacity) is a step when the next reading goes on at the old pace (a JVM's heap taken,
//     kept): the level moved, the trend did not, and the fit treats the readings before and
//     after as one trend at two levels. Until that next reading the jump is Pending: a step and
//     the start of a fall look alike there. A jump that the next reading undoes is a spike, left
//     out. A jump followed by a new pace is a change of pace: the trend is then fitted to the
//     readings since, so a fall that stopped (a page cache filled, then held) is no fall, and a
//     fall that started is its own pace, not the window's blend.
//   - A rise by such a jump frees (a garbage collector, a job that ended): the lowest reading of
//     the fall before it is the sawtooth's trough, and while the next fall lasts no longer than
//     one and a half times the last ones did it stays a sawtooth (Estimate.Sawtooth, Floor):
//     the node held that level lately, and the kubelet left it alone.
type Trend struct {
	// Window is how far back readings count in the slope.
	Window time.Duration
	// History is how far back readings are kept for the noise and the sawtooth's troughs.
	History time.Duration
	series  map[kubelet.Signal]*series
}

// point is one reading.
type point struct {
	at    time.Time
	value float64
}

// series is one signal's (or one pod's usage's) readings over the history, its capacity, and the
// frees seen.
type series struct {
	capacity int64
	points   []point
	// frees are the rises by a jump, drops the falls by one.
	frees, drops []free
	// sigma caches noise() for the current points (valid when sigmaOK).
	sigma   float64
	sigmaOK bool
}

// free is a rise by a jump: when, the trough of the fall before it, and how long that fall took
// from its peak.
type free struct {
	at     time.Time
	trough float64
	fall   time.Duration
}

// The estimate's constants.
const (
	// minSamples is how many readings a slope needs: two points make a slope out of any jitter.
	minSamples = 3
	// TrendHistory is how long readings are kept for the noise and a sawtooth's troughs.
	TrendHistory = 5 * time.Minute
	// noiseSamples is how many of the latest readings the noise is measured on, noiseMin how
	// many it takes.
	noiseSamples, noiseMin = 120, 6
	// JumpShare is the least jump of a reading off the pace, as a share of the capacity: 0.1%
	// (8 MiB of 8 GiB, 66 MiB of 64 GiB), so that exact readings (no noise measured) still
	// have one. paceShare is the least, as a share of the pace itself: a fall of 100 MiB/s
	// that speeds up by 10 MiB/s is no jump, one that doubles is.
	JumpShare, paceShare = 0.001, 0.5
	// jumpK, slopeK and steepK are how many standard deviations of the noise a jump, a slope and
	// a steepening must exceed: 4 each, a false alarm at about 1 reading in 30 000 for normal
	// noise (3 gave 5 to 10 falls in an hour of ±10 MiB of flat noise, the window's readings
	// being correlated).
	jumpK, slopeK, steepK = 4.0, 4.0, 4.0
	// sawtoothSpan is how long after a free the sawtooth holds, as a multiple of the longest fall
	// before a free.
	sawtoothSpan = 1.5
)

// NewTrend returns an empty trend over window, keeping TrendHistory (or window, if longer).
func NewTrend(window time.Duration) *Trend {
	return &Trend{Window: window, History: max(window, TrendHistory), series: map[kubelet.Signal]*series{}}
}

// Add records a reading of s measured at at, without its capacity (no jump share: steps are
// told from the noise alone); AddLevel is the loop's.
func (t *Trend) Add(at time.Time, s kubelet.Signal, available int64) { t.add(at, s, available, 0) }

// AddLevel records l's reading, measured at l.At. A reading not newer than the last one is the
// same stats served again (the Summary API's cache): it is skipped, or the fit would see a flat
// stretch and then a cliff.
func (t *Trend) AddLevel(l Level) { t.add(l.At, l.Signal, l.Effective(), l.Capacity) }

func (t *Trend) add(at time.Time, s kubelet.Signal, available, capacity int64) {
	ts := t.series[s]
	if ts == nil {
		ts = &series{}
		t.series[s] = ts
	}
	ts.add(at, float64(available), capacity, t.Window, t.History)
}

func (ts *series) add(at time.Time, v float64, capacity int64, window, history time.Duration) {
	ts.addKeeping(at, v, capacity, window, history, history)
}

// addKeeping is add, keeping the readings for history and the turns for turns.
func (ts *series) addKeeping(at time.Time, v float64, capacity int64, window, history, turns time.Duration) {
	if capacity > 0 {
		ts.capacity = capacity
	}
	if n := len(ts.points); n > 0 && !at.After(ts.points[n-1].at) {
		return
	}
	ts.points = append(ts.points, point{at: at, value: v})
	ts.sigmaOK = false
	cut := 0
	for cut < len(ts.points)-1 && at.Sub(ts.points[cut].at) > history {
		cut++
	}
	ts.points = append(ts.points[:0], ts.points[cut:]...)
	for len(ts.frees) > 0 && at.Sub(ts.frees[0].at) > turns {
		ts.frees = ts.frees[1:]
	}
	for len(ts.drops) > 0 && at.Sub(ts.drops[0].at) > turns {
		ts.drops = ts.drops[1:]
	}
	ts.noteFree(window)
}

// noteFree records a free when the last reading rose off the trend by a jump, and a drop when
// it fell by one (a pod's usage freed: its own sawtooth, turned over).
func (ts *series) noteFree(window time.Duration) {
	ts.frees = ts.noteTurn(window, 1, ts.frees)
	ts.drops = ts.noteTurn(window, -1, ts.drops)
}

// noteTurn records in turns a move of the last reading by a jump in direction dir (1 up, -1
// down), with the extreme of the opposite move before it (the trough before a rise, the peak
// before a drop) and how long that move took.
func (ts *series) noteTurn(window time.Duration, dir float64, turns []free) []free {
	ps := ts.points
	n := len(ps)
	if n < minSamples {
		return turns
	}
	w := ts.window(window)
	ref := medianRate(w[:len(w)-1])
	last, prev := ps[n-1], ps[n-2]
	d := last.value - prev.value
	dt := last.at.Sub(prev.at).Seconds()
	if d*dir <= 0 || (d-ref*dt)*dir <= ts.jumpThreshold(ref, dt) {
		return turns
	}
	if k := len(turns); k > 0 && turns[k-1].at.Equal(prev.at) {
		turns[k-1].at = last.at // one turn over several readings
		return turns
	}
	// The move before it: from the farthest reading the other way since the last turn...
	from := 0
	if k := len(turns); k > 0 {
		for from < n-1 && !ps[from].at.After(turns[k-1].at) {
			from++
		}
	}
	start := from
	for i := from; i < n-1; i++ {
		if ps[i].value*dir >= ps[start].value*dir {
			start = i
		}
	}
	// ...to the farthest after it.
	end := start
	for i := start; i < n-1; i++ {
		if ps[i].value*dir <= ps[end].value*dir {
			end = i
		}
	}
	return append(turns, free{at: last.at, trough: ps[end].value, fall: ps[end].at.Sub(ps[start].at)})
}

// ceiling is, for a pod's usage, what its own sawtooth bounds it by: the lowest peak before its
// drops of the history (a collector that freed, a cache dropped, a batch that ended). Below it
// the pod grows within what it held lately; past it, it is no sawtooth's. ok is false without a
// drop.
func (ts *series) ceiling() (peak float64, ok bool) {
	if len(ts.drops) == 0 {
		return 0, false
	}
	peak = math.Inf(1)
	for _, f := range ts.drops {
		peak = min(peak, f.trough)
	}
	return peak, true
}

// window is the readings within window of the last.
func (ts *series) window(window time.Duration) []point {
	n := len(ts.points)
	if n == 0 {
		return nil
	}
	last := ts.points[n-1].at
	i := n - 1
	for i > 0 && last.Sub(ts.points[i-1].at) <= window {
		i--
	}
	return ts.points[i:]
}

// noise is the readings' standard deviation about a straight line, from the median absolute
// second difference of the latest readings (robust to a step, which moves two of them, and to a
// steady trend, which moves none): for independent noise of deviation s a second difference has
// deviation s*sqrt(6).
func (ts *series) noise() float64 {
	if !ts.sigmaOK {
		ts.sigma, ts.sigmaOK = ts.measureNoise(), true
	}
	return ts.sigma
}

func (ts *series) measureNoise() float64 {
	ps := ts.points[max(len(ts.points)-noiseSamples, 0):]
	if len(ps) < noiseMin {
		// Too few readings to measure it: the noise a jump's share of the capacity would be
		// (jumpThreshold), so that the first readings' slope is no fall unless it clears that.
		return JumpShare * float64(ts.capacity) / math.Sqrt(6)
	}
	dd := make([]float64, 0, len(ps)-2)
	for i := 2; i < len(ps); i++ {
		d1 := ps[i-1].value - ps[i-2].value
		d2 := ps[i].value - ps[i-1].value
		dt1, dt2 := ps[i-1].at.Sub(ps[i-2].at).Seconds(), ps[i].at.Sub(ps[i-1].at).Seconds()
		dd = append(dd, math.Abs(d2-d1*dt2/dt1))
	}
	return 1.4826 * median(dd) / math.Sqrt(6)
}

// jumpThreshold is how far a difference over dt seconds must be off a pace of rate per second
// to be a jump: jumpK deviations of a second difference, JumpShare of the capacity, and
// paceShare of what the pace moves in dt.
func (ts *series) jumpThreshold(rate, dt float64) float64 {
	return max(jumpK*math.Sqrt(6)*ts.noise(), JumpShare*float64(ts.capacity), paceShare*math.Abs(rate)*dt)
}

// Estimate is a signal's trend at its last reading.
type Estimate struct {
	// Slope is how fast it changes, in units per second (negative when falling). OK is false
	// with fewer than minSamples readings in the window, or when they all share one instant.
	Slope float64
	OK    bool
	// SE is the slope's standard error for the noise measured; Level is where the fit puts the
	// last reading (the pending one aside), in the signal's unit.
	SE, Level float64
	// Span is how long the readings the slope was fitted on run: the window, or since the
	// change of pace, or the last minSamples readings. WholeWindow says the fit is the
	// window's, with no change of pace in it: the pace may have held longer.
	Span        time.Duration
	WholeWindow bool
	// Falling says the slope is a fall beyond the noise: slopeK standard errors below zero;
	// Rising a rise beyond it.
	Falling, Rising bool
	// Steeper says the slope is that of the latest readings, a significantly steeper fall than
	// the window's before (the fall sped up, or started).
	Steeper bool
	// Pending says the last reading jumped off the trend: a step or the start of a fall, which
	// the next reading tells apart. It is left out of the slope.
	Pending bool
	// Noise is the readings' standard deviation about the trend.
	Noise float64
	// Sawtooth says a free came lately, within sawtoothSpan of the falls before it; Floor is the
	// lowest trough of those falls, and Tolerance how far below it a reading may be and still be
	// the same sawtooth (the noise, half a jump).
	Sawtooth         bool
	Floor, Tolerance float64
}

// SteeperThan reports whether e's fall is steeper than prev's beyond what the noise of both
// allows: the trend steepened from one reading to the next.
func (e Estimate) SteeperThan(prev Estimate) bool {
	if !e.OK || !e.Falling {
		return false
	}
	if !prev.OK {
		return true
	}
	return e.Slope < prev.Slope-steepK*math.Hypot(e.SE, prev.SE)
}

// Estimate returns s's trend at its last reading.
func (t *Trend) Estimate(s kubelet.Signal) Estimate {
	ts := t.series[s]
	if ts == nil {
		return Estimate{}
	}
	return ts.estimate(t.Window)
}

// Slope returns how fast s changes, in units per second, and whether it can tell (Estimate).
func (t *Trend) Slope(s kubelet.Signal) (perSecond float64, ok bool) {
	e := t.Estimate(s)
	return e.Slope, e.OK
}

func (ts *series) estimate(window time.Duration) Estimate {
	w := ts.window(window)
	e := Estimate{Noise: ts.noise()}
	if len(w) < minSamples {
		return e
	}
	n := len(w)
	// brk[i]: the difference from w[i-1] to w[i] is left out (a step, or either side of a
	// spike); change is the last change of pace.
	brk := make([]bool, n)
	change := 0
	ref := medianRate(w)
	off := func(i int, rate float64) float64 {
		return w[i].value - w[i-1].value - rate*w[i].at.Sub(w[i-1].at).Seconds()
	}
	// jumps says whether the move from w[a] to w[b] is off a pace of rate by a jump.
	jumps := func(a, b int, rate float64) bool {
		dt := w[b].at.Sub(w[a].at).Seconds()
		return math.Abs(w[b].value-w[a].value-rate*dt) > ts.jumpThreshold(rate, dt)
	}
	var steps []int // the steps' indexes
	staircase := false
	for i := 1; i < n; i++ {
		if !jumps(i-1, i, ref) {
			continue
		}
		switch {
		case i == n-1:
			e.Pending, brk[i] = true, true
		case !jumps(i, i+1, ref):
			brk[i] = true // a step: the next difference goes on at the old pace
			steps = append(steps, i)
		case !jumps(i-1, i+1, ref):
			brk[i], brk[i+1] = true, true // a spike: the next reading undoes it
			i++
		default:
			change = i // a new pace from w[i-1] on
			ref = (w[i].value - w[i-1].value) / w[i].at.Sub(w[i-1].at).Seconds()
		}
	}
	// Two steps or more the same way, of like size, are a staircase, not a level moved once:
	// memory taken a block at a time is a fall at their pace. A step a quarter the size of the
	// largest or less is another thing (a page cache filled beside a few MiB of noise).
	for _, dir := range []float64{-1, 1} {
		var largest float64
		for _, i := range steps {
			largest = max(largest, off(i, 0)*dir)
		}
		var same []int
		for _, i := range steps {
			if d := off(i, 0) * dir; d > 0 && d > largest/4 {
				same = append(same, i)
			}
		}
		if len(same) >= 2 {
			for _, i := range same {
				brk[i] = false
			}
			staircase = true
		}
	}
	// Since a change of pace, the readings after the interval it happened in: that interval
	// blends the two paces (a fall that ended half-way through it).
	fitFrom := change
	ps, pb := w[fitFrom:], brk[fitFrom:]
	slope, se, ok := fixedEffects(ps, pb, e.Noise)
	if !ok {
		return e
	}
	e.Slope, e.SE, e.OK = slope, se, true
	if change > 0 {
		// The pace since the change, against the window's before it.
		if before, seB, okB := fixedEffects(w[:change], brk[:change], e.Noise); okB && slope < before-steepK*math.Hypot(se, seB) {
			e.Steeper = true
		}
	}
	end := len(ps) - b2i(e.Pending)
	e.Level = levelAt(ps[:end], pb[:end], slope)
	e.Span, e.WholeWindow = ps[end-1].at.Sub(ps[0].at), change == 0
	if staircase {
		// Its pace is its steps' over the window: a part of it is a step or a stretch between two.
	} else if h, ok := bestHinge(ps[:end], pb[:end], e.Noise); ok {
		// A change of pace by less than a jump, minSamples readings or more ago (a fall that
		// began, sped up or stopped gradually): the pace since. Or a step within the noise:
		// the pace kept, at the new level.
		e.Slope, e.SE, se = h.post, h.se, h.se
		e.Steeper = e.Steeper || !h.step && h.post < h.pre-steepK*h.se
		e.Level = levelAt(ps[h.from:end], pb[h.from:end], h.post)
		e.Span, e.WholeWindow = ps[end-1].at.Sub(ps[h.from].at), false
	} else if end >= minSamples && !slices.Contains(pb[end-minSamples+1:end], true) {
		// The last minSamples readings, unbroken: a fall that sped up within two readings,
		// by less than a jump.
		short := ps[end-minSamples : end]
		if s, seS, okS := fixedEffects(short, make([]bool, len(short)), e.Noise); okS && s < e.Slope-steepK*math.Hypot(se, seS) {
			e.Slope, e.SE, se, e.Steeper = s, seS, seS, true
			e.Level = levelAt(short, make([]bool, len(short)), s)
			e.Span, e.WholeWindow = short[len(short)-1].at.Sub(short[0].at), false
		}
	}
	e.Falling = e.Slope < 0 && e.Slope < -slopeK*se
	e.Rising = e.Slope > 0 && e.Slope > slopeK*se
	ts.sawtooth(&e, ts.jumpThreshold(0, 0))
	return e
}

// sawtooth fills in e's sawtooth: the lowest trough of the frees of the history, while the
// fall since the last free has lasted no longer than sawtoothSpan times the longest fall before
// one.
func (ts *series) sawtooth(e *Estimate, jump float64) {
	k := len(ts.frees)
	if k == 0 || len(ts.points) == 0 {
		return
	}
	var longest time.Duration
	floor := math.Inf(1)
	for _, f := range ts.frees {
		longest = max(longest, f.fall)
		floor = min(floor, f.trough)
	}
	last := ts.points[len(ts.points)-1].at
	if last.Sub(ts.frees[k-1].at) > time.Duration(sawtoothSpan*float64(longest)) {
		return
	}
	e.Sawtooth, e.Floor, e.Tolerance = true, floor, max(slopeK*e.Noise, jump/2)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// fixedEffects is the least-squares slope, per second, of ps taken as segments split where brk
// is set, each segment at its own level with one slope for all, and its standard error for
// readings of deviation noise. ok is false when no segment has two readings at distinct
// instants.
func fixedEffects(ps []point, brk []bool, noise float64) (slope, se float64, ok bool) {
	if len(ps) == 0 {
		return 0, 0, false
	}
	t0 := ps[0].at
	var sxy, sxx float64
	start := 0
	flush := func(end int) {
		seg := ps[start:end]
		if len(seg) < 2 {
			return
		}
		var mx, my float64
		for _, p := range seg {
			mx += p.at.Sub(t0).Seconds()
			my += p.value
		}
		mx /= float64(len(seg))
		my /= float64(len(seg))
		for _, p := range seg {
			x := p.at.Sub(t0).Seconds() - mx
			sxx += x * x
			sxy += x * (p.value - my)
		}
	}
	for i := 1; i < len(ps); i++ {
		if brk[i] {
			flush(i)
			start = i
		}
	}
	flush(len(ps))
	if sxx == 0 {
		return 0, 0, false
	}
	return sxy / sxx, noise / math.Sqrt(sxx), true
}

// hinge is a fit of two paces joined at a reading (from, in the readings fitted): pre before
// it, post after, and post's standard error.
type hinge struct {
	pre, post, se float64
	from          int
	// step says the readings fit better as one pace with the level moved at from (a step
	// within the noise) than as two paces: post is that one pace.
	step bool
}

// levelAt is where the fit of slope through ps (segments split at brk, each at its own level)
// puts the last reading: the last segment's mean carried to its last instant. Less noisy than
// the reading itself, by the square root of the segment's length.
func levelAt(ps []point, brk []bool, slope float64) float64 {
	n := len(ps)
	if n == 0 {
		return 0
	}
	start := n - 1
	for start > 0 && !brk[start] {
		start--
	}
	var mx, my float64
	for _, p := range ps[start:] {
		mx += p.at.Sub(ps[n-1].at).Seconds()
		my += p.value
	}
	k := float64(n - start)
	return my/k - slope*mx/k
}

// hingeK is how many deviations of the noise a hinge must improve the fit by (its sum of squares
// by hingeK² noise²) to be taken over one straight line: 5, as the best of up to 17 joints of a
// 20 s window is tried.
const hingeK = 5.0

// bestHinge fits ps (segments split at brk, each at its own level) as two paces joined at one of
// its readings, with at least minSamples readings from the joint on, and returns the best joint
// when it fits better than one pace by more than the noise explains. Without noise (exact
// readings) any improvement counts.
func bestHinge(ps []point, brk []bool, noise float64) (hinge, bool) {
	n := len(ps)
	if n < minSamples+2 {
		return hinge{}, false
	}
	line, _, ok := fixedEffects(ps, brk, noise)
	if !ok {
		return hinge{}, false
	}
	// Each reading's time, value and segment; the segments' sizes.
	x, y, seg := make([]float64, n), make([]float64, n), make([]int, n)
	for i := range n {
		x[i], y[i] = ps[i].at.Sub(ps[0].at).Seconds(), ps[i].value-ps[0].value // from the first: the sums keep their precision
		if i > 0 {
			seg[i] = seg[i-1]
			if brk[i] {
				seg[i]++
			}
		}
	}
	m := seg[n-1] + 1
	cnt, sum := make([]float64, m), make([]float64, m)
	demean := func(v, out []float64) {
		clear(sum)
		clear(cnt)
		for i := range n {
			sum[seg[i]] += v[i]
			cnt[seg[i]]++
		}
		for i := range n {
			out[i] = v[i] - sum[seg[i]]/cnt[seg[i]]
		}
	}
	xs, ys, h, hs := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	demean(x, xs)
	demean(y, ys)
	var sseLine, sxx, sxy float64
	for i := range n {
		r := ys[i] - line*xs[i]
		sseLine += r * r
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	best, bestSSE := hinge{}, math.Inf(1)
	for k := 1; k <= n-minSamples; k++ {
		for i := range n {
			h[i] = max(0, x[i]-x[k])
		}
		demean(h, hs)
		var sxh, shh, shy float64
		for i := range n {
			sxh += xs[i] * hs[i]
			shh += hs[i] * hs[i]
			shy += hs[i] * ys[i]
		}
		det := sxx*shh - sxh*sxh
		if det <= 1e-9*sxx*shh {
			continue
		}
		b1 := (shh*sxy - sxh*shy) / det
		d := (sxx*shy - sxh*sxy) / det
		// The residual sum of squares of the two-pace fit, from the normal equations.
		sse := 0.0
		for i := range n {
			r := ys[i] - b1*xs[i] - d*hs[i]
			sse += r * r
		}
		if sse < bestSSE {
			// var(b1 + d) = noise² (M⁻¹₁₁ + 2 M⁻¹₁₂ + M⁻¹₂₂) for M the normal matrix.
			v := (shh - 2*sxh + sxx) / det
			best, bestSSE = hinge{pre: b1, post: b1 + d, se: noise * math.Sqrt(max(v, 0)), from: k}, sse
		}
	}
	// A step, a level moved at a reading with the pace kept, is the other way a pace can seem to
	// bend: one below a jump (within the noise) fits as a short steep fall as well. Whichever
	// fits better is taken. Each segment's centered sums come from prefix sums, so that every
	// split is tried at the cost of one.
	var cx, cy, cxx, cxy, cyy []float64 = make([]float64, n+1), make([]float64, n+1), make([]float64, n+1), make([]float64, n+1), make([]float64, n+1)
	for i := range n {
		cx[i+1], cy[i+1] = cx[i]+x[i], cy[i]+y[i]
		cxx[i+1], cxy[i+1], cyy[i+1] = cxx[i]+x[i]*x[i], cxy[i]+x[i]*y[i], cyy[i]+y[i]*y[i]
	}
	// centered returns the centered sums of squares and products of readings [a, b).
	centered := func(a, b int) (sxx, sxy, syy float64) {
		k := float64(b - a)
		sx, sy := cx[b]-cx[a], cy[b]-cy[a]
		return cxx[b] - cxx[a] - sx*sx/k, cxy[b] - cxy[a] - sx*sy/k, cyy[b] - cyy[a] - sy*sy/k
	}
	var txx, txy, tyy float64
	starts := []int{0}
	for i := 1; i < n; i++ {
		if brk[i] {
			starts = append(starts, i)
		}
	}
	starts = append(starts, n)
	for j := 0; j+1 < len(starts); j++ {
		a, b, c := centered(starts[j], starts[j+1])
		txx, txy, tyy = txx+a, txy+b, tyy+c
	}
	for j := 0; j+1 < len(starts); j++ {
		a, b := starts[j], starts[j+1]
		sxx0, sxy0, syy0 := centered(a, b)
		for k := a + 1; k < b; k++ {
			l1, l2, l3 := centered(a, k)
			r1, r2, r3 := centered(k, b)
			sxx2, sxy2, syy2 := txx-sxx0+l1+r1, txy-sxy0+l2+r2, tyy-syy0+l3+r3
			if sxx2 <= 0 {
				continue
			}
			slope := sxy2 / sxx2
			if sse := syy2 - sxy2*slope; sse < bestSSE {
				best, bestSSE = hinge{pre: slope, post: slope, se: noise / math.Sqrt(sxx2), from: k, step: true}, sse
			}
		}
	}
	if math.IsInf(bestSSE, 1) || sseLine-bestSSE <= hingeK*hingeK*noise*noise || sseLine-bestSSE <= 1e-9*(1+sseLine) {
		return hinge{}, false
	}
	return best, true
}

// medianRate is the median of the rates between consecutive readings of ps, per second.
func medianRate(ps []point) float64 {
	if len(ps) < 2 {
		return 0
	}
	rs := make([]float64, 0, len(ps)-1)
	for i := 1; i < len(ps); i++ {
		if dt := ps[i].at.Sub(ps[i-1].at).Seconds(); dt > 0 {
			rs = append(rs, (ps[i].value-ps[i-1].value)/dt)
		}
	}
	return median(rs)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}
