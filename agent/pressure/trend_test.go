package pressure

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/kubelet"
)

// feed adds one reading a second of avail(i) MiB on a node of capacityMi, with noise drawn
// uniformly within ±jitterMi, and calls check after each with the reading's index and estimate.
func feed(t *testing.T, capacityMi int64, n int, jitterMi int64, avail func(i int) float64, check func(i int, e Estimate)) {
	t.Helper()
	rng := rand.New(rand.NewPCG(47, 1))
	tr := NewTrend(20 * time.Second)
	for i := range n {
		v := avail(i) * mi
		if jitterMi > 0 {
			v += float64(rng.Int64N(2*jitterMi*mi+1) - jitterMi*mi)
		}
		tr.AddLevel(Level{Signal: kubelet.MemoryAvailable, Available: int64(v), Capacity: capacityMi * mi, At: t0.Add(time.Duration(i) * time.Second)})
		check(i, tr.Estimate(kubelet.MemoryAvailable))
	}
}

// Issue 47, point 1: a flat signal with ±10 MiB of reading noise is no fall, reading after
// reading for an hour, and no reading of it is a jump.
func TestTrendJitterIsNoFall(t *testing.T) {
	falls := 0
	feed(t, 64<<10, 3600, 10, func(int) float64 { return 2560 }, func(i int, e Estimate) {
		if e.Falling {
			falls++
		}
		if e.Pending {
			t.Fatalf("reading %d: pending on noise alone (%+v)", i, e)
		}
	})
	// slopeK = 3: about 1 reading in 700 for independent noise; none here.
	if falls > 0 {
		t.Fatalf("%d readings of an hour of flat noise read as a fall", falls)
	}
}

// Point 2: a step kept is no fall. 800 MiB taken within a reading at 60 s: that reading is
// pending (it cannot tell a step from the start of a fall), and from the next one on the trend is
// flat again, although the window holds the step for 20 s.
func TestTrendStepIsNoFall(t *testing.T) {
	feed(t, 64<<10, 120, 10, func(i int) float64 {
		if i >= 60 {
			return 1843
		}
		return 2643
	}, func(i int, e Estimate) {
		switch {
		case i == 60 && !e.Pending:
			t.Fatalf("the step's reading not pending: %+v", e)
		case i > 60 && (e.Pending || e.Falling):
			t.Fatalf("reading %d, %d s after the step: %+v, want no fall", i, i-60, e)
		}
	})
}

// A leak that starts after a step: the step is no part of the fall's pace. cache takes 800 MiB
// at 30 s, leaks 30 MiB/s from 45 s: from a few readings into the leak the slope is its 30 MiB/s,
// not inflated by the step.
func TestTrendLeakAfterAStep(t *testing.T) {
	feed(t, 64<<10, 80, 10, func(i int) float64 {
		v := 5120.0
		if i >= 30 {
			v -= 800
		}
		if i >= 45 {
			v -= 30 * float64(i-45)
		}
		return v
	}, func(i int, e Estimate) {
		if i > 30 && i < 45 && e.Falling {
			t.Fatalf("reading %d, after the step and before the leak: %+v", i, e)
		}
		if i >= 52 && (!e.Falling || math.Abs(e.Slope/mi+30) > 6) {
			t.Fatalf("reading %d, %d s into the leak: slope %.1f MiB/s (falling %v), want about -30", i, i-45, e.Slope/mi, e.Falling)
		}
	})
}

// A fall that stopped is no fall: page cache filled at 400 MiB/s for 5 s, then held. Two
// readings after it stopped the trend is flat, although the window's fit would still fall.
func TestTrendFallThatStopped(t *testing.T) {
	feed(t, 64<<10, 90, 10, func(i int) float64 {
		switch {
		case i < 30:
			return 4608
		case i < 35:
			return 4608 - 400*float64(i-29)
		}
		return 4608 - 2048
	}, func(i int, e Estimate) {
		if i >= 31 && i <= 34 && !e.Falling {
			t.Fatalf("reading %d, within the fall: %+v, want a fall", i, e)
		}
		if i >= 37 && e.Falling {
			t.Fatalf("reading %d, %d s after the fall stopped: %+v, want no fall", i, i-34, e)
		}
	})
}

// The onset of a fall below a jump (50 MiB/s on 64 GiB, ±10 MiB): from the fourth reading of
// it the slope is the fall's, within a few MiB/s, not the window's blend of flat and fall, and
// it stays there reading after reading (what made Pace's jump count swings of the estimate).
func TestTrendOnsetIsItsOwnPace(t *testing.T) {
	feed(t, 64<<10, 60, 10, func(i int) float64 {
		if i < 30 {
			return 2560
		}
		return 2560 - 50*float64(i-30)
	}, func(i int, e Estimate) {
		if i >= 34 && (!e.Falling || math.Abs(e.Slope/mi+50) > 5) {
			t.Fatalf("reading %d, %d s into the fall: slope %.1f MiB/s, want about -50", i, i-30, e.Slope/mi)
		}
	})
}

// Memory taken a block at a time is a fall at the blocks' pace: 250 MiB every 5 s on 16 GiB is
// 50 MiB/s, not a level moved once.
func TestTrendStaircaseIsAFall(t *testing.T) {
	feed(t, 16<<10, 60, 0, func(i int) float64 { return 4000 - 250*float64(i/5) }, func(i int, e Estimate) {
		if i >= 25 && (!e.Falling || math.Abs(e.Slope/mi+50) > 15) {
			t.Fatalf("reading %d: slope %.1f MiB/s (falling %v), want about -50", i, e.Slope/mi, e.Falling)
		}
	})
}

// Point 3: a sawtooth that frees is no fall. web's heap grows 50 MiB/s for 20 s, then its
// collector frees it: from the first free on, a fall above the trough (the lowest reading before
// the free) is the sawtooth's, Sawtooth and Floor say so; a fall that lasts longer than one and a
// half of the last ones, or goes below the trough, is not.
func TestTrendSawtooth(t *testing.T) {
	const top, trough = 2560.0, 1560.0
	saw := func(i int) float64 { return top - 50*float64(i%21) }
	feed(t, 64<<10, 200, 10, func(i int) float64 {
		if i < 147 {
			return saw(i)
		}
		return saw(146) - 50*float64(i-146) // from 147 on the collector frees nothing
	}, func(i int, e Estimate) {
		switch {
		case i < 21 && e.Sawtooth:
			t.Fatalf("reading %d, before any free: sawtooth %+v", i, e)
		case i >= 21 && i < 147:
			if !e.Sawtooth || math.Abs(e.Floor/mi-trough) > 25 {
				t.Fatalf("reading %d: sawtooth %v with floor %.0f MiB, want the trough %.0f", i, e.Sawtooth, e.Floor/mi, trough)
			}
		case i > 147+30+2 && e.Sawtooth:
			t.Fatalf("reading %d, a fall of %d s against 20 s falls: still a sawtooth", i, i-147)
		}
	})
}
